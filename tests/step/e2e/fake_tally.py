#!/usr/bin/python3
"""fake_tally.py — a stand-in for `tally run` used only by `check_e2e.py --self-test`.

It accepts the `tally run` command line the checks use (FILE --plan --backend cpu --steps
--warmup --format json --init --data --save --dump-grads --seed) and computes what a correct
fp32 implementation would write, with PyTorch in float32 (models.py): --dump-grads after the
first optimizer step's backward, --save after the last step, and on stdout the JSON keys the
checks read ({"loss": [...], "measured": {"step_s", "arena_bytes"}, "estimated": {"arena_bytes",
"regions": {"params"}}}; nothing else of tally's JSON). So the
self-test exercises the whole orchestration — safetensors both ways, subprocess, JSON, the
tolerances against an fp32 computation in another summation order — without the real binary.

Test hooks (environment):
  TALLY_FAKE_PERTURB=grad:NAME | save:NAME | loss   corrupt one output, the checks must fail
  TALLY_FAKE_NO_RUN=1                               --help lists no `run` (the checks must skip)
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models as M  # noqa: E402
import safetensors as st  # noqa: E402


def main(argv):
    if len(argv) >= 1 and argv[0] in ("--help", "-h"):
        print("usage: fake_tally COMMAND ...\ncommands:")
        if not os.environ.get("TALLY_FAKE_NO_RUN"):
            print("  run     (a PyTorch float32 stand-in for tally run)")
        return 0
    if not argv or argv[0] != "run" or os.environ.get("TALLY_FAKE_NO_RUN"):
        print("fake_tally: unknown command", file=sys.stderr)
        return 2
    ap = argparse.ArgumentParser(prog="fake_tally run")
    ap.add_argument("file")
    ap.add_argument("--plan", required=True)
    ap.add_argument("--backend", choices=["cpu"], required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--format", choices=["json"], required=True)
    ap.add_argument("--init")
    ap.add_argument("--data")
    ap.add_argument("--save")
    ap.add_argument("--dump-grads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pad-head", action="store_true")  # the same function: torch pads nothing
    a = ap.parse_args(argv[1:])
    specs = [m for m in M.MODELS if os.path.abspath(m.file) == os.path.abspath(a.file)]
    if not specs:
        print("fake_tally: no torch model for %s" % a.file, file=sys.stderr)
        return 1
    spec = next((m for m in specs if m.plan == a.plan), None)
    if spec is None:
        print("fake_tally: %s has no plan %s" % (a.file, a.plan), file=sys.stderr)
        return 1
    plan = M.read_plan(spec)
    steps = a.steps  # in all, as `tally run` (issue 42): --warmup only says how many are untimed
    rows = steps * plan["batch"]
    if a.init:
        weights = st.load(a.init)
    else:
        weights = spec.default_init(torch.Generator().manual_seed(a.seed))
    if a.data:
        data = st.load(a.data)
        for name, arr in data.items():
            if arr.shape[0] < rows:
                print("fake_tally: %s has %d rows, %d steps need %d"
                      % (name, arr.shape[0], steps, rows), file=sys.stderr)
                return 1
    else:
        data = spec.draw_batch(np.random.default_rng(a.seed), rows)
    perturb = os.environ.get("TALLY_FAKE_PERTURB", "")

    def dump(grads):
        if not a.dump_grads:
            return
        out = {k: v.numpy().astype(np.float32) for k, v in grads.items()}
        if perturb.startswith("grad:"):
            g = out[perturb[5:]].reshape(-1)
            g[0] += 1e-4 * np.abs(g).max()
        st.save(a.dump_grads, out)

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    losses, final = M.train(spec, plan, weights, data, steps, torch.float32, on_first_grads=dump)
    elapsed = time.perf_counter() - t0
    if a.save:
        if perturb.startswith("save:"):
            p = final[perturb[5:]].reshape(-1)
            p[0] += 1e-4 * abs(p[0]) + 1e-5
        st.save(a.save, {k: v.astype(np.float32) for k, v in final.items()})
    if perturb == "loss":
        losses[0] *= 1 + 1e-4
    # A line before the JSON, as a build message might be: the checks must still find the JSON.
    print("fake_tally: {%s} stepped %d times" % (spec.key, steps))
    # The memory numbers check_e2e.py's --pad-head check reads: a params region of every
    # parameter in fp32, with a padded head's rows (wte.weight's vocabulary up to a multiple of
    # 64) under --pad-head; no arena (torch allocates as it goes), measured = estimated.
    params = 0
    for name, shape, _ in spec.params:
        rows = shape[0] + (-shape[0] % 64 if a.pad_head and name == "wte.weight" else 0)
        params += 4 * rows * int(np.prod(shape[1:]))
    memory = {"arena_bytes": 0, "regions": {"params": params}}
    print(json.dumps({"loss": losses, "measured": {"step_s": elapsed / steps, "arena_bytes": 0},
                      "estimated": memory}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
