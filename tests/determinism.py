#!/usr/bin/env python3
"""determinism.py — the same input gives byte-identical output on every run.

Usage: determinism.py TALLY REPO_DIR

For every examples/*.tally file and every plan in it, runs each report format (text, json,
markdown, html), `check` in text, json and sarif, `report --emit=ir` and `explain` of the
first op, twice each, and compares stdout, stderr and the exit status byte for byte. Hash-map
iteration order, uninitialised memory, addresses or time leaking into output show up here.
Then the same for a GPT of 400 layers written by bench/gen_layers.py, deep enough (6,000 ops)
that the analysis runs its steps on two threads (passes/Pipeline.cpp, kThreadedOps).
Exits 0 when every pair matches, 1 otherwise.
"""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile


def run(cmd, cwd):
    r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    return r.returncode, r.stdout, r.stderr


def plans(path):
    with open(path, encoding="utf-8") as f:
        return re.findall(r"^(?:train|infer)\s+([A-Za-z_][A-Za-z0-9_]*)", f.read(), re.M)


def main():
    tally, repo = os.path.abspath(sys.argv[1]), sys.argv[2]
    examples = sorted(glob.glob(os.path.join(repo, "examples", "*.tally")))
    commands = []
    for ex in examples:
        rel = os.path.relpath(ex, repo)
        for plan in plans(ex):
            for fmt in ("text", "json", "markdown", "html"):
                commands.append([tally, "report", rel, "--plan", plan, "--format", fmt])
            commands.append([tally, "report", rel, "--plan", plan, "--emit=ir"])
            # The first op of the plan's graph, from the JSON report, for `explain`.
            code, out, _ = run([tally, "report", rel, "--plan", plan, "--format", "json"], repo)
            try:
                ops = json.loads(out).get("ops", [])
            except ValueError:
                ops = []
            if ops and isinstance(ops[0], dict) and "path" in ops[0]:
                commands.append([tally, "explain", rel, "--plan", plan, "--op", ops[0]["path"]])
        for fmt in ("text", "json", "sarif"):
            commands.append([tally, "check", rel, "--format", fmt])
    deep_dir = tempfile.TemporaryDirectory()
    deep = os.path.join(deep_dir.name, "gen400.tally")
    with open(deep, "w", encoding="utf-8") as f:
        f.write(subprocess.run([sys.executable, os.path.join(repo, "bench", "gen_layers.py"), "400"],
                               stdout=subprocess.PIPE, check=True, universal_newlines=True).stdout)
    for fmt in ("text", "json", "html"):
        commands.append([tally, "report", deep, "--format", fmt])
    commands.append([tally, "report", deep, "--checkpoint", "auto", "--format", "json"])
    commands.append([tally, "check", deep, "--checkpoint", "auto", "--budget-memory=1GiB"])
    failures = 0
    for cmd in commands:
        first, second = run(cmd, repo), run(cmd, repo)
        if first != second:
            failures += 1
            what = [name for name, a, b in zip(("exit status", "stdout", "stderr"), first, second) if a != b]
            print("FAIL: %s differs between two runs (%s)" % (" ".join(cmd[1:]), ", ".join(what)))
    print("%d of %d commands gave identical output twice" % (len(commands) - failures, len(commands)))
    return 1 if failures or not commands else 0


if __name__ == "__main__":
    sys.exit(main())
