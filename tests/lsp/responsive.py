#!/usr/bin/env python3
"""responsive.py — `tally lsp` answers while it compiles, and publishes only the newest version.

Usage: responsive.py TALLY [--timing]

A document of 1,000 repeated layers is opened together with a hover request, written to the
server in one piece: the hover must be answered before the document's diagnostics are
published (requests never wait on a compile). Then two changes (version 2 with an error,
version 3 without) and a hover arrive together: the hover is answered at once from version
1's compile, version 2 is never compiled or published (a newer version supersedes it), and
version 3's diagnostics are the next message. Prints every message as session.py does (its
Server); --timing also prints how long the hovers took (not checked: a timed test would fail
on a loaded machine; docs/lsp.md gives the numbers).
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from session import Server  # noqa: E402

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


def main():
    timing = "--timing" in sys.argv
    s = Server(sys.argv[1])
    s.send("initialize", {"processId": None, "rootUri": None, "capabilities": {}})
    s.read()
    hover = {"textDocument": {"uri": URI}, "position": {"line": 0, "character": 8}}
    start = time.monotonic()
    s.send_together(
        s.message("textDocument/didOpen", {"textDocument": {"uri": URI, "languageId": "tally",
                                                            "version": 1, "text": DOC}}, False),
        s.message("textDocument/hover", hover))
    s.read()
    answered = time.monotonic()
    s.read()
    if timing:
        print("hover %.1f ms; compile published after %.1f ms" %
              ((answered - start) * 1e3, (time.monotonic() - start) * 1e3))
    start = time.monotonic()
    s.send_together(
        s.message("textDocument/didChange", {"textDocument": {"uri": URI, "version": 2},
                                             "contentChanges": [{"text": BROKEN}]}, False),
        s.message("textDocument/didChange", {"textDocument": {"uri": URI, "version": 3},
                                             "contentChanges": [{"text": FIXED}]}, False),
        s.message("textDocument/hover", hover))
    s.read()
    if timing:
        print("hover during the changes %.1f ms" % ((time.monotonic() - start) * 1e3))
    s.read()
    s.send("shutdown")
    s.read()
    s.send("exit", request=False)
    s.proc.stdin.close()
    print("exit %d" % s.proc.wait(timeout=30))


if __name__ == "__main__":
    main()
