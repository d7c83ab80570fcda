#!/usr/bin/python3
"""check_fusion.py — the fused elementwise kernels of the generated step (issue 8, the fusion pass).

`--fuse` makes the step run each run of consecutive elementwise ops as one generated kernel
(passes/Fusion.cpp; codegen/EmitFused.cpp `fused`): the CUDA backend's default, and the same code
on the CPU, which is how it is checked without a GPU. For every configuration below it runs

    TALLY run FILE [--plan P] [--checkpoint C] [--precision X] --steps 3 --warmup 0
              --format json --seed 7 --dump-grads G --fuse=false   (and again with --fuse)

and checks:
  - the fused step computes what the unfused one does: in fp32 the loss of every step and
    every gradient of the last step within 1e-6 relative (a fused kernel rounds each value to
    its storage type before the next op reads it, as the separate kernels do through memory;
    a matmul's bias epilogue adds the bias in fp32 as the separate add does; the bound only
    leaves room for the compiler contracting a multiply-add differently). In bf16 the bias
    epilogue rounds the matmul's output once where the matmul and the add rounded twice (the
    first step is still identical: the biases start at zero), so after three steps the weights
    differ by those roundings: the loss within 1e-3 relative and each gradient within 2^-5 of
    its tensor's largest element (measured 2026-12-01: 8e-5 and 1.2%);
  - the configuration was fused at all: `tally build --fuse` prints at least one fused call
    (rt::fused, a norm's rt::layer_norm_fwd_fused with the run as its prologue, or
    rt::matmul_bias) (a test of nothing would pass the first check too), and `tally report --fuse
    --format json` counts the same number of fused kernels (fusion.kernels) as the step has
    calls, with fewer bytes moved;
  - the fused step allocates the arena the estimate planned (fusion changes no buffer);
  - the estimate prices it: the fused plan's estimated step time is below the unfused one.
Prints PASS/FAIL lines and "N passed, M failed"; exits 1 on a failure, 77 (skip) when TALLY
has no `run` command.
Usage: /usr/bin/python3 check_fusion.py TALLY [--only NAME,NAME]
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_e2e as E  # noqa: E402
import safetensors as st  # noqa: E402

RTOL = 1e-6

# (name, file, extra arguments): MLP (bias add + relu), GPT (bias + gelu, bias + residual + the
# next layer norm),
# GPT with materialised attention, Llama (residual add + RMS norm; the mul backward's two
# products side by side), checkpointing that recomputes fused runs (full, selective_wide:
# the norms and GELU alone; without recomputation the MLP, GPT and Llama cases cover the fused
# runs), and 16-bit storage (values rounded to bf16 between fused ops).
CONFIGS = [
    ("mlp", "mlp.tally", []),
    ("gpt", "gpt.tally", ["--plan", "gpt"]),
    ("gpt_unfused", "gpt.tally", ["--plan", "gpt_unfused"]),
    ("llama", "llama.tally", []),
    ("ckpt full", "ckpt.tally", ["--checkpoint", "full"]),
    ("ckpt selective_wide", "ckpt.tally", ["--checkpoint", "selective_wide"]),
    ("gpt bf16", "gpt.tally", ["--plan", "gpt", "--precision", "bf16"]),
    ("gpt mixed_bf16", "gpt.tally", ["--plan", "gpt", "--precision", "mixed_bf16"]),
]
SIXTEEN = {"gpt bf16", "gpt mixed_bf16"}  # compared at bf16's tolerance (the epilogue's one rounding)


def rel_diff(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = max(1e-30, float(np.max(np.abs(b))) if b.size else 1.0)
    return float(np.max(np.abs(a - b))) / scale if a.size else 0.0


def main():
    tally = sys.argv[1]
    only = sys.argv[3].split(",") if len(sys.argv) > 3 and sys.argv[2] == "--only" else None
    if not E.tally_has_run([tally]):
        print("SKIP: tally run not available")
        return E.SKIP
    res = E.Results()
    result = res.add
    with tempfile.TemporaryDirectory() as work:
        for name, model, extra in CONFIGS:
            if only and name not in only:
                continue
            path = os.path.join(HERE, model)
            runs = {}
            for fuse in ("false", "true"):
                grads = os.path.join(work, "g-%s-%s.safetensors" % (re.sub(r"\W", "_", name), fuse))
                cmd = [tally, "run", path, "--steps", "3", "--warmup", "0", "--format", "json", "--seed", "7",
                       "--dump-grads", grads, "--fuse=" + fuse] + extra
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    result("%s run --fuse=%s" % (name, fuse), False, "exit %d: %s" % (r.returncode, r.stderr[-2000:]))
                    break
                runs[fuse] = (json.loads(r.stdout[r.stdout.index("{"):]), st.load(grads))
            if len(runs) < 2:
                continue
            (plain, gplain), (fused, gfused) = runs["false"], runs["true"]

            loss_tol, grad_tol = (1e-3, 2.0 ** -5) if name in SIXTEEN else (RTOL, RTOL)
            d = rel_diff(fused["loss"], plain["loss"])
            result(name + " loss", d <= loss_tol and len(fused["loss"]) == 3,
                   "fused %s, unfused %s (max relative difference %.2g)" % (fused["loss"], plain["loss"], d))
            worst, where = 0.0, ""
            same_names = sorted(gfused) == sorted(gplain)
            for k in sorted(gplain):
                if k in gfused:
                    dk = rel_diff(gfused[k], gplain[k])
                    if dk > worst:
                        worst, where = dk, k
            result(name + " gradients", same_names and worst <= grad_tol,
                   "%d tensors, max relative difference %.2g%s" % (len(gplain), worst, " (" + where + ")" if where else ""))

            arena = (fused["measured"]["arena_bytes"], fused["estimated"]["arena_bytes"])
            result(name + " arena", arena[0] == arena[1] and arena[1] == plain["estimated"]["arena_bytes"],
                   "fused step allocated %d B, estimate %d B, unfused estimate %d B"
                   % (arena[0], arena[1], plain["estimated"]["arena_bytes"]))

            out = os.path.join(work, "build-" + re.sub(r"\W", "_", name))
            b = subprocess.run([tally, "build", path, "--fuse", "-o", out] + extra, capture_output=True,
                               text=True)
            calls = 0
            if b.returncode == 0:
                with open(os.path.join(out, "step.cpp")) as f:
                    calls = len(re.findall(r"^\s*rt::(fused\(|\w+_fused<|matmul_bias<)", f.read(), re.M))
            rep = subprocess.run([tally, "report", path, "--fuse", "--format", "json"] + extra, capture_output=True,
                                 text=True)
            fusion = json.loads(rep.stdout).get("fusion", {}) if rep.returncode in (0, 1) and rep.stdout else {}
            # The step's micro-batch runs every fused kernel once; recompute repeats some.
            kernels = fusion.get("kernels", -1)
            result(name + " fused at all", calls >= 1 and kernels == calls and fusion.get("bytes_saved", 0) > 0,
                   "%d rt::fused calls in step.cpp; the report counts %s fused kernels saving %s bytes"
                   % (calls, kernels, fusion.get("bytes_saved")))

            est = (fused["estimated"]["step_s"], plain["estimated"]["step_s"])
            result(name + " priced", est[0] < est[1],
                   "estimated step %.6g s fused, %.6g s unfused" % est)
    print("%d passed, %d failed" % (res.passed, res.failed))
    return 1 if res.failed else 0


if __name__ == "__main__":
    sys.exit(main())
