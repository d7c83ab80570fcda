#!/usr/bin/python3
"""check_e2e.py — tally's CPU training step end to end against PyTorch (issue 7, its checks).

For each model of this folder (mlp.tally, gpt.tally with plans gpt and gpt_unfused (materialised
attention), llama.tally, gemma.tally with plans gemma and gemma_unfused (sliding window,
soft-capping, gelu_tanh; issue 44); the same models in torch in
models.py) it writes initial weights and one batch (safetensors), computes the step's loss and
every gradient with torch in float64, runs
    TALLY run FILE --plan P --backend cpu --steps 1 --warmup 0 --format json
              --init W --data D --dump-grads G --save S --seed 1
and compares:
  - the loss, relative 1e-5 (fp32 vs fp64: torch's own fp32 loss is within 6e-8);
  - every gradient, |tally − torch| ≤ 1e-5·|torch| + 1e-5·max|torch of that tensor|. The floor is
    the fp32 cancellation: an element near zero is a sum of terms of the tensor's scale, so its
    absolute error follows the scale, not the element (torch fp32 vs fp64 on these models needs a
    floor of at most 4.4e-7 × scale; the mathematically zero key-bias gradient of GPT's qkv is
    pure rounding noise);
  - the names: the dump and the save hold exactly the model's parameters, with their shapes;
  - the weights after the step against torch.optim.AdamW (float64, the plan's hyper-parameters):
    (a) applied to tally's own dumped gradients, 1e-5·|p| + 1e-7: the optimizer itself;
    (b) applied to torch's gradients, with the bound widened by the first AdamW step's
        sensitivity to the gradient error allowed above: the update is lr·g/(|g| + eps), whose
        slope is lr·eps/(|g| + eps)², so an element whose gradient is within the gradient
        tolerance of 0 may move by up to 2·lr (the count of such elements is printed).
Then, per model: the loss falls on a memorisable batch (the same batch for 20 steps; the last
loss below half the first; and the curve within 1e-4 relative of torch's float64 curve, which
torch's own float32 curve meets within 2e-6), and for the token models the first loss of
tally's default initialisation (no --init) is within 0.1 of ln V.

Prints one line per comparison (PASS/FAIL), then "N passed, M failed"; exits 1 on any failure,
77 with "SKIP: tally run not available" when TALLY --help lists no `run` command.

Usage: /usr/bin/python3 check_e2e.py TALLY [--only mlp,gpt,llama,gpt_unfused,gemma,gemma_unfused]
       [--keep DIR]
       /usr/bin/python3 check_e2e.py --self-test
--self-test runs the checks against fake_tally.py (torch in float32 standing in for tally): they
must all pass; with one gradient, one saved weight or the loss corrupted they must fail on
exactly that; without `run` in --help they must skip.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import models as M  # noqa: E402
import safetensors as st  # noqa: E402

SKIP = 77
LOSS_RTOL = 1e-5
GRAD_RTOL, GRAD_FLOOR = 1e-5, 1e-5          # floor: × max |gradient| of the tensor
OPT_RTOL, OPT_ATOL = 1e-5, 1e-7
CURVE_RTOL = 1e-4
MEMORISE_STEPS, MEMORISE_RATIO = 20, 0.5
LNV_TOL = 0.1
RUN_TIMEOUT_S = 1800                         # the first run compiles the generated step
PAD_MODELS = {"gpt": "wte.weight"}          # --pad-head = unpadded (vocabulary 100 → 128): the head's weight
PAD_STEPS, PAD_RTOL = 3, 1e-6


class Results:
    """Collects PASS/FAIL lines."""

    def __init__(self, out=sys.stdout):
        self.passed, self.failed, self.fail_names, self.out = 0, 0, [], out

    def add(self, name, ok, detail):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            self.fail_names.append(name)
        print("%s %s: %s" % ("PASS" if ok else "FAIL", name, detail), file=self.out, flush=True)


def tally_has_run(tally, env=None):
    """True when `TALLY --help` lists a `run` command."""
    try:
        p = subprocess.run(tally + ["--help"], capture_output=True, text=True, timeout=60,
                           env=env)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return re.search(r"^\s*(tally\s+)?run\s", p.stdout + p.stderr, re.M) is not None


def run_tally(tally, spec, args, env=None):
    """Runs TALLY run on spec's file and plan; returns (json, None) or (None, why)."""
    cmd = tally + ["run", spec.file, "--plan", spec.plan, "--backend", "cpu",
                   "--format", "json"] + args
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return None, "timed out after %d s: %s" % (RUN_TIMEOUT_S, " ".join(cmd))
    except OSError as e:
        return None, "cannot start %s: %s" % (cmd[0], e)
    if p.returncode != 0:
        tail = (p.stdout + p.stderr)[-2000:]
        return None, "exit %d: %s\n%s" % (p.returncode, " ".join(cmd), tail)
    return parse_report(p.stdout)


