#!/usr/bin/python3
"""check_precision.py — 16-bit parameters without an fp32 master copy in the CPU step (issue 7).

`precision = bf16` keeps the weights themselves in bf16 (no master copy; optimizer state fp32):
the CPU optimizers widen each weight to fp32, apply the same fp32 update as for an fp32 weight
and round it back to nearest even once. On gpt.tally (plan gpt, AdamW) with
    TALLY run gpt.tally --plan gpt --precision bf16 --steps 1 --warmup 0 --init W --data D
              --dump-grads G --save S --seed 1 --format json
it checks:
  - the saved weights are bf16 values (their low 16 bits are zero) and equal, within one bf16
    unit in the last place, AdamW (numpy float32, the runtime's element formula of
    common/tally_optim.h) applied to the bf16-rounded initial weights with tally's own dumped
    gradients, rounded to bf16: the update itself. Within one ulp rather than bit for bit because
    the compiled step may contract a·b + c into one fused multiply-add, which moves an fp32
    result by an ulp and can flip a bf16 rounding; at least 99% of the elements match exactly;
  - the weights moved: over all tensors, most elements changed (an update lost or not written
    back would leave them unchanged). Not every element: a step below half a bf16 ulp rounds
    back to the old weight, so about half of the norm weights near 1 (ulp 2^-7) stay at
    lr = 3e-3 — pure bf16 training's known limit, which the reference reproduces exactly;
  - the loss is within 2% of torch's float64 loss on the same (bf16-rounded) weights and batch:
    bf16 activations carry 2^-9 relative rounding per op;
  - the loss falls on a memorisable batch over 20 steps (last < half the first).
Prints PASS/FAIL lines and "N passed, M failed"; exits 1 on a failure, 77 when TALLY has no `run`.
Usage: /usr/bin/python3 check_precision.py TALLY
"""
import os
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_e2e as E  # noqa: E402
import models as M  # noqa: E402
import safetensors as st  # noqa: E402

LOSS_RTOL = 2e-2
EXACT_SHARE = 0.99


def bf16(x):
    """float32 values rounded to bf16 (to nearest even), as float32."""
    return st.f32_from_bf16_bits(st.bf16_bits_from_f32(np.asarray(x, dtype=np.float32)))


def bf16_ulp(x):
    """One bf16 unit in the last place at |x| (8 significant bits), as float32."""
    e = np.floor(np.log2(np.maximum(np.abs(x), np.float32(2.0 ** -126))))
    return np.float32(2.0) ** (e - 7)


def adamw_fp32(p, g, plan):
    """One AdamW step from zero state in float32, as rt::adam_element does (step 1)."""
    f = np.float32
    lr, (b1, b2), eps, wd = f(plan["lr"]), plan["betas"], f(plan["eps"]), f(plan["weight_decay"])
    b1, b2 = f(b1), f(b2)
    step_size = f(float(lr) / (1.0 - float(b1)))          # computed in double, stored as float
    bc2_sqrt = f(np.sqrt(1.0 - float(b2)))
    p = p.astype(np.float32) * (f(1) - lr * wd)
    m = (f(1) - b1) * g
    v = (f(1) - b2) * g * g
    return p - step_size * (m / (np.sqrt(v) / bc2_sqrt + eps))


def main():
    tally = [os.path.abspath(sys.argv[1])]
    res = E.Results()
    if not E.tally_has_run(tally):
        print("SKIP: tally run not available")
        return E.SKIP
    torch.set_num_threads(1)
    spec = M.BY_KEY["gpt"]
    plan = M.read_plan(spec)
    rng = np.random.default_rng(20261202)
    weights = {k: bf16(v) for k, v in spec.check_init(rng).items()}   # what bf16 params hold
    batch = spec.draw_batch(rng, plan["batch"])
    flags = ["--precision", "bf16", "--seed", "1", "--warmup", "0"]
    with tempfile.TemporaryDirectory(prefix="tally-precision-") as work:
        paths = {k: os.path.join(work, k + ".safetensors") for k in ("init", "data", "grads", "save", "rep")}
        st.save(paths["init"], weights)
        st.save(paths["data"], batch)
        report, why = E.run_tally(tally, spec, flags + ["--steps", "1", "--init", paths["init"],
                                                        "--data", paths["data"], "--dump-grads",
                                                        paths["grads"], "--save", paths["save"]])
        if report is None:
            res.add("bf16 one step", False, why)
        else:
            ref_loss, _, _ = M.step_loss_and_grads(spec, plan, weights, batch)
            loss = E.losses_of(report, 1, "bf16 one step", res)
            if loss is not None:
                rel = abs(loss[0] - ref_loss) / abs(ref_loss)
                res.add("bf16 loss", rel <= LOSS_RTOL, "tally %.6g, torch float64 %.6g, relative "
                        "%.2g (bound %g)" % (loss[0], ref_loss, rel, LOSS_RTOL))
            grads = E.read_or_fail(res, "bf16 --dump-grads", paths["grads"])
            saved = E.read_or_fail(res, "bf16 --save", paths["save"])
            if grads is not None and saved is not None:
                moved, total = 0, 0
                for name, _, _ in spec.params:
                    got = np.asarray(saved.get(name), dtype=np.float32)
                    want = bf16(adamw_fp32(weights[name], np.asarray(grads[name], np.float32), plan))
                    is16 = bool(np.all(bf16(got) == got))
                    diff = np.abs(got - want)
                    exact = float(np.mean(diff == 0))
                    ok = is16 and bool(np.all(diff <= bf16_ulp(want))) and exact >= EXACT_SHARE
                    moved += int(np.sum(got != weights[name]))
                    total += got.size
                    res.add("bf16 AdamW %s" % name, ok,
                            "bf16 values %s, %.4f of elements exact, max |diff| %.3g"
                            % (is16, exact, float(diff.max())))
                res.add("bf16 weights moved", moved > 0.9 * total,
                        "%d of %d elements changed (want > 90%%)" % (moved, total))
        repeated = {k: np.concatenate([v] * E.MEMORISE_STEPS) for k, v in batch.items()}
        st.save(paths["rep"], repeated)
        report, why = E.run_tally(tally, spec, flags + ["--steps", str(E.MEMORISE_STEPS), "--init",
                                                        paths["init"], "--data", paths["rep"]])
        if report is None:
            res.add("bf16 memorise", False, why)
        else:
            curve = E.losses_of(report, E.MEMORISE_STEPS, "bf16 memorise", res)
            if curve is not None:
                res.add("bf16 memorise: loss falls", curve[-1] < E.MEMORISE_RATIO * curve[0],
                        "first %.6g, last %.6g" % (curve[0], curve[-1]))
    print("%d passed, %d failed" % (res.passed, res.failed))
    return 1 if res.failed else 0


if __name__ == "__main__":
    sys.exit(main())
