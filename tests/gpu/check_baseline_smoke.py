#!/usr/bin/env python3
"""ctest gpu-torch-baseline-smoke: runs scripts/gpu_torch_baseline.py --smoke (a 2-layer d=64
GPT on the CPU) and checks its JSON against numbers derived by hand:
  params = wte 256·64 + wpe 64·64 + 2 layers · (12·64² + 13·64) + final norm 2·64 = 120576;
  the first loss of a freshly initialised model (weights N(0, 0.02)) is close to ln(256) = 5.545;
  FLOPs per step = 6·N·T + 12·L·d·S·T with T = 2·64 tokens: 6·120576·128 + 12·2·64·64·128
  = 92,602,368 + 12,582,912 = 105,185,280;
  the timed step and tokens/s are positive and consistent (tokens/s = 128 / step seconds).
Usage: check_baseline_smoke.py PYTHON SCRIPT OUT_JSON"""
import json
import math
import subprocess
import sys

python, script, out = sys.argv[1:4]
rc = subprocess.call([python, script, "--smoke", "--json", out])
if rc != 0:
    sys.exit("gpu_torch_baseline.py --smoke exited with %d" % rc)
r = json.load(open(out))["results"]
assert len(r) == 1 and r[0]["ok"], r
r = r[0]
assert r["params"] == 120576, r["params"]
assert abs(r["loss_first"] - math.log(256)) < 0.1, r["loss_first"]
assert r["flops_per_step"] == 105185280, r["flops_per_step"]
assert r["step_ms_median"] > 0 and len(r["step_ms_all"]) == 2
assert abs(r["tokens_per_s"] - 128 / (r["step_ms_median"] / 1e3)) < 1e-6 * r["tokens_per_s"]
print("smoke baseline ok: %d params, first loss %.3f, step %.1f ms" % (r["params"], r["loss_first"], r["step_ms_median"]))
