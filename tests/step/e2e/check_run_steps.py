#!/usr/bin/python3
"""check_run_steps.py — `tally run --steps N` trains N steps in all, the first --warmup of them
untimed (issue 42), on the e2e MLP (mlp.tally, random data from --seed: the same batch every step):

  - the report has N losses, N - W timed steps, and `warmup` W (default 2, or N - 1 for N < 3);
  - --save holds the weights after exactly N updates: a one-step run from them (--init) computes
    the loss that an (N + 1)-step run computes at its last step, on the weights after N updates,
    bit for bit (the same program, data and threads; fp32 weights saved as F32);
  - the timing keys (step_min_s ≤ step_s ≤ step_max_s, load_average, cores, timing_warnings)
    are in the JSON, beside the old ones; every other timed step (the last, or the only one)
    times its kernels (kernel_steps) and step_s is the median of the others;
  - --warmup N or more is refused (at least one step is timed);
  - a progress line ("tally_step: step 1/3 (warm-up, untimed)") on stderr when it is a terminal
    (a pseudo-terminal here), and none when it is not (a pipe);
  - --trace FILE writes the last step as a Chrome/Perfetto trace beside the estimate
    (check_trace.py: the format, a slice per kernel call named by the model's op paths, the
    estimate's slices summing to its step).

Usage: /usr/bin/python3 check_run_steps.py TALLY   (exit 1 on any failure; TALLY_CACHE_DIR as the
other e2e checks)."""
import json
import os
import pty
import subprocess
import sys
import tempfile

import check_trace

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "mlp.tally")


def run(tally, *args):
    p = subprocess.run([tally, "run", MODEL, "--format", "json", "--seed", "3"] + list(args),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=1800)
    return p.returncode, p.stdout, p.stderr


def main():
    tally = sys.argv[1]
    failed = []
    tmp = tempfile.mkdtemp(prefix="tally-run-steps-")

    def check(name, ok, detail=""):
        print("%s %s%s" % ("PASS" if ok else "FAIL", name, "" if ok else ": " + detail), flush=True)
        if not ok:
            failed.append(name)

    # One run of 4 steps, none untimed: its losses are those of the weights after 0..3 updates.
    rc, out, err = run(tally, "--steps", "4", "--warmup", "0")
    if rc != 0:
        print("FAIL setup: tally run --steps 4 --warmup 0 exited %d:\n%s" % (rc, err))
        return 1
    ref = json.loads(out)["loss"]
    check("steps-4-warmup-0: 4 losses", len(ref) == 4, str(ref))

    for steps, warmup_flag, warmup in [(1, None, 0), (2, None, 1), (3, None, 2), (3, "1", 1)]:
        name = "steps-%d-warmup-%s" % (steps, warmup_flag or "default")
        w = os.path.join(tmp, name + ".safetensors")
        flags = ["--steps", str(steps), "--save", w] + (["--warmup", warmup_flag] if warmup_flag else [])
        rc, out, err = run(tally, *flags)
        if rc != 0:
            check(name, False, "exit %d: %s" % (rc, err))
            continue
        rep = json.loads(out)
        m = rep["measured"]
        check(name + ": losses", rep["loss"] == ref[:steps], "%s, not %s" % (rep["loss"], ref[:steps]))
        check(name + ": warm-up", m["warmup"] == warmup and m["steps"] == steps, "warmup %s steps %s" % (
            m["warmup"], m["steps"]))
        timed = steps - warmup
        check(name + ": timed steps", m.get("timed_steps") == timed and len(m["step_times"]) == timed,
              "timed_steps %s, %d step_times" % (m.get("timed_steps"), len(m["step_times"])))
        # Every other timed step times its kernels, the last one included (or the only one);
        # step_s is the median of the others' times, where there are any.
        times = m["step_times"]
        profiled = [k for k in range(timed) if (timed - 1 - k) % 2 == 0 or timed == 1]
        clean = sorted(t for k, t in enumerate(times) if k not in profiled) or sorted(times)
        median = clean[len(clean) // 2] if len(clean) % 2 else (clean[len(clean) // 2 - 1] + clean[len(clean) // 2]) / 2
        check(name + ": kernels timed in %d steps" % len(profiled), m.get("kernel_steps") == len(profiled),
              "kernel_steps %s" % m.get("kernel_steps"))
        check(name + ": step_s from the steps not profiled", abs(m["step_s"] - median) <= 1e-12 * median,
              "step_s %s, the median of %s is %s" % (m["step_s"], clean, median))
        keys = ["step_min_s", "step_max_s", "load_average", "cores", "timing_warnings"]
        if not all(k in m for k in keys):
            check(name + ": timing keys", False, "missing " + ", ".join(k for k in keys if k not in m))
        else:
            check(name + ": min <= median <= max", m["step_min_s"] <= m["step_s"] <= m["step_max_s"],
                  "%s %s %s" % (m["step_min_s"], m["step_s"], m["step_max_s"]))
            check(name + ": load and cores", m["cores"] >= 1 and isinstance(m["timing_warnings"], list) and
                  (m["load_average"] is None or m["load_average"] >= 0), "%s %s %s" % (
                      m["cores"], m["load_average"], m["timing_warnings"]))
        # The saved weights are those after exactly `steps` updates: their loss is ref[steps].
        rc, out, err = run(tally, "--steps", "1", "--warmup", "0", "--init", w)
        got = json.loads(out)["loss"] if rc == 0 else None
        check(name + ": --save after %d updates" % steps, got == [ref[steps]],
              "a step from the saved weights has loss %s, the weights after %d updates %r (after %d: %r)" % (
                  got, steps, ref[steps], steps + 2, ref[steps + 2] if steps + 2 < len(ref) else "?"))

    # Progress: on a terminal only (the build is cached by the runs above, so only the steps show).
    # The same run writes the trace of its last step (--trace: a flag of the built step, no build).
    trace = os.path.join(tmp, "trace.json")
    rc, out, err = run(tally, "--steps", "3", "--trace", trace)
    check("no progress on a pipe", rc == 0 and "tally_step: step" not in err and "\r" not in err, repr(err))
    if rc == 0:
        rep = json.loads(out)
        check("--trace named in the report", rep.get("trace") == trace, str(rep.get("trace")))
        for name, ok, detail in check_trace.check(tally, MODEL, "mlp", trace, rep):
            check(name, ok, detail)
    master, slave = pty.openpty()
    p = subprocess.Popen([tally, "run", MODEL, "--format", "json", "--seed", "3", "--steps", "3"],
                         stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    shown = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the other end closed
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    out = p.stdout.read()
    p.wait()
    check("progress on a terminal", p.returncode == 0 and b"tally_step: step 1/3 (warm-up, untimed)" in shown
          and json.loads(out)["loss"] == ref[:3], repr(shown[-400:]))

    rc, out, err = run(tally, "--steps", "2", "--warmup", "2")
    check("warmup-not-below-steps refused", rc == 2 and "--warmup 2 must be less than --steps 2" in err,
          "exit %d: %s" % (rc, err))
    print("%d failed" % len(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
