#!/usr/bin/env python3
"""readme_commands.py — every tally command the README shows exits 0.

Usage: readme_commands.py TALLY REPO_DIR [--with-steps]

Collects the commands of README.md: each line of a ```sh block that starts with `build/tally`
or `tally`, and each inline `tally ...` span (a span naming a placeholder such as FILE is
skipped). Runs each through bash in a scratch folder that links the repository's examples/,
tests/ and docs/ (so `-o report.html` writes there), with `tally` meaning TALLY, and fails
when one exits non-zero: a command a new user copies from the README must work. `tally run`
and `tally build` compile a generated step (minutes) and run only with --with-steps.
Prints one line per command; exits 0 when all pass, 1 otherwise, 2 on usage.
"""
import os
import re
import subprocess
import sys
import tempfile


def commands(readme):
    out = []
    in_sh = False
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    for line in text.split("\n"):
        if line.startswith("```"):
            in_sh = line.strip() == "```sh" and not in_sh
            continue
        if in_sh:
            cmd = line.split("#", 1)[0].strip()
            if re.match(r"(build/)?tally ", cmd):
                out.append(re.sub(r"^(build/)?tally ", "", cmd))
    for span in re.findall(r"`tally ([^`]+)`", text):
        if re.search(r"\b[A-Z]{3,}\b", span.replace("H100_SXM", "")):
            continue  # a placeholder (FILE, NAME): not a runnable command
        out.append(span)
    seen, unique = set(), []
    for c in out:
        if c not in seen:
            seen.add(c)
            unique.append(c)
    return unique


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    with_steps = "--with-steps" in sys.argv
    if len(args) != 2:
        print(__doc__)
        return 2
    tally, repo = os.path.abspath(args[0]), os.path.abspath(args[1])
    failed = 0
    with tempfile.TemporaryDirectory() as scratch:
        for d in ("examples", "tests", "docs"):
            os.symlink(os.path.join(repo, d), os.path.join(scratch, d))
        for cmd in commands(os.path.join(repo, "README.md")):
            if not with_steps and re.match(r"(run|build)\b", cmd):
                print("skip " + cmd + " (compiles a step; --with-steps)")
                continue
            r = subprocess.run(["bash", "-c", 'tally() { "$TALLY" "$@"; }; tally ' + cmd],
                               cwd=scratch, env=dict(os.environ, TALLY=tally),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            ok = r.returncode == 0
            failed += not ok
            print(("ok   " if ok else "FAIL ") + "tally " + cmd + ("" if ok else " (exit %d)" % r.returncode))
            if not ok:
                print("\n".join("     " + l for l in r.stderr.splitlines()[:8]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
