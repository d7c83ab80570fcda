#!/usr/bin/env python3
"""responsive.py — `tally lsp` answers while it compiles, and publishes only the newest version.

Usage: responsive.py TALLY [--timing]

A document of 1,000 repeated layers (its compile takes a good part of a second here) is
opened together with a hover request, written to the server in one piece: the hover must be
answered before the compile's diagnostics are published (requests never wait on a compile).
Then two changes (version 2 with an error, version 3 without) and a hover arrive together:
the hover is answered at once from version 1's compile, version 2 is never compiled or
published (a newer version supersedes it), and version 3's diagnostics are the next message.
Prints every message as session.py does; --timing also prints how long the hovers took
(not checked: a timed test would fail on a loaded machine; docs/lsp.md gives the numbers).
"""
import json
import subprocess
import sys
import threading
import time

LAYERS = 1000
DOC = """block Layer(d) {
  param weight: [d, d]
  forward(x) { return relu(x @ weight) }
}
model Net(d = 64, n = %d) {
  layers = repeat(n) Layer(d)
  forward(x: f32[batch, d]) { return mean(layers(x)) }
}
train t { model = Net() batch = 8 target = H100_SXM }
""" % LAYERS
BROKEN = DOC.replace("x @ weight", "x @ wieght")
FIXED = DOC.replace("relu(", "gelu(")
URI = "file:///tmp/lsp-responsive/net.tally"


def frame(msg):
    body = json.dumps(msg).encode("utf-8")
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class Server:
    def __init__(self, tally):
        self.proc = subprocess.Popen([tally, "lsp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def write(self, *msgs):
        self.proc.stdin.write(b"".join(frame(m) for m in msgs))
        self.proc.stdin.flush()

    def read(self, timeout=60):
        result = {}

        def work():
            length = None
            while True:
                line = self.proc.stdout.readline()
                if not line:
                    return
                line = line.strip()
                if not line:
                    break
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            result["msg"] = json.loads(self.proc.stdout.read(length).decode("utf-8"))

        t = threading.Thread(target=work, daemon=True)
        t.start()
        t.join(timeout)
        if "msg" not in result:
            print("no message from the server within %d s" % timeout)
            self.proc.kill()
            sys.exit(1)
        msg = result["msg"]
        shown = dict(msg)
        if msg.get("method") == "textDocument/publishDiagnostics":
            shown = {"method": msg["method"], "version": msg["params"].get("version"),
                     "diagnostics": [d["code"] for d in msg["params"]["diagnostics"]]}
        print("<< " + json.dumps(shown, sort_keys=True))
        return msg


def hover(id, line, character):
    return {"jsonrpc": "2.0", "id": id, "method": "textDocument/hover",
            "params": {"textDocument": {"uri": URI}, "position": {"line": line, "character": character}}}


def main():
    timing = "--timing" in sys.argv
    s = Server(sys.argv[1])
    s.write({"jsonrpc": "2.0", "id": 1, "method": "initialize",
             "params": {"processId": None, "rootUri": None, "capabilities": {}}})
    s.read()
    start = time.monotonic()
    s.write({"jsonrpc": "2.0", "method": "textDocument/didOpen",
             "params": {"textDocument": {"uri": URI, "languageId": "tally", "version": 1, "text": DOC}}},
            hover(2, 0, 8))
    s.read()
    answered = time.monotonic()
    s.read()
    compiled = time.monotonic()
    if timing:
        print("hover %.1f ms; compile published after %.1f ms" % ((answered - start) * 1e3,
                                                                   (compiled - start) * 1e3))
    start = time.monotonic()
    s.write({"jsonrpc": "2.0", "method": "textDocument/didChange",
             "params": {"textDocument": {"uri": URI, "version": 2}, "contentChanges": [{"text": BROKEN}]}},
            {"jsonrpc": "2.0", "method": "textDocument/didChange",
             "params": {"textDocument": {"uri": URI, "version": 3}, "contentChanges": [{"text": FIXED}]}},
            hover(3, 0, 8))
    s.read()
    if timing:
        print("hover during the changes %.1f ms" % ((time.monotonic() - start) * 1e3))
    s.read()
    s.write({"jsonrpc": "2.0", "id": 4, "method": "shutdown"})
    s.read()
    s.write({"jsonrpc": "2.0", "method": "exit"})
    s.proc.stdin.close()
    print("exit %d" % s.proc.wait(timeout=30))


if __name__ == "__main__":
    main()
