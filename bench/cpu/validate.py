#!/usr/bin/python3
"""validate.py — tally's CPU estimates against the generated step's measurements (issue 7).

For each plan of the table below it runs
    TALLY run FILE --plan P [overrides] --steps N+2 --warmup 2 --format json   (N timed)
(the estimate is for the `host` target: this machine as `tally calibrate` measured it) and
prints a Markdown table: estimated and measured step time (the median of the timed steps) and
their error, the arena (estimated = allocated, to the byte), the estimated peak beside the
measured peak resident set. Then the median |error| of the step times.
Usage: /usr/bin/python3 bench/cpu/validate.py TALLY [--steps N] [--threads N]
--steps: timed steps per plan (default 5; more steadies the median on a shared machine).
"""
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
E2E = os.path.join(ROOT, "tests", "step", "e2e")

# (label, file, plan, extra flags)
PLANS = [
    ("MLP 16-64-8, fp32", os.path.join(E2E, "mlp.tally"), "mlp", []),
    ("GPT d=64 L=2, fp32", os.path.join(E2E, "gpt.tally"), "gpt", []),
    ("Llama block d=64 GQA, fp32", os.path.join(E2E, "llama.tally"), "llama", []),
    ("GPT d=256 L=4 s=128, fp32", os.path.join(HERE, "gpt_d256.tally"), "gpt_d256", []),
    ("GPT d=256 L=4, fp32, checkpoint full", os.path.join(HERE, "gpt_d256.tally"), "gpt_d256",
     ["--checkpoint", "full"]),
    ("GPT d=256 L=4, mixed bf16", os.path.join(HERE, "gpt_d256.tally"), "gpt_d256",
     ["--precision", "mixed_bf16"]),
    ("GPT d=256 L=4, mixed bf16, checkpoint sqrt", os.path.join(HERE, "gpt_d256.tally"), "gpt_d256",
     ["--precision", "mixed_bf16", "--checkpoint", "sqrt"]),
    ("GPT d=256 L=4, fp32, data = 2 (MPI)", os.path.join(HERE, "gpt_d256.tally"), "gpt_d256_dp2", []),
    ("GPT d=256 L=4, fp32, data = 2, ZeRO-1", os.path.join(HERE, "gpt_d256.tally"), "gpt_d256_dp2z", []),
]


def human(n):
    for unit in ["B", "KiB", "MiB", "GiB"]:
        if abs(n) < 1024 or unit == "GiB":
            return "%.1f %s" % (n, unit) if unit != "B" else "%d B" % n
        n /= 1024.0


def main():
    tally = sys.argv[1]
    extra = sys.argv[2:]
    steps = "5"
    if "--steps" in extra:
        i = extra.index("--steps")
        steps = extra[i + 1]
        extra = extra[:i] + extra[i + 2:]
    rows, errors, comm = [], [], []
    load = os.getloadavg()[0]
    for label, path, plan, flags in PLANS:
        # --steps counts every step (issue 42): the 2 warm-up steps and `steps` timed ones.
        cmd = [tally, "run", path, "--plan", plan, "--steps", str(int(steps) + 2), "--warmup", "2", "--format",
               "json"] + flags + extra
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print("FAILED %s: %s" % (label, r.stderr[-1500:]), file=sys.stderr)
            return 1
        rep = json.loads(r.stdout[r.stdout.index("{"):])
        est, mea = rep["estimated"], rep["measured"]
        err = (est["step_s"] - mea["step_s"]) / mea["step_s"]
        errors.append(abs(err))
        rows.append("| %s | %.2f ms | %.2f ms | %+.0f%% | %s / %s | %s | %s |" % (
            label, est["step_s"] * 1e3, mea["step_s"] * 1e3, err * 100, est["arena_bytes"],
            mea["arena_bytes"], human(est["peak_bytes"]), human(mea["peak_bytes"])))
        if est.get("ranks", 1) > 1:  # data parallel: the collectives beside the estimate's
            comm.append("%s: data-parallel communication %.2f ms estimated, %.2f ms measured (%+.0f%%), "
                        "waiting for the slowest rank %.2f ms; regions per rank %s = estimated" % (
                            label, est["data_parallel_comm_s"] * 1e3, mea["communication_s"] * 1e3,
                            (est["data_parallel_comm_s"] - mea["communication_s"]) / mea["communication_s"] * 100,
                            mea["wait_s"] * 1e3, "allocated" if all(
                                est["regions"][k] == mea["regions"][k] for k in est["regions"]) else "NOT"))
    print("Measured %s UTC on %s (%s, %d CPUs, load average %.2f before), `tally run ... --steps %d --warmup 2`%s:\n" % (
        time.strftime("%Y-%m-%d %H:%M", time.gmtime()), platform.node(), platform.processor() or platform.machine(),
        os.cpu_count(), load, int(steps) + 2, (" " + " ".join(extra)) if extra else ""))
    print("| plan | estimated step | measured step (median) | error | arena est. / allocated (B) | peak est. | peak resident |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(row)
    print("\nmedian |step-time error| %.0f%%, worst %.0f%%" % (statistics.median(errors) * 100, max(errors) * 100))
    for line in comm:
        print("\n" + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
