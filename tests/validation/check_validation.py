#!/usr/bin/env python3
"""Published training runs against tally's step-time estimate (docs/validation.md).

Every tests/validation/*.tally file is one published run. Its header states, in lines of the form
`// validation: KEY = VALUE`:
  source           where the measured number comes from (paper and table)
  measured_step_s  the measured seconds per optimizer step (derived from the paper's number as
                   the header's comment shows)
  measured         the paper's number as printed
  bound            the largest |error| the row may show, as a fraction (0.15 = 15%)
The script runs `tally report FILE --format json` on each, computes error = estimate / measured
- 1, prints the table (Markdown with --markdown) and exits 1 when a row's |error| exceeds its
bound, when the mean |error| exceeds --mean-bound, when a file cannot be read, or when tally
reports an error for a run that was measured (it did run: it fits and its layout is valid).

Usage: check_validation.py TALLY_BINARY VALIDATION_DIR [--markdown] [--mean-bound 0.05]
"""
import glob
import json
import os
import re
import subprocess
import sys


def header(path):
    fields = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"//\s*validation:\s*(\w+)\s*=\s*(.+?)\s*$", line)
            if m:
                fields[m.group(1)] = m.group(2)
    return fields


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    markdown = "--markdown" in argv
    mean_bound = 0.05
    if "--mean-bound" in argv:
        mean_bound = float(argv[argv.index("--mean-bound") + 1])
        args.remove(argv[argv.index("--mean-bound") + 1])
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    tally, folder = args
    files = sorted(glob.glob(os.path.join(folder, "*.tally")))
    if not files:
        print(f"no .tally files under {folder}", file=sys.stderr)
        return 1
    rows, failures = [], []
    for path in files:
        name = os.path.basename(path)[: -len(".tally")]
        h = header(path)
        missing = [k for k in ("source", "measured_step_s", "measured", "bound") if k not in h]
        if missing:
            failures.append(f"{name}: header lacks {', '.join(missing)}")
            continue
        run = subprocess.run([tally, "report", path, "--format", "json"], capture_output=True,
                             text=True)
        try:
            report = json.loads(run.stdout)
        except json.JSONDecodeError:
            failures.append(f"{name}: tally exited {run.returncode}: {run.stderr.strip()[:300]}")
            continue
        # A published run ran: tally must not say it cannot (out of memory, a bad layout).
        for d in report.get("diagnostics", []):
            if d.get("severity") == "error":
                failures.append(f"{name}: tally says the run cannot run: [{d.get('code')}] "
                                f"{d.get('message')}")
        est = report["time"]["step_s"]
        measured = float(h["measured_step_s"])
        err = est / measured - 1
        bound = float(h["bound"])
        rows.append((name, h["source"], h["measured"], measured, est, err, bound))
        if abs(err) > bound:
            failures.append(f"{name}: error {err:+.1%} exceeds its bound ±{bound:.0%}")
    if markdown:
        print("| run | source | measured (as published) | measured step (s) | tally (s) | error | bound |")
        print("|---|---|---|---|---|---|---|")
        for name, src, meas, m, e, err, b in rows:
            print(f"| `{name}` | {src} | {meas} | {m:.3f} | {e:.3f} | {err:+.1%} | ±{b:.0%} |")
    else:
        for name, src, meas, m, e, err, b in rows:
            print(f"{name:40s} measured {m:9.3f} s  tally {e:9.3f} s  error {err:+6.1%}  (bound ±{b:.0%})")
    if rows:
        errors = [abs(r[5]) for r in rows]
        mean, worst = sum(errors) / len(errors), max(errors)
        print(f"\n{len(rows)} runs: mean |error| {mean:.1%}, worst {worst:.1%} "
              f"(mean bound {mean_bound:.0%})")
        if mean > mean_bound:
            failures.append(f"mean |error| {mean:.1%} exceeds {mean_bound:.0%}")
    for f in failures:
        print("FAIL: " + f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
