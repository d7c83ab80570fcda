#!/usr/bin/python3
"""check_slices.py — slices and broadcast_to through the generated CPU step (issue 11 item 4).

Runs `TALLY run slices.tally --steps 1 --warmup 0 --init I --data D --dump-grads G` on random
fp32 weights and data, computes the same loss with PyTorch autograd in float64, and checks every
parameter's gradient to within 1e-5 relative to its largest magnitude (the step runs in fp32).
The model exercises a slice's gradient (a zero-filled view of its input's gradient), an indexed
axis dropped (x[:, 0]) and broadcast_to's gradient (a reduce_to over the batch).
Prints PASS/FAIL lines; exits 1 on a failure, 77 (skip) when TALLY has no `run` command.
Usage: /usr/bin/python3 check_slices.py TALLY
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import safetensors as st  # noqa: E402

RTOL = 1e-5


def reference(params, x):
    """The loss of slices.tally, its gradients by autograd in float64."""
    p = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in params.items()}
    xb = torch.tensor(x, dtype=torch.float64)
    batch, d = x.shape[0], x.shape[2]
    h = torch.cat([p["cls"].expand(batch, 1, d), xb @ p["w"]], dim=1)
    y = h[:, 0] @ p["head"]
    r = h[:, 1:]
    loss = (y * y).mean() + (r * r).mean()
    loss.backward()
    return {k: v.grad.numpy() for k, v in p.items()}


def main():
    tally = sys.argv[1]
    helptext = subprocess.run([tally, "--help"], capture_output=True, text=True).stdout
    if " run " not in helptext:
        print("SKIP: tally run not available")
        return 77
    rng = np.random.default_rng(11)
    params = {"w": rng.standard_normal((8, 8)), "cls": rng.standard_normal((1, 1, 8)),
              "head": rng.standard_normal((8, 4))}
    params = {k: v.astype(np.float32) for k, v in params.items()}
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    failed = 0
    with tempfile.TemporaryDirectory() as work:
        init, data, grads = (os.path.join(work, n + ".safetensors") for n in ("init", "data", "grads"))
        st.save(init, params)
        st.save(data, {"x": x})
        cmd = [tally, "run", os.path.join(HERE, "slices.tally"), "--steps", "1", "--warmup", "0",
               "--threads", "1", "--init", init, "--data", data, "--dump-grads", grads]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print("FAIL run: exit %d: %s" % (r.returncode, r.stderr[-2000:]))
            return 1
        got = st.load(grads)
        got = got[0] if isinstance(got, tuple) else got
        want = reference(params, x)
        for name, ref in want.items():
            err = float(np.abs(np.asarray(got[name], dtype=np.float64) - ref).max())
            scale = float(np.abs(ref).max())
            ok = err <= RTOL * max(scale, 1e-30)
            failed += not ok
            print("%s %s: max |tally - torch| = %.3g, largest |grad| %.3g" %
                  ("PASS" if ok else "FAIL", name, err, scale), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
