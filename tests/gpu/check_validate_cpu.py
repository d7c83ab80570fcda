#!/usr/bin/env python3
"""ctest gpu-validate-degrades: scripts/gpu-validate on a machine without a GPU, limited to the
parts that start quickly (tally's estimates, tally run, PyTorch eager). The GPU parts must fail or
be skipped with a reason while the script goes on, exits 0 and prints its table last: two models
× three engines, the estimated step time equal to the estimate JSON's time.step_s in ms.
Usage: check_validate_cpu.py SOURCE_DIR TALLY PYTHON OUT_DIR"""
import json
import os
import shutil
import subprocess
import sys

src, tally, python, out = sys.argv[1:5]
shutil.rmtree(out, ignore_errors=True)
env = dict(os.environ, OUT=out, TALLY=tally, PYTHON=python, GPU_VALIDATE_PARTS="estimates,tally-run,torch-eager",
           GPU_VALIDATE_BUDGET="200", PATH="/usr/bin:/bin")
p = subprocess.run(["bash", os.path.join(src, "scripts/gpu-validate")], env=env, capture_output=True, text=True)
print(p.stdout)
assert p.returncode == 0, (p.returncode, p.stderr)
lines = [l for l in p.stdout.splitlines() if l.strip()]
# The table is last: a header, a rule, six rows, then only the script's closing log line.
assert lines[-1].startswith("[gpu-validate") and "done in" in lines[-1], lines[-1]
rows = lines[-7:-1]
assert lines[-9].split()[:2] == ["model", "engine"], lines[-9]
assert [r.split()[:2] for r in rows] == [[m, e] for m in ("gpt2-124m", "gpt2-350m")
                                         for e in ("pytorch-eager", "pytorch-compile", "tally-cuda")], rows
res = json.load(open(os.path.join(out, "results.json")))
parts = {s["part"]: s["status"] for s in res["parts"]}
assert parts["estimate/gpt2_124m_1gpu"] == "ok" and parts["estimate/gpt2_350m_1gpu"] == "ok", parts
assert parts["estimate-cuda/gpt2_124m_1gpu"] == "ok" and parts["estimate-cuda/gpt2_350m_1gpu"] == "ok", parts
for m, plan in (("gpt2-124m", "gpt2_124m_1gpu"), ("gpt2-350m", "gpt2_350m_1gpu")):
    est = json.load(open(os.path.join(out, "estimate_%s.json" % plan)))
    # tally's CUDA step against its own estimate (fused, its workspace, no allocator reserve).
    est_cuda = json.load(open(os.path.join(out, "estimate_cuda_%s.json" % plan)))
    assert est_cuda["fusion"]["enabled"] and est_cuda["memory"]["per_device"]["library_workspace"] > 0, est_cuda
    for r in res["steps"]:
        if r["model"] == m:
            e = est_cuda if r["engine"] == "tally-cuda" else est
            assert abs(r["estimated_step_ms"] - 1e3 * e["time"]["step_s"]) < 1e-9, r
            assert abs(r["peak_gib_estimated"] - e["memory"]["per_device"]["peak"] / 2**30) < 1e-12, r
# Without a GPU the PyTorch runs fail (no CUDA device) and are reported, not fatal.
has_gpu = subprocess.run([python, "-c", "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"]).returncode == 0
if not has_gpu:
    assert parts["torch/gpt2-124m/eager"] == "fail" and parts["torch/gpt2-350m/eager"] == "fail", parts
    assert all(r["measured_step_ms"] is None for r in res["steps"])
# Part (d)'s comparison (tests/gpu/compare_losses.py) on reports written here: within rtol agrees
# (exit 0), a step past it disagrees (1), a report without losses or of another length is an
# error or a disagreement, never a pass.
def compare(cpu, cuda, rtol):
    paths = []
    for i, rep in enumerate((cpu, cuda)):
        paths.append(os.path.join(out, "loss_case_%d.json" % i))
        with open(paths[-1], "w") as f:
            json.dump(rep, f)
    verdict = os.path.join(out, "loss_case.json")
    rc = subprocess.run([python, os.path.join(src, "tests/gpu/compare_losses.py"), paths[0], paths[1], "--rtol", str(rtol),
                         "--json", verdict], capture_output=True, text=True).returncode
    return rc, (json.load(open(verdict)) if rc in (0, 1) else None)
rc, v = compare({"loss": [10.5, 10.1, 9.8]}, {"loss": [10.6, 10.15, 9.7]}, 2e-2)
assert rc == 0 and v["agree"] and abs(v["max_rel"] - 0.1 / 9.8) < 1e-12, (rc, v)
rc, v = compare({"loss": [10.5, 10.1, 9.8]}, {"loss": [10.5, 10.1, 9.8 * (1 + 2e-4)]}, 1e-4)
assert rc == 1 and not v["agree"], (rc, v)
assert compare({"loss": [10.5, 10.1]}, {"loss": [10.5]}, 1e-4)[0] == 1
assert compare({"loss": [10.5]}, {"backend": "cuda"}, 1e-4)[0] == 2
print("gpu-validate degrades as it should: %d parts reported, table last; compare_losses agrees, "
      "disagrees and refuses as it should" % len(parts))
