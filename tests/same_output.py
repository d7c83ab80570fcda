#!/usr/bin/env python3
"""same_output.py — two tally binaries print the same bytes on every input we have.

Usage:
  same_output.py OLD_TALLY NEW_TALLY [REPO_DIR] [--keep DIR] [--jobs N]

A refactor that must not change what tally prints (docs/design.md "Refactoring without changing
output") is checked by running the binary from before it (OLD) and the one after it (NEW) on the
same corpus, in the same working directory, and comparing stdout, stderr and the exit status
byte for byte, and every file a `tally build` writes. The corpus:
  - every examples/*.tally file and every plan in it: `report` in text, json, markdown and html,
    `--emit=ir`, `--emit=memory-plan`, `explain` of the first op and of the first block, the json
    report under each checkpoint policy, and `check` in text, json and sarif;
  - `tally build` of each example's first train plan for the cpu and the cuda backend (the files
    written: the generated step, its CMakeLists.txt and the runtime copied beside it);
  - every `%tally ...` command of every `// RUN:` line in tests/lit (the part before the first
    pipe or redirection; commands that write under %t are run with %t pointing into a scratch
    folder of their own, the same path for both binaries);
  - a 400-layer GPT from bench/gen_layers.py under every checkpoint policy, and the layout search
    on it.
Exits 0 when every output matches, 1 otherwise, naming each command whose output differs and the
first differing line.
"""
import concurrent.futures
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

POLICIES = ["none", "full", "selective", "selective_wide", "sqrt", "auto", "every(2)"]


