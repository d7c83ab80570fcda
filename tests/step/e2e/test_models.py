#!/usr/bin/python3
"""test_models.py — the torch models of models.py declare what the .tally files declare.

For mlp.tally, gpt.tally and llama.tally: `TALLY report FILE --plan P --emit=ir` lists every
parameter (`param %N h[0].attn.qkv.weight: f32[64, 192]`) and input; the test compares them
with models.py's parameter names (`[i]` written `.i`), shapes and inputs, so that check_e2e.py
feeds tally the tensors it expects. Also pins what the plans must say for the torch side
(read_plan) and that the torch default init starts within 0.1 of ln V.
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
