#!/usr/bin/env python3
"""library.py — `tally lsp` on errors raised inside the standard library, and code actions.

Usage: library.py TALLY

Opens a document whose `Linear` is sized wrong (the matmul-shape error is raised in std.tally's
Linear: the editor must show it at the user's call, with the library's line as a note) and
one with a misspelt name (a did-you-mean fix-it), asks for the code actions over the whole
document, then shuts down. Prints every message as session.py does; tests/lit/lsp-library.tally
FileChecks the transcript.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from session import Server  # noqa: E402

WRONG_LINEAR = """model M(d = 64, hidden = 128) {
  proj = Linear(2 * hidden, d)
  forward(x: f32[batch, hidden]) {
    return mean(proj(x))
  }
}
train t { model = M() batch = 8 target = H100_SXM }
"""
TYPO = """model N(d = 64) {
  param weight: [d, d]
  forward(x: f32[batch, d]) { return mean(x @ wieght) }
}
train t { model = N() batch = 8 target = H100_SXM }
"""


def main():
    s = Server(sys.argv[1])
    s.send("initialize", {"processId": None, "rootUri": None, "capabilities": {}})
    s.read()
    for n, text in enumerate([WRONG_LINEAR, TYPO]):
        uri = "file:///tmp/lib%d.tally" % n
        s.send("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "tally",
                                                         "version": 1, "text": text}}, request=False)
        s.read()
        s.send("textDocument/codeAction", {"textDocument": {"uri": uri},
                                           "range": {"start": {"line": 0, "character": 0},
                                                     "end": {"line": 9, "character": 0}},
                                           "context": {"diagnostics": []}})
        s.read()
    s.send("shutdown")
    s.read()
    s.send("exit", request=False)
    s.proc.stdin.close()
    print("exit %d" % s.proc.wait(timeout=30))


if __name__ == "__main__":
    main()