def parse_report(text):
    """The JSON object on stdout: the whole text, or else the last line-initial '{' to the end
    (in case build messages precede it). Returns (json, None) or (None, why)."""
    starts = [0] + [i + 1 for i in range(len(text) - 1)
                    if text[i] == "\n" and text[i + 1] == "{"]
    for start in reversed(starts):
        try:
            report = json.loads(text[start:])
        except ValueError:
            continue
        if isinstance(report, dict):
            return report, None
    return None, "stdout is not a JSON object: %r" % text[-500:]


def losses_of(report, want, name, res):
    """The 'loss' list of a run's JSON, checked to have `want` finite entries."""
    loss = report.get("loss") if isinstance(report, dict) else None
    ok = (isinstance(loss, list) and len(loss) == want and
          all(isinstance(x, (int, float)) and math.isfinite(x) for x in loss))
    if not ok:
        res.add(name + " loss list", False, "want %d finite numbers, got %r" % (want, loss))
        return None
    return [float(x) for x in loss]


def compare(res, name, got, want, bound):
    """PASS when every |got − want| ≤ bound (arrays of one shape); reports the worst element."""
    if got is None:
        res.add(name, False, "missing")
        return
    if tuple(got.shape) != tuple(want.shape):
        res.add(name, False, "shape %s, want %s" % (list(got.shape), list(want.shape)))
        return
    err = np.abs(got.astype(np.float64) - want)
    ok = bool(np.all(err <= bound)) and bool(np.all(np.isfinite(got)))
    ratio = err / np.maximum(bound, 1e-300)
    i = int(np.argmax(ratio)) if ratio.size else 0
    detail = ("max|err| %.3g, worst element %d: err %.3g of bound %.3g (%.2f of the bound)"
              % (err.max() if err.size else 0.0, i, err.flat[i] if err.size else 0.0,
                 bound.flat[i] if err.size else 0.0, ratio.flat[i] if err.size else 0.0))
    res.add(name, ok, detail)


def check_names(res, what, tensors, spec):
    want = {n: tuple(s) for n, s, _ in spec.params}
    got = {n: tuple(a.shape) for n, a in tensors.items()}
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    wrong = sorted(n for n in set(want) & set(got) if want[n] != got[n])
    ok = not (missing or extra or wrong)
    res.add("%s %s names" % (spec.key, what), ok,
            "%d parameters" % len(want) if ok else
            "missing %s; unexpected %s; wrong shapes %s" % (missing, extra, wrong))


