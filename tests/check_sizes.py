#!/usr/bin/env python3
"""check_sizes.py — no compiler source file over 1,000 lines, no function over 150.

Usage: check_sizes.py REPO_DIR [--list N]

Rooms a newcomer can hold in their head (docs/design.md "Habits"): every .cpp/.h/.cu/.cuh file
of the compiler and its runtime (codegen, driver, frontend, ir, passes, report, support, tools)
stays at most 1,000 lines, and every function body at most 150. Generated code (the ANTLR
parser lives in the build folder), tests and the fuzz harness are not counted.

Functions are found without a C++ parser: comments, string and character literals are blanked,
then braces are matched; a brace opened where only namespaces, classes and `extern "C"` enclose
it, after a `)` (and any const/noexcept/override/-> trailer or a constructor's initialiser
list), opens a function body, and its length is counted from the line of its signature's `(`
to its closing brace. Lambdas and local classes count in the function around them.
--list N prints the N longest functions whatever their length.
Exits 1 naming each file or function over its limit.
"""
import os
import re
import sys

MAX_FILE = 1000
MAX_FUNCTION = 150
DIRS = ["codegen", "driver", "frontend", "ir", "passes", "report", "support", "tools"]
SUFFIXES = (".cpp", ".h", ".cu", ".cuh", ".inc", ".def")


def blank(text):
    """Comments and literals replaced by spaces, newlines kept (so line numbers hold)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = ")" + m.group(1) + '"'
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + re.sub(r"[^\n]", " ", text[i + 2:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + re.sub(r"[^\n]", " ", text[i + 1:j - 1]) + c if j - i >= 2 else text[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(text):
    """(name, first line, last line) of each function body at namespace or class scope."""
    code = blank(text)
    stack = []  # one of 'ns', 'class', 'fn', 'block' per open brace
    starts = []  # for 'fn' entries: (name, line)
    last_stmt = 0  # index just after the last ; { or } at the current level
    result = []
    line = 1
    for i, c in enumerate(code):
        if c == "\n":
            line += 1
        elif c == "{":
            head = code[last_stmt:i]
            outer_ok = all(k in ("ns", "class") for k in stack)
            kind = "block"
            if outer_ok:
                h = " ".join(head.split())
                if re.search(r"\bnamespace\b", h) or re.match(r'^extern\s*""', h):
                    kind = "ns"
                elif re.search(r"\b(class|struct|union|enum)\b", h) and "(" not in h.split(":")[0]:
                    kind = "class"
                elif re.search(r"\)\s*(const|noexcept|override|final|mutable|->[^{]*|\s)*$", h) or \
                        re.search(r"\)\s*:\s*[A-Za-z_]", h):
                    kind = "fn"
                elif "=" in h or h.endswith(")") is False:
                    kind = "block"
            stack.append(kind)
            if kind == "fn":
                m = re.search(r"([A-Za-z_~][A-Za-z0-9_:<>~]*(?:operator[^\s(]*)?)\s*\(", head)
                name = m.group(1) if m else "?"
                first = line - head[m.start():].count("\n") if m else line
                starts.append((name, first))
            last_stmt = i + 1
        elif c == "}":
            if stack:
                kind = stack.pop()
                if kind == "fn":
                    name, first = starts.pop()
                    result.append((name, first, line))
            last_stmt = i + 1
        elif c == ";" and all(k in ("ns", "class") for k in stack):
            last_stmt = i + 1
    return result


def main():
    args = sys.argv[1:]
    show = 0
    if "--list" in args:
        k = args.index("--list")
        show = int(args[k + 1])
        del args[k:k + 2]
    repo = args[0] if args else os.path.join(os.path.dirname(__file__), "..")
    bad = []
    all_fns = []
    for d in DIRS:
        for root, _, names in os.walk(os.path.join(repo, d)):
            for n in sorted(names):
                if not n.endswith(SUFFIXES):
                    continue
                p = os.path.join(root, n)
                rel = os.path.relpath(p, repo)
                with open(p, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                lines = text.count("\n")
                if lines > MAX_FILE:
                    bad.append("%s: %d lines (at most %d)" % (rel, lines, MAX_FILE))
                for name, first, last in functions(text):
                    length = last - first + 1
                    all_fns.append((length, rel, first, name))
                    if length > MAX_FUNCTION:
                        bad.append("%s:%d: function %s is %d lines (at most %d)"
                                   % (rel, first, name, length, MAX_FUNCTION))
    for length, rel, first, name in sorted(all_fns, reverse=True)[:show]:
        print("%5d  %s:%d  %s" % (length, rel, first, name))
    for b in bad:
        print("check_sizes: " + b)
    print("check_sizes: %d functions in %s; %d over a limit" % (len(all_fns), ", ".join(DIRS), len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
