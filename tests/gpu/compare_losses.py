#!/usr/bin/env python3
"""compare_losses.py — the losses of one plan's steps run on two backends agree (issue 38 item 5).

scripts/gpu-validate runs each of its plans with `tally run --backend cpu` and `--backend cuda`
from the same seed (the same initial weights, data and dropout: the drivers share them), the
same number of steps and no warm-up, and compares the `loss` arrays of the two JSON reports:
every step's |cpu - cuda| <= rtol * max(|cpu|, |cuda|) (fp32 plans 1e-4, 16-bit compute 2e-2: bf16
keeps 8 bits of mantissa, and the backends sum in different orders).

Usage: compare_losses.py CPU.json CUDA.json --rtol R [--json OUT.json]
Prints one line per step and a verdict; exits 0 when they agree, 1 when they do not, 2 when a
report cannot be read or has no losses. --json writes {"steps", "cpu", "cuda", "max_rel", "rtol",
"agree"} for the summary.
"""
import argparse
import json
import sys


def losses(path):
    with open(path) as f:
        d = json.load(f)
    got = d.get("loss") if isinstance(d, dict) else None
    if not isinstance(got, list) or not got or not all(isinstance(x, (int, float)) for x in got):
        raise ValueError("%s has no `loss` array of numbers" % path)
    return [float(x) for x in got]


def compare(cpu, cuda, rtol):
    """(agree, max relative difference, per-step relative differences)."""
    if len(cpu) != len(cuda):
        return False, float("inf"), []
    rel = []
    for a, b in zip(cpu, cuda):
        scale = max(abs(a), abs(b))
        rel.append(abs(a - b) / scale if scale > 0 else 0.0)
    worst = max(rel)
    return worst <= rtol, worst, rel


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cpu")
    ap.add_argument("cuda")
    ap.add_argument("--rtol", type=float, required=True)
    ap.add_argument("--json")
    a = ap.parse_args()
    try:
        cpu, cuda = losses(a.cpu), losses(a.cuda)
    except (OSError, ValueError) as e:
        print("compare_losses: %s" % e)
        return 2
    agree, worst, rel = compare(cpu, cuda, a.rtol)
    if len(cpu) != len(cuda):
        print("compare_losses: %d losses on the CPU, %d on CUDA" % (len(cpu), len(cuda)))
    for i, (x, y, r) in enumerate(zip(cpu, cuda, rel)):
        print("step %d: cpu %.6f cuda %.6f rel %.2e%s" % (i, x, y, r, "" if r <= a.rtol else "  > rtol"))
    print("%s: max relative difference %.2e, rtol %.0e" % ("agree" if agree else "DISAGREE", worst, a.rtol))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"steps": len(cpu), "cpu": cpu, "cuda": cuda, "max_rel": worst if rel else None,
                       "rtol": a.rtol, "agree": agree}, f)
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