def check_model(tally, spec, index, work, res, env=None):
    plan = M.read_plan(spec)
    rng = np.random.default_rng(20261201 + index)
    weights = spec.check_init(rng)
    batch = spec.draw_batch(rng, plan["batch"])
    init_path = os.path.join(work, spec.key + ".init.safetensors")
    data_path = os.path.join(work, spec.key + ".data.safetensors")
    grads_path = os.path.join(work, spec.key + ".grads.safetensors")
    save_path = os.path.join(work, spec.key + ".save.safetensors")
    st.save(init_path, weights)
    st.save(data_path, batch)

    # torch, float64: the step's loss and gradients, and the weights after torch's AdamW step.
    ref_loss, ref_grads, _ = M.step_loss_and_grads(spec, plan, weights, batch)
    ref_grads = {k: v.numpy() for k, v in ref_grads.items()}
    ref_after = {k: v.numpy() for k, v in M.adamw_after(plan, weights, ref_grads).items()}

    report, why = run_tally(tally, spec, ["--steps", "1", "--warmup", "0", "--init", init_path,
                                          "--data", data_path, "--dump-grads", grads_path,
                                          "--save", save_path, "--seed", "1"], env)
    if report is None:
        res.add(spec.key + " one step", False, why)
    else:
        loss = losses_of(report, 1, spec.key + " one step", res)
        if loss is not None:
            rel = abs(loss[0] - ref_loss) / abs(ref_loss)
            res.add(spec.key + " loss", rel <= LOSS_RTOL,
                    "tally %.9g, torch %.9g, relative %.2g (bound %g)"
                    % (loss[0], ref_loss, rel, LOSS_RTOL))
        grads = read_or_fail(res, spec.key + " --dump-grads", grads_path)
        saved = read_or_fail(res, spec.key + " --save", save_path)
        if grads is not None:
            check_names(res, "--dump-grads", grads, spec)
            for name, _, _ in spec.params:
                want = ref_grads[name]
                bound = GRAD_RTOL * np.abs(want) + GRAD_FLOOR * np.abs(want).max()
                compare(res, "%s grad %s" % (spec.key, name), grads.get(name), want, bound)
        if saved is not None:
            check_names(res, "--save", saved, spec)
        if grads is not None and saved is not None and all(n in grads for n, _, _ in spec.params):
            own = M.adamw_after(plan, weights, {k: grads[k] for k, _, _ in spec.params})
            for name, _, _ in spec.params:
                want = own[name].numpy()
                compare(res, "%s AdamW(tally grads) %s" % (spec.key, name), saved.get(name), want,
                        OPT_RTOL * np.abs(want) + OPT_ATOL)
        if saved is not None:
            for name, _, _ in spec.params:
                want, g = ref_after[name], np.abs(ref_grads[name])
                delta = GRAD_RTOL * g + GRAD_FLOOR * g.max()
                lr, eps = plan["lr"], plan["eps"]
                slack = np.minimum(2 * lr, lr * eps * delta / (np.maximum(g - delta, 0) + eps) ** 2)
                bound = OPT_RTOL * np.abs(want) + OPT_ATOL + slack
                loose = int(np.sum(slack > 1e-3 * lr))
                compare(res, "%s AdamW(torch grads) %s [%d of %d elements within the gradient "
                        "tolerance of 0]" % (spec.key, name, loose, want.size),
                        saved.get(name), want, bound)

    # A memorisable batch: the same batch for 20 steps; the loss falls, as torch's does.
    repeated = {k: np.concatenate([v] * MEMORISE_STEPS) for k, v in batch.items()}
    rep_path = os.path.join(work, spec.key + ".repeat.safetensors")
    st.save(rep_path, repeated)
    ref_curve, _ = M.train(spec, plan, weights, repeated, MEMORISE_STEPS)
    report, why = run_tally(tally, spec, ["--steps", str(MEMORISE_STEPS), "--warmup", "0",
                                          "--init", init_path, "--data", rep_path, "--seed", "1"],
                            env)
    if report is None:
        res.add(spec.key + " memorise", False, why)
    else:
        curve = losses_of(report, MEMORISE_STEPS, spec.key + " memorise", res)
        if curve is not None:
            res.add(spec.key + " memorise: loss falls", curve[-1] < MEMORISE_RATIO * curve[0],
                    "first %.6g, last %.6g (want < %g × first; torch float64: %.6g → %.6g)"
                    % (curve[0], curve[-1], MEMORISE_RATIO, ref_curve[0], ref_curve[-1]))
            worst = max(abs(a - b) / abs(b) for a, b in zip(curve, ref_curve))
            res.add(spec.key + " memorise: curve", worst <= CURVE_RTOL,
                    "largest relative difference from torch over %d steps %.2g (bound %g)"
                    % (MEMORISE_STEPS, worst, CURVE_RTOL))

    if spec.key in PAD_MODELS:
        check_padded_head(tally, spec, plan, init_path, rep_path, work, res, env)

    # The default initialisation on a V-token vocabulary starts near ln V.
    if spec.vocab:
        report, why = run_tally(tally, spec, ["--steps", "1", "--warmup", "0", "--data", data_path,
                                              "--seed", "1"], env)
        name = spec.key + " default init loss"
        if report is None:
            res.add(name, False, why)
        else:
            loss = losses_of(report, 1, name, res)
            if loss is not None:
                ln_v = math.log(spec.vocab)
                res.add(name, abs(loss[0] - ln_v) <= LNV_TOL,
                        "%.6g vs ln %d = %.6g (bound %g)" % (loss[0], spec.vocab, ln_v, LNV_TOL))


