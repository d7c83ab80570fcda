#!/usr/bin/env python3
"""check_tour.py — the commands of a Markdown page still print what the page shows.

Usage: check_tour.py TALLY REPO_DIR PAGE.md...

Every fenced block marked ```console is a transcript: a line `$ tally ARGS` is a command, the
lines after it (up to the next `$ ` line or the fence) its expected output. The command runs
in REPO_DIR through bash with `tally` meaning the TALLY binary; stdout is compared (stderr
too when the command ends in `2>&1`), each line without its trailing spaces. A line `...`
stands for any number of lines, so a page can show an excerpt: the pieces between `...` lines
must appear in the output in order, the first at the top unless the block opens with `...`,
the last at the bottom unless it ends with `...`. A transcript may give the exit status it
expects with a last line `[exit N]` (otherwise 0).

Prints one line per command and exits 0 when every transcript holds, 1 otherwise, 2 on usage.
"""
import os
import re
import subprocess
import sys
import tempfile


def transcripts(page):
    """(line number, command, expected lines, expected exit) for each `$ ` line of console blocks."""
    out, in_console, current = [], False, None
    with open(page, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for n, line in enumerate(lines, 1):
        if line.startswith("```"):
            if in_console and current:
                out.append(current)
            current = None
            in_console = line.strip() == "```console" and not in_console
            continue
        if not in_console:
            continue
        if line.startswith("$ "):
            if current:
                out.append(current)
            current = [n, line[2:], [], 0]
        elif current is not None:
            m = re.fullmatch(r"\[exit (\d+)\]", line.strip())
            if m:
                current[3] = int(m.group(1))
            else:
                current[2].append(line.rstrip())
    return out


def matches(expected, actual):
    """Whether `actual` (lines) shows the pieces of `expected` split at `...` lines, in order."""
    while expected and expected[-1] == "":
        expected = expected[:-1]
    while actual and actual[-1] == "":
        actual = actual[:-1]
    pieces, piece = [], []
    for line in expected:
        if line == "...":
            pieces.append(piece)
            piece = []
        else:
            piece.append(line)
    pieces.append(piece)
    anchored_top = bool(pieces[0])
    anchored_bottom = bool(pieces[-1])
    pos = 0
    for i, p in enumerate(pieces):
        if not p:
            continue
        last = i == len(pieces) - 1
        if i == 0:
            candidates = [0]
        elif last and anchored_bottom:
            candidates = [len(actual) - len(p)]
        else:
            candidates = range(pos, len(actual) - len(p) + 1)
        found = None
        for c in candidates:
            if c >= pos and actual[c:c + len(p)] == p:
                found = c
                break
        if found is None:
            return False
        pos = found + len(p)
    if anchored_bottom and pieces[-1] and pos != len(actual):
        return False
    if len(pieces) == 1 and anchored_top and pos != len(actual):
        return False
    return True


def main():
    if len(sys.argv) < 4:
        print(__doc__.strip().split("\n")[2])
        return 2
    tally, repo, pages = os.path.abspath(sys.argv[1]), sys.argv[2], sys.argv[3:]
    failures, count = 0, 0
    with tempfile.TemporaryDirectory() as bindir:
        os.symlink(tally, os.path.join(bindir, "tally"))
        env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
                   TALLY_CACHE_DIR=os.path.join(bindir, "cache"))
        for page in pages:
            for line, command, expected, status in transcripts(page):
                count += 1
                r = subprocess.run(["bash", "-c", command], cwd=repo, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, timeout=120)
                actual = [l.rstrip() for l in r.stdout.split("\n")]
                ok = matches(expected, actual) and r.returncode == status
                print("%s %s:%d: $ %s" % ("ok  " if ok else "FAIL", os.path.basename(page), line, command))
                if not ok:
                    failures += 1
                    print("  exit %d (expected %d); output:" % (r.returncode, status))
                    for l in actual:
                        print("  | " + l)
                    if r.stderr:
                        print("  stderr: " + r.stderr.strip().replace("\n", "\n  stderr: "))
    print("%d of %d transcripts hold" % (count - failures, count))
    return 1 if failures or count == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
