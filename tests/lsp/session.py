#!/usr/bin/env python3
"""session.py — a scripted LSP client for `tally lsp`.

Usage: session.py TALLY

Starts `TALLY lsp`, plays one editing session (initialize; open a document with an error;
hover; fix it with a change; hover on blocks and on a non-block; go to a definition;
completion; an unknown request; shutdown; exit) and prints every message the server sends as one line of JSON with sorted keys, each
after a "<<" marker, then "exit N" with the server's exit code. tests/lit/lsp-session.tally
FileChecks the transcript. Every read has a timeout, so a server that hangs fails the test.
"""
import json
import subprocess
import sys
import threading

# The document: a 'Layer' block repeated 3 times in 'Net'. Line 2 has a comment holding a
# 4-byte character (two UTF-16 units) and a 2-byte one (one unit) before the misspelt 'wieght'.
BROKEN = """block Layer(d) {
  param weight: [d, d]
  forward(x) { /*\U0001d70b\u00b7*/ return x @ wieght }
}
model Net(d = 64, n = 3) {
  layers = repeat(n) Layer(d)
  forward(x: f32[batch, d]) { return mean(layers(x)) }
}
train t { model = Net() batch = 8 target = H100_SXM }
"""
FIXED = BROKEN.replace("wieght", "weight")
URI = "file:///tmp/lsp%20test/net.tally"


class Server:
    def __init__(self, tally):
        self.proc = subprocess.Popen([tally, "lsp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.next_id = 1

    def message(self, method, params=None, request=True):
        """A JSON-RPC message; a request takes the next id."""
        msg = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        if request:
            msg["id"] = self.next_id
            self.next_id += 1
        return msg

    def send(self, method, params=None, request=True):
        self.send_together(self.message(method, params, request))

    def send_together(self, *msgs):
        """Writes the messages framed, in one write, so the server reads them back to back."""
        frames = b""
        for msg in msgs:
            body = json.dumps(msg).encode("utf-8")
            frames += b"Content-Length: %d\r\n\r\n" % len(body) + body
        self.proc.stdin.write(frames)
        self.proc.stdin.flush()

    def read(self, timeout=30):
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
        print("<< " + json.dumps(result["msg"], sort_keys=True, ensure_ascii=False))
        return result["msg"]


def main():
    s = Server(sys.argv[1])
    s.send("initialize", {"processId": None, "rootUri": None, "capabilities": {}})
    s.read()
    s.send("initialized", {}, request=False)
    s.send("textDocument/didOpen", {"textDocument": {"uri": URI, "languageId": "tally",
                                                     "version": 1, "text": BROKEN}}, request=False)
    s.read()
    # With errors, a block's hover says so.
    s.send("textDocument/hover", {"textDocument": {"uri": URI}, "position": {"line": 0, "character": 8}})
    s.read()
    s.send("textDocument/didChange", {"textDocument": {"uri": URI, "version": 2},
                                      "contentChanges": [{"text": FIXED}]}, request=False)
    s.read()
    # 'Layer' in its declaration, 'Net' in the plan, 'weight' (not a block).
    s.send("textDocument/hover", {"textDocument": {"uri": URI}, "position": {"line": 0, "character": 8}})
    s.read()
    s.send("textDocument/hover", {"textDocument": {"uri": URI}, "position": {"line": 8, "character": 19}})
    s.read()
    s.send("textDocument/hover", {"textDocument": {"uri": URI}, "position": {"line": 1, "character": 10}})
    s.read()
    # 'Layer' where Net uses it: its declaration; the keyword 'param': nothing.
    s.send("textDocument/definition", {"textDocument": {"uri": URI}, "position": {"line": 5, "character": 23}})
    s.read()
    s.send("textDocument/definition", {"textDocument": {"uri": URI}, "position": {"line": 1, "character": 3}})
    s.read()
    s.send("textDocument/completion", {"textDocument": {"uri": URI}, "position": {"line": 8, "character": 0}})
    s.read()
    s.send("textDocument/formatting", {"textDocument": {"uri": URI}, "options": {}})
    s.read()
    # The member 'layers' of Net: the repeat list it creates.
    s.send("textDocument/hover", {"textDocument": {"uri": URI}, "position": {"line": 5, "character": 4}})
    s.read()
    s.send("shutdown")
    s.read()
    s.send("exit", request=False)
    s.proc.stdin.close()
    print("exit %d" % s.proc.wait(timeout=30))


if __name__ == "__main__":
    main()