def rel_diff(a, b):
    """max |a − b| over max |b| (arrays of one shape), float64."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return math.inf
    return float(np.max(np.abs(a - b))) / max(1e-30, float(np.max(np.abs(b)))) if b.size else 0.0


def check_padded_head(tally, spec, plan, init_path, data_path, work, res, env=None):
    """--pad-head (issue 38 item 4; passes/HeadPadding.h): the step with its head padded to a
    multiple of 64 rows computes what the unpadded step does. Both run from the same weights and
    data: PAD_STEPS steps, whose losses agree within PAD_RTOL, and one step, whose gradients
    agree within PAD_RTOL (fp32: the padded logits are x·0 = 0 and masked out of the loss, so
    only a matmul kernel summing in another order may differ: the head's input gradient sums
    over V' rows instead of V, in the blocks the BLAS picks for each) and whose updated weights
    agree as the AdamW(torch grads) check bounds them: OPT_RTOL and OPT_ATOL, plus what AdamW's
    first step makes of the two runs' gradient difference (lr·eps·Δg/(|g| − Δg + eps)², at most
    2·lr where that difference decides a near-zero gradient's sign). The weights after more
    steps are not compared: from those elements the runs diverge. The dumps and saves keep the
    real shapes; the padded step allocates the arena its estimate planned; and its params region
    holds exactly the padded rows more, (V' − V)·d fp32 elements (so the padding did happen)."""
    key = spec.key + " padded head"
    runs, first = {}, {}
    for pad in (False, True):
        tag = "pad" if pad else "plain"
        grads = os.path.join(work, "%s.%s.grads.safetensors" % (spec.key, tag))
        save = os.path.join(work, "%s.%s.save.safetensors" % (spec.key, tag))
        flags = ["--warmup", "0", "--init", init_path, "--data", data_path, "--seed", "1"] + (
            ["--pad-head"] if pad else [])
        report, why = run_tally(tally, spec, ["--steps", str(PAD_STEPS)] + flags, env)
        if report is None:
            res.add("%s run (%s)" % (key, tag), False, why)
            return
        loss = losses_of(report, PAD_STEPS, "%s (%s)" % (key, tag), res)
        one, why = run_tally(tally, spec, ["--steps", "1", "--dump-grads", grads, "--save", save] + flags, env)
        if one is None:
            res.add("%s one step (%s)" % (key, tag), False, why)
            return
        g = read_or_fail(res, "%s --dump-grads (%s)" % (key, tag), grads)
        s = read_or_fail(res, "%s --save (%s)" % (key, tag), save)
        if loss is None or g is None or s is None:
            return
        runs[pad] = (report, loss)
        first[pad] = (g, s)
    (plain, lp), (padded, lq) = runs[False], runs[True]
    (gp, sp), (gq, sq) = first[False], first[True]
    d = max(abs(a - b) / abs(b) for a, b in zip(lq, lp))
    res.add(key + " loss", d <= PAD_RTOL, "padded %s, unpadded %s (relative %.2g, bound %g)" % (lq, lp, d, PAD_RTOL))
    check_names(res, "--dump-grads (padded head)", gq, spec)
    check_names(res, "--save (padded head)", sq, spec)
    worst, where = 0.0, ""
    for name in sorted(gp):
        dn = rel_diff(gq.get(name, np.zeros(0)), gp[name])
        if dn > worst:
            worst, where = dn, name
    res.add(key + " gradients", worst <= PAD_RTOL, "%d tensors, max relative difference %.2g%s (bound %g)"
            % (len(gp), worst, " (" + where + ")" if where else "", PAD_RTOL))
    lr, eps = plan["lr"], plan["eps"]
    for name in sorted(sp):
        want, g = np.asarray(sp[name], np.float64), np.abs(np.asarray(gp[name], np.float64))
        delta = np.abs(np.asarray(gq.get(name, np.zeros(0)), np.float64) - np.asarray(gp[name], np.float64))
        slack = np.minimum(2 * lr, lr * eps * delta / (np.maximum(g - delta, 0) + eps) ** 2)
        loose = int(np.sum(slack > 1e-3 * lr))
        compare(res, "%s weights after one step %s [%d of %d elements within the runs' gradient difference "
                "of 0]" % (key, name, loose, want.size), sq.get(name), want,
                OPT_RTOL * np.abs(want) + OPT_ATOL + slack)
    est, meas = padded.get("estimated", {}), padded.get("measured", {})
    res.add(key + " arena", meas.get("arena_bytes") == est.get("arena_bytes") is not None,
            "allocated %s B, estimate %s B" % (meas.get("arena_bytes"), est.get("arena_bytes")))
    rows = {n: s for n, s, _ in spec.params}[PAD_MODELS[spec.key]]
    extra = (-spec.vocab % 64) * rows[1] * 4
    grown = est.get("regions", {}).get("params", 0) - plain.get("estimated", {}).get("regions", {}).get("params", 0)
    res.add(key + " padded rows", extra > 0 and grown == extra,
            "params region %+d B, want (%d - %d)·%d·4 = %d B" % (grown, spec.vocab + (-spec.vocab % 64), spec.vocab,
                                                                 rows[1], extra))


def read_or_fail(res, what, path):
    try:
        return st.load(path)
    except (OSError, st.SafetensorsError) as e:
        res.add(what, False, "cannot read %s: %s" % (path, e))
        return None


def run_checks(tally, only, keep, env=None, out=sys.stdout):
    """All checks; returns (exit code, Results)."""
    res = Results(out)
    if not tally_has_run(tally, env):
        print("SKIP: tally run not available", file=out)
        return SKIP, res
    torch.set_num_threads(1)
    specs = [m for m in M.MODELS if not only or m.key in only]
    with tempfile.TemporaryDirectory(prefix="tally-e2e-") as tmp:
        work = keep or tmp
        os.makedirs(work, exist_ok=True)
        for i, spec in enumerate(M.MODELS):
            if spec in specs:
                check_model(tally, spec, i, work, res, env)
    print("%d passed, %d failed" % (res.passed, res.failed), file=out)
    return (1 if res.failed else 0), res


def self_test():
    """The checks against fake_tally.py: clean must pass, each corruption must fail on exactly
    the comparisons it touches, a binary without `run` must skip."""
    fake = [sys.executable, os.path.join(HERE, "fake_tally.py")]
    failures = []

    def expect(label, cond):
        print("SELF-TEST %s: %s" % ("PASS" if cond else "FAIL", label), flush=True)
        if not cond:
            failures.append(label)

    def env_with(**kv):
        e = dict(os.environ)
        e.pop("TALLY_FAKE_PERTURB", None)
        e.pop("TALLY_FAKE_NO_RUN", None)
        e.update(kv)
        return e

    cases = [
        ("grad:h.0.attn.qkv.weight", "gpt grad h.0.attn.qkv.weight", ["gpt AdamW"]),
        ("save:layer.attn.k.weight", "llama AdamW(tally grads) layer.attn.k.weight",
         ["llama AdamW(torch grads) layer.attn.k.weight"]),
        ("loss", "mlp loss", ["mlp memorise: curve"]),
    ]
    # The clean run covers the models the corruptions touch (the others' checks run against the
    # real tally in e2e-torch): 12 s of torch instead of 23 for every model.
    corrupted = sorted({must.split()[0] for _, must, _ in cases})
    print("== clean run (%s): every check must pass" % ", ".join(corrupted))
    code, res = run_checks(fake, corrupted, None, env_with())
    expect("clean run passes every check (%d passed, %d failed)" % (res.passed, res.failed),
           code == 0 and res.failed == 0 and res.passed > 0)

    for perturb, must, may in cases:
        key = must.split()[0]
        print("== corrupted (%s): must fail on %s" % (perturb, must))
        code, res = run_checks(fake, [key], None, env_with(TALLY_FAKE_PERTURB=perturb))
        unexpected = [n for n in res.fail_names
                      if n != must and not any(n.startswith(p) for p in may)]
        expect("%s fails '%s' and nothing unrelated (failed: %s)" % (perturb, must, res.fail_names),
               code == 1 and must in res.fail_names and not unexpected)

    print("== no run command: must skip")
    code, _ = run_checks(fake, None, None, env_with(TALLY_FAKE_NO_RUN="1"))
    expect("exit %d on a binary without run (want %d)" % (code, SKIP), code == SKIP)
    # The skip detection must also see the real subcommand list format.
    print("%d self-test failures" % len(failures))
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tally", nargs="?", help="the tally binary")
    ap.add_argument("--only", help="comma-separated models: " + ", ".join(M.BY_KEY))
    ap.add_argument("--keep", help="write the safetensors files here and keep them")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    if not a.tally:
        ap.error("TALLY is required (or --self-test)")
    only = a.only.split(",") if a.only else None
    if only and any(k not in M.BY_KEY for k in only):
        ap.error("--only takes %s" % ", ".join(M.BY_KEY))
    code, _ = run_checks([os.path.abspath(a.tally)], only, a.keep)
    return code


if __name__ == "__main__":
    sys.exit(main())
