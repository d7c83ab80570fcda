#!/usr/bin/python3
"""check_checkpoint.py — the generated CPU step under every checkpoint policy (issue 7).

Runs `TALLY run ckpt.tally --checkpoint P --steps 3 --warmup 0 --format json --dump-grads G`
for P in none, full, every(2), every(3), sqrt, recompute_all, selective_wide and auto, and the
`ckpt_core` plan (the same model with materialised attention) under none and selective
(Megatron's: the attention core re-run alone), and checks for each:
  - the arena the step allocated is exactly the estimate's (measured.arena_bytes ==
    estimated.arena_bytes), and a checkpointing policy plans a smaller arena than none;
  - the loss of every step and every gradient of the last step equal those of `none` to within
    1e-6 relative (recomputation replays the forward: same kernels, same Philox dropout masks;
    the only differences allowed are none at all in practice, the bound covers summation order
    should a kernel's thread split change).
Then ckpt_nested.tally (8 layers, host target, a 1.7 MiB memory budget that no one-level
policy meets with less recompute): `auto` must choose nested recomputation (`tally report`
says checkpoint.policy "nested") and its step must allocate the planned arena and reproduce
the loss and gradients of the same model with `--checkpoint recompute_all` (the one other
policy within the budget; the first part shows it reproduces none's).
Prints PASS/FAIL lines and "N passed, M failed"; exits 1 on a failure, 77 (skip) when TALLY
has no `run` command.
Usage: /usr/bin/python3 check_checkpoint.py TALLY
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_e2e as E  # noqa: E402
import safetensors as st  # noqa: E402

POLICIES = ["none", "full", "every(2)", "every(3)", "sqrt", "recompute_all", "selective_wide",
            "auto"]
# (name, plan, policy, the run compared with): Megatron's selective against the same plan's none.
CORE = [("core none", "ckpt_core", "none", None), ("selective", "ckpt_core", "selective", "core none")]
RTOL = 1e-6


def main():
    tally = sys.argv[1]
    if not E.tally_has_run([tally]):
        print("SKIP: tally run not available")
        return E.SKIP
    res = E.Results()
    result = res.add

    runs = {}
    with tempfile.TemporaryDirectory() as work:
        def run(name, model, policy, plan=None):
            grads = os.path.join(work, "g-%s.safetensors" % name.replace("(", "").replace(")", "")
                                 .replace(" ", "-"))
            cmd = [tally, "run", os.path.join(HERE, model), "--steps", "3", "--warmup", "0",
                   "--format", "json", "--seed", "7", "--dump-grads", grads]
            if plan:
                cmd += ["--plan", plan]
            if policy:
                cmd += ["--checkpoint", policy]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                result(name + " run", False, "exit %d: %s" % (r.returncode, r.stderr[-2000:]))
                return
            report = json.loads(r.stdout[r.stdout.index("{"):])
            runs[name] = (report, st.load(grads))
            est, got = report["estimated"]["arena_bytes"], report["measured"]["arena_bytes"]
            result(name + " arena", est == got, "estimated %d, allocated %d" % (est, got))

        for p in POLICIES:
            run(p, "ckpt.tally", p)
        for name, plan, policy, _ in CORE:
            run(name, "ckpt.tally", policy, plan)
        run("nested base", "ckpt_nested.tally", "recompute_all")
        run("nested", "ckpt_nested.tally", None)
        r = subprocess.run([tally, "report", os.path.join(HERE, "ckpt_nested.tally"), "--format",
                            "json"], capture_output=True, text=True)
        policy = json.loads(r.stdout)["checkpoint"]["policy"] if r.returncode == 0 else r.stderr
        result("nested chosen", policy == "nested", "auto under the budget chose %s" % policy)
        if "none" not in runs:
            result("none run", False, "no baseline")
            return 1
        bases = {name: against for name, _, _, against in CORE if against}
        for p in POLICIES[1:] + ["nested"] + list(bases):
            base = "nested base" if p == "nested" else bases.get(p, "none")
            if p not in runs or base not in runs:
                continue
            base_report, base_grads = runs[base]
            report, grads = runs[p]
            if p not in ("auto", "nested"):
                result(p + " arena smaller", report["estimated"]["arena_bytes"] < base_report["estimated"]["arena_bytes"],
                       "%d < %d" % (report["estimated"]["arena_bytes"], base_report["estimated"]["arena_bytes"]))
            a, b = np.array(report["loss"]), np.array(base_report["loss"])
            ok = a.shape == b.shape and bool(np.all(np.abs(a - b) <= RTOL * np.abs(b)))
            result(p + " loss", ok, "%s vs none %s" % (a.tolist(), b.tolist()))
            worst, names = 0.0, sorted(base_grads)
            same_names = sorted(grads) == names
            for n in names:
                if n in grads:
                    d = np.abs(grads[n].astype(np.float64) - base_grads[n].astype(np.float64))
                    scale = max(1e-30, float(np.max(np.abs(base_grads[n]))))
                    worst = max(worst, float(np.max(d)) / scale)
            result(p + " gradients", same_names and worst <= RTOL,
                   "%d tensors, worst difference %.2e of the tensor's scale" % (len(names), worst))
    print("%d passed, %d failed" % (res.passed, res.failed))
    return 1 if res.failed else 0


if __name__ == "__main__":
    sys.exit(main())
