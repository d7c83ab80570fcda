#!/usr/bin/env python3
"""ctest gpu-plans: the 1-GPU plans scripts/gpu-validate reads (tests/gpu/*.tally) analyse, and the
JSON keys the script reads exist. Parameter counts derived by hand (tied head, learned positions,
biases everywhere, per layer 12·d² + 13·d):
  124M: 50257·768 + 1024·768 + 12·(12·768² + 13·768) + 2·768 = 124,439,808
  350M: 50257·1024 + 1024·1024 + 24·(12·1024² + 13·1024) + 2·1024 = 354,823,168
  Llama GQA (no biases, untied head, 4 of 16 heads for keys and values, SwiGLU 2816, RMSNorm):
    2·32000·1024 + 8·(2·1024² + 2·1024·256 + 3·1024·2816 + 2·1024) + 1024 = 155,730,944
Tokens per step: micro-batch 16 (Llama 8) × seq 1024 = 16384 (8192).
Usage: check_plans.py TALLY SOURCE_DIR"""
import json
import subprocess
import sys

tally, src = sys.argv[1:3]
expect = {"gpt2_124m_1gpu": (124439808, 16), "gpt2_350m_1gpu": (354823168, 16), "llama_gqa_1gpu": (155730944, 8)}
for plan, (params, micro) in expect.items():
    for target in ("H100_SXM", "H200"):
        out = subprocess.run([tally, "report", "%s/tests/gpu/%s.tally" % (src, plan), "--plan", plan, "--target",
                              target, "--format", "json"], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        d = json.loads(out.stdout)
        assert d["plan"] == plan and d["target"] == target and d["devices"] == 1, (d["plan"], d["target"])
        assert (d["batch"], d["seq"], d["micro_batch"]) == (micro, 1024, micro)
        assert d["precision"]["preset"] == "mixed_bf16"
        assert d["params"]["total"] == params, d["params"]["total"]
        assert d["flops"]["tokens_per_step"] == micro * 1024, d["flops"]["tokens_per_step"]
        # The keys gpu-validate reads: positive estimates.
        assert d["time"]["step_s"] > 0 and d["memory"]["per_device"]["peak"] > 0 and d["flops"]["step"] > 0
        assert 0 < d["time"]["mfu"] < 1
        print("%s on %s: step %.2f ms, peak %.2f GiB, MFU %.1f%%" % (
            plan, target, d["time"]["step_s"] * 1e3, d["memory"]["per_device"]["peak"] / 2**30, 100 * d["time"]["mfu"]))