def plans(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    train = re.findall(r"^train\s+([A-Za-z_][A-Za-z0-9_]*)", text, re.M)
    infer = re.findall(r"^infer\s+([A-Za-z_][A-Za-z0-9_]*)", text, re.M)
    return train, infer


def lit_commands(repo):
    """The tally invocations of tests/lit's RUN lines, as shell text with %tally left in."""
    out = []
    for path in sorted(glob.glob(os.path.join(repo, "tests", "lit", "*.tally"))):
        with open(path, encoding="utf-8") as f:
            for line in f:
                m = re.search(r"RUN:\s*(.*)$", line)
                if not m or "%tally" not in m.group(1):
                    continue
                cmd = m.group(1)
                cmd = cmd[cmd.index("%tally"):]
                # Up to the first pipe, redirection or command separator outside quotes.
                cut = len(cmd)
                quote = None
                for i, ch in enumerate(cmd):
                    if quote:
                        if ch == quote:
                            quote = None
                    elif ch in "'\"":
                        quote = ch
                    elif ch in "|<>;&" or cmd.startswith(" 2>", i):
                        cut = i
                        break
                cmd = cmd[:cut].strip()
                if cmd.endswith("'") and cmd.count("'") % 2:
                    continue  # the command sits inside a quoted bash -c: skip what we cannot cut
                out.append((os.path.relpath(path, repo), cmd))
    return out


def corpus(repo, deep):
    cmds = []  # (name, argv-or-shell, kind)
    for ex in sorted(glob.glob(os.path.join(repo, "examples", "*.tally"))):
        rel = os.path.relpath(ex, repo)
        train, infer = plans(ex)
        for plan in train + infer:
            base = ["%tally", "report", rel, "--plan", plan]
            for fmt in ("text", "json", "markdown", "html"):
                cmds.append(base + ["--format", fmt])
            cmds.append(base + ["--emit=ir"])
            cmds.append(base + ["--emit=memory-plan"])
            cmds.append(["%explain-first", rel, plan])
            if plan in train:
                for pol in POLICIES:
                    cmds.append(base + ["--checkpoint", pol, "--format", "json"])
        for fmt in ("text", "json", "sarif"):
            cmds.append(["%tally", "check", rel, "--format", fmt])
        if train:
            for backend in ("cpu", "cuda"):
                cmds.append(["%build", rel, train[0], backend])
    for rel, cmd in lit_commands(repo):
        cmds.append(["%lit", rel, cmd])
    for pol in POLICIES:
        cmds.append(["%tally", "report", deep, "--checkpoint", pol, "--format", "json"])
    cmds.append(["%tally", "report", deep, "--format", "text"])
    cmds.append(["%tally", "solve", "layout", deep])
    return cmds


def run(argv, cwd, shell=False, timeout=300):
    try:
        r = subprocess.run(argv, cwd=cwd, shell=shell, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=timeout)
        return r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired:
        return "timeout", b"", b""


def tree_digest(folder):
    """Every file under folder, by relative path, with its bytes."""
    files = {}
    for root, _, names in os.walk(folder):
        for n in sorted(names):
            p = os.path.join(root, n)
            with open(p, "rb") as f:
                files[os.path.relpath(p, folder)] = f.read()
    return files


def execute(tally, repo, scratch, cmd):
    """Runs one corpus entry with one binary; returns a dict of named byte strings."""
    kind = cmd[0]
    if kind == "%tally":
        rc, out, err = run([tally] + cmd[1:], repo)
        return {"rc": str(rc).encode(), "stdout": out, "stderr": err}
    if kind == "%explain-first":
        _, rel, plan = cmd
        rc, out, _ = run([tally, "report", rel, "--plan", plan, "--format", "json"], repo)
        result = {}
        try:
            ops = json.loads(out).get("ops", [])
        except ValueError:
            ops = []
        paths = [o["path"] for o in ops if isinstance(o, dict) and "path" in o][:1]
        blocks = sorted({p.split(".")[0] for o in ops if isinstance(o, dict)
                         for p in [o.get("path", "")] if "." in p})[:1]
        for i, p in enumerate(paths + blocks):
            rc, out, err = run([tally, "explain", rel, "--plan", plan, "--op", p], repo)
            result["explain%d rc" % i] = str(rc).encode()
            result["explain%d stdout" % i] = out
            result["explain%d stderr" % i] = err
        return result
    if kind == "%build":
        _, rel, plan, backend = cmd
        outdir = os.path.join(scratch, "build-%s-%s-%s" % (os.path.basename(rel), plan, backend))
        shutil.rmtree(outdir, ignore_errors=True)
        rc, out, err = run([tally, "build", rel, "--plan", plan, "--backend", backend,
                            "-o", outdir], repo)
        result = {"rc": str(rc).encode(), "stdout": out.replace(outdir.encode(), b"OUT"),
                  "stderr": err.replace(outdir.encode(), b"OUT")}
        if os.path.isdir(outdir):
            for name, data in tree_digest(outdir).items():
                result["file " + name] = data.replace(outdir.encode(), b"OUT")
            shutil.rmtree(outdir, ignore_errors=True)
        return result
    if kind == "%lit":
        _, rel, text = cmd
        tdir = os.path.join(scratch, "lit-t")
        shutil.rmtree(tdir, ignore_errors=True)
        os.makedirs(tdir)
        src = os.path.join(repo, rel)
        text = (text.replace("%tally", shlex.quote(tally))
                .replace("%src", shlex.quote(repo))
                .replace("%examples", shlex.quote(os.path.join(repo, "examples")))
                .replace("%s", shlex.quote(src))
                .replace("%t", shlex.quote(tdir)))
        rc, out, err = run(text, os.path.dirname(src), shell=True)
        result = {"rc": str(rc).encode(), "stdout": out.replace(tdir.encode(), b"T"),
                  "stderr": err.replace(tdir.encode(), b"T")}
        for name, data in tree_digest(tdir).items():
            result["file " + name] = data.replace(tdir.encode(), b"T")
        return result
    raise ValueError(kind)


def first_diff(a, b):
    la, lb = a.splitlines(), b.splitlines()
    for i, (x, y) in enumerate(zip(la, lb)):
        if x != y:
            return "line %d:\n    old: %s\n    new: %s" % (i + 1, x[:200].decode("utf-8", "replace"),
                                                      y[:200].decode("utf-8", "replace"))
    return "line %d: one output is longer (%d vs %d lines)" % (min(len(la), len(lb)) + 1,
                                                              len(la), len(lb))


def main():
    args = sys.argv[1:]
    jobs = 2
    if "--jobs" in args:
        i = args.index("--jobs")
        jobs = int(args[i + 1])
        del args[i:i + 2]
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    repo = os.path.abspath(args[2] if len(args) > 2 else
                           os.path.join(os.path.dirname(__file__), ".."))
    work = tempfile.mkdtemp(prefix="same-output-")
    # Both binaries are run as ".../tally": usage text names argv[0]'s file name.
    old, new = os.path.join(work, "old", "tally"), os.path.join(work, "new", "tally")
    for src, dst in ((args[0], old), (args[1], new)):
        os.makedirs(os.path.dirname(dst))
        shutil.copy2(src, dst)
    deep = os.path.join(work, "gen400.tally")
    with open(deep, "w", encoding="utf-8") as f:
        f.write(subprocess.run([sys.executable, os.path.join(repo, "bench", "gen_layers.py"), "400"],
                               stdout=subprocess.PIPE, check=True,
                               universal_newlines=True).stdout)
    cmds = corpus(repo, deep)

    def both(i):
        # Each binary gets its own scratch folder, at the same path for both (kept per entry).
        scratch = os.path.join(work, "s%d" % i)
        os.makedirs(scratch, exist_ok=True)
        a = execute(old, repo, scratch, cmds[i])
        b = execute(new, repo, scratch, cmds[i])
        shutil.rmtree(scratch, ignore_errors=True)
        # The binaries' own paths appear in usage text: name them alike.
        a = {k: v.replace(old.encode(), b"TALLY") for k, v in a.items()}
        b = {k: v.replace(new.encode(), b"TALLY") for k, v in b.items()}
        return i, a, b

    failures = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for i, a, b in pool.map(both, range(len(cmds))):
            if a == b:
                continue
            failures += 1
            name = " ".join(str(c) for c in cmds[i])
            for key in sorted(set(a) | set(b)):
                if a.get(key) != b.get(key):
                    if key not in a or key not in b:
                        print("DIFF %s: %s only in %s" % (name, key, "new" if key in b else "old"))
                    else:
                        print("DIFF %s: %s %s" % (name, key, first_diff(a[key], b[key])))
    shutil.rmtree(work, ignore_errors=True)
    digest = hashlib.sha256(" ".join(map(str, cmds)).encode()).hexdigest()[:12]
    print("same_output: %d commands (corpus %s), %d differ" % (len(cmds), digest, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
