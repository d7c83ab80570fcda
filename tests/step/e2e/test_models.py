#!/usr/bin/python3
"""test_models.py — the torch models of models.py declare what the .tally files declare.

For mlp.tally, gpt.tally and llama.tally: `TALLY report FILE --plan P --emit=ir` lists every
parameter (`param %N h[0].attn.qkv.weight: f32[64, 192]`) and input; the test compares them
with models.py's parameter names (`[i]` written `.i`), shapes and inputs, so that check_e2e.py
feeds tally the tensors it expects. Also: models.py's rope, grouped-query causal attention and
next-token loss against docs/runtime.md's formulas written out in numpy; what the plans say for
the torch side (read_plan); the torch default init starts within 0.1 of ln V.
Usage: /usr/bin/python3 test_models.py TALLY
"""
import math
import os
import re
import subprocess
import sys
import unittest

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models as M  # noqa: E402

TALLY = None


def ir_of(spec):
    p = subprocess.run([TALLY, "report", spec.file, "--plan", spec.plan, "--emit=ir"],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise AssertionError("tally report failed:\n" + p.stdout + p.stderr)
    params, inputs = {}, {}
    for line in p.stdout.splitlines():
        m = re.match(r"\s*param %\d+ (\S+): (\w+)\[([^\]]*)\]", line)
        if m:
            name = re.sub(r"\[(\d+)\]", r".\1", m.group(1))
            params[name] = (m.group(2), tuple(int(d) for d in m.group(3).split(",")))
        m = re.match(r"\s*input %\d+ (\w+): (\w+)\[([^\]]*)\]", line)
        if m:
            inputs[m.group(1)] = (m.group(2), [d.strip() for d in m.group(3).split(",")])
    return params, inputs


class Formulas(unittest.TestCase):
    """models.py's rope, attention and next-token loss against docs/runtime.md's formulas written
    out element by element in numpy float64."""

    def test_rope(self):
        rng = np.random.default_rng(3)
        B, S, H, hd = 2, 5, 2, 8
        x = rng.standard_normal((B, S, H * hd))
        got = M.rope(torch.from_numpy(x), H).numpy()
        want = np.empty_like(x)
        for b in range(B):
            for p in range(S):
                for h in range(H):
                    for i in range(hd // 2):
                        a = p * 10000.0 ** (-2 * i / hd)
                        x1, x2 = x[b, p, h * hd + i], x[b, p, h * hd + i + hd // 2]
                        want[b, p, h * hd + i] = x1 * math.cos(a) - x2 * math.sin(a)
                        want[b, p, h * hd + i + hd // 2] = x2 * math.cos(a) + x1 * math.sin(a)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)

    def test_grouped_query_causal_attention(self):
        rng = np.random.default_rng(4)
        B, S, H, Hkv, hd = 2, 6, 4, 2, 3
        q = rng.standard_normal((B, S, H * hd))
        k = rng.standard_normal((B, S, Hkv * hd))
        v = rng.standard_normal((B, S, Hkv * hd))
        got = M.attention(*(torch.from_numpy(t) for t in (q, k, v)), H, Hkv, True).numpy()
        want = np.zeros_like(q)
        for b in range(B):
            for h in range(H):
                g = h // (H // Hkv)
                qs, ks = slice(h * hd, (h + 1) * hd), slice(g * hd, (g + 1) * hd)
                for i in range(S):
                    s = np.array([q[b, i, qs] @ k[b, j, ks] / math.sqrt(hd) for j in range(i + 1)])
                    p = np.exp(s - s.max())
                    p /= p.sum()
                    want[b, i, qs] = sum(p[j] * v[b, j, ks] for j in range(i + 1))
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)

    def test_next_token_loss(self):
        rng = np.random.default_rng(5)
        B, S, V = 2, 4, 7
        logits = rng.standard_normal((B, S, V))
        tokens = rng.integers(0, V, size=(B, S)).astype(np.int32)
        got = M.next_token_loss(torch.from_numpy(logits), torch.from_numpy(tokens)).item()
        terms = [np.log(np.exp(logits[b, i]).sum()) - logits[b, i, tokens[b, i + 1]]
                 for b in range(B) for i in range(S - 1)]      # the last position has no label
        self.assertAlmostEqual(got, sum(terms) / len(terms), places=12)


class Models(unittest.TestCase):
    def test_parameters_match_the_ir(self):
        for spec in M.MODELS:
            params, _ = ir_of(spec)
            want = {n: ("f32", tuple(s)) for n, s, _ in spec.params}
            self.assertEqual(params, want, spec.key)

    def test_inputs_match_the_ir(self):
        for spec in M.MODELS:
            _, inputs = ir_of(spec)
            want = {n: ({"F32": "f32", "I32": "i32"}[dt], ["batch"] + [
                "seq" if spec.seq and d == spec.seq else str(d) for d in shape])
                for n, dt, shape in spec.inputs}
            self.assertEqual(inputs, want, spec.key)

    def test_plans(self):
        self.assertEqual(M.read_plan(M.BY_KEY["gpt"]),
                         {"batch": 4, "micro_batch": 2, "lr": 3e-3, "betas": (0.9, 0.95),
                          "eps": 1e-8, "weight_decay": 0.1})
        self.assertEqual(M.read_plan(M.BY_KEY["mlp"])["micro_batch"], 4)
        self.assertEqual(M.read_plan(M.BY_KEY["llama"])["micro_batch"], 4)

    def test_torch_default_init_starts_near_ln_v(self):
        torch.set_num_threads(1)
        for spec in M.MODELS:
            if not spec.vocab:
                continue
            plan = M.read_plan(spec)
            w = spec.default_init(torch.Generator().manual_seed(1))
            batch = spec.draw_batch(np.random.default_rng(1), plan["batch"])
            loss, _, _ = M.step_loss_and_grads(spec, plan, w, batch)
            self.assertLess(abs(loss - math.log(spec.vocab)), 0.1, spec.key)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print("usage: test_models.py TALLY", file=sys.stderr)
        sys.exit(2)
    TALLY = sys.argv.pop(1)
    unittest.main()
