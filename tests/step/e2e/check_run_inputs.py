#!/usr/bin/python3
"""check_run_inputs.py — the run path trusts no file (issue 43): `tally run` of the e2e MLP
(mlp.tally: inputs x [8, 16] and y [8, 8] f32) with hostile --data and --init files, outputs that
would overwrite inputs, non-finite values (in the files, the loss and the gradients) and an
out-of-range --threads; and the step cache's key and record (check_cache). Every case must exit
non-zero with a message naming what is wrong, and leave every input file as it was.

Usage: /usr/bin/python3 check_run_inputs.py TALLY   (exit 1 on any failure; TALLY_CACHE_DIR as
the other e2e checks)."""
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import safetensors as st  # noqa: E402

MODEL = os.path.join(HERE, "mlp.tally")
model = MODEL  # the copy in the temporary folder each case runs (a failing tally may overwrite it)


def run(tally, *args, env=None):
    p = subprocess.run([tally, "run", model, "--steps", "1", "--warmup", "0", "--format", "json"] + list(args),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=1800, env=env)
    return p.returncode, p.stdout + p.stderr


def check_cache(tally, tmp, failed):
    """The step cache is keyed by the compiler too and runs only what it built (issue 43): with CXX
    a wrapper that logs and fails, the cached MLP step (built by main's setup run) is not reused
    but rebuilt, with the wrapper; an executable planted where a cache entry's goes is never run.
    No step is compiled: every build here fails at CMake's compiler check (about a second)."""
    wrapper, log = os.path.join(tmp, "cxx-wrapper"), os.path.join(tmp, "cxx-wrapper.log")
    with open(wrapper, "w") as f:
        f.write('#!/bin/sh\necho "$@" >> %s\nexit 1\n' % log)
    os.chmod(wrapper, 0o755)
    env = dict(os.environ, CXX=wrapper)
    rc, out = run(tally, env=env)
    ok = rc == 1 and "building the generated step in" in out and os.path.exists(log)
    print("%s cache-compiler-changed: exit %d%s" % ("PASS" if ok else "FAIL", rc, "" if ok else "\n" + out))
    if not ok:
        failed.append("cache-compiler-changed")

    env["TALLY_CACHE_DIR"] = os.path.join(tmp, "cache")
    rc, out = run(tally, env=env)
    entry = out.split("building the generated step in ", 1)[-1].split("\n", 1)[0].strip()
    marker = os.path.join(tmp, "planted-ran")
    os.makedirs(os.path.join(entry, "build"), exist_ok=True)
    planted = os.path.join(entry, "build", "tally_step")
    with open(planted, "w") as f:
        f.write('#!/bin/sh\ntouch %s\necho "{}"\n' % marker)
    os.chmod(planted, 0o755)
    rc, out = run(tally, env=env)
    ok = rc == 1 and "not running the cached step in " + entry in out and not os.path.exists(marker)
    print("%s cache-planted-executable: exit %d%s" % ("PASS" if ok else "FAIL", rc, "" if ok else "\n" + out))
    if not ok:
        failed.append("cache-planted-executable")
    check_bench(tally, tmp, failed)


def check_bench(tally, tmp, failed):
    """The bench (tools/tally/StepCache.h): in a fresh cache the first step is configured and built
    in bench-<hash>-0, and a second step with the same CMakeLists.txt (the MLP in mixed bf16: another
    step.cpp) is built there without configuring again; each entry holds its own executable,
    which runs and is then run from the cache (verified against its record). The bench's lock,
    its rewriting only changed files and its refusal of a planted symbolic link are unit tests
    (tests/unit/test_stepcache.cpp)."""
    env = dict(os.environ, TALLY_CACHE_DIR=os.path.join(tmp, "bench-cache"))
    rc1, out1 = run(tally, env=env)
    rc2, out2 = run(tally, "--precision", "mixed_bf16", env=env)
    rc3, out3 = run(tally, "--precision", "mixed_bf16", env=env)
    cache = env["TALLY_CACHE_DIR"]
    benches = sorted(d for d in os.listdir(cache) if d.startswith("bench-") and not d.endswith(".lock"))
    entries = [out.split("building the generated step in ", 1)[-1].split("\n", 1)[0].strip() for out in (out1, out2)]
    logs = []
    for e in entries:
        try:
            with open(os.path.join(e, "build.log")) as f:
                logs.append(f.read())
        except OSError:
            logs.append("")
    ok = (rc1 == rc2 == rc3 == 0 and len(benches) == 1 and benches[0].endswith("-0") and
          "Configuring done" in logs[0] and logs[1] and "Configuring done" not in logs[1] and
          entries[0] != entries[1] and all(os.access(os.path.join(e, "build", "tally_step"), os.X_OK) for e in entries)
          and "building the generated step" not in out3)
    print("%s cache-bench: exits %d %d %d, benches %s, configured first %s, again %s%s" % (
        "PASS" if ok else "FAIL", rc1, rc2, rc3, benches, "Configuring done" in logs[0], "Configuring done" in logs[1],
        "" if ok else "\n" + out1[-2000:] + out2[-2000:] + out3[-2000:]))
    if not ok:
        failed.append("cache-bench")


def main():
    tally = sys.argv[1]
    failed = []
    tmp = tempfile.mkdtemp(prefix="tally-run-inputs-")
    global model
    model = os.path.join(tmp, "mlp.tally")
    with open(MODEL, "rb") as src, open(model, "wb") as dst:
        dst.write(src.read())

    def path(name):
        return os.path.join(tmp, name)

    ones = lambda *s: np.ones(s, np.float32)  # noqa: E731
    good = path("good.safetensors")
    st.save(good, {"x": ones(8, 16), "y": ones(8, 8)})
    weights = path("w.safetensors")
    rc, out = run(tally, "--data", good, "--save", weights)
    if rc != 0:
        print("FAIL setup: tally run --save exited %d:\n%s" % (rc, out))
        return 1
    w = st.load(weights)

    def expect(name, args, rc_want, needles, keep=()):
        before = {f: open(f, "rb").read() for f in keep}
        rc, out = run(tally, *args)
        ok = rc == rc_want and all(n in out for n in needles)
        ok = ok and all(open(f, "rb").read() == b for f, b in before.items())
        print("%s %s: exit %d%s" % ("PASS" if ok else "FAIL", name, rc, "" if ok else "\n" + out), flush=True)
        if not ok:
            failed.append(name)

    # Data: a first input of 2 batches and a second of 1 read past the second (ASan: heap
    # overflow in loadAs); U8 data for a float input loaded as zeros; NaN trained to exit 0.
    f = path("batches.safetensors")
    st.save(f, {"x": ones(16, 16), "y": ones(8, 8)})
    expect("data-batches-differ", ["--data", f], 1, ["y is [8, 8]", "[16, 8]"])
    f = path("u8.safetensors")
    st.save(f, {"x": np.ones((8, 16), np.uint8), "y": ones(8, 8)})
    expect("data-u8-for-float", ["--data", f], 1, ["x has dtype U8", "F32"])
    f = path("i32.safetensors")
    st.save(f, {"x": np.ones((8, 16), np.int32), "y": ones(8, 8)})
    expect("data-i32-for-float", ["--data", f], 1, ["x has dtype I32"])
    x = ones(8, 16)
    x[3, 5] = np.nan
    f = path("nan.safetensors")
    st.save(f, {"x": x, "y": ones(8, 8)})
    expect("data-nan", ["--data", f], 1, ["x holds NaN at index [3, 5]"])
    f = path("extra.safetensors")
    st.save(f, {"x": ones(8, 16), "y": ones(8, 8), "z": ones(1)})
    expect("data-unknown-tensor", ["--data", f], 1, ["has tensor z, which is not an input"])

    # Weights: I32 weights were accepted (loss 1.7e17); an infinity trained to NaN.
    name = sorted(w)[0]
    bad = dict(w)
    bad[name] = np.ones(w[name].shape, np.int32)
    f = path("w_i32.safetensors")
    st.save(f, bad)
    expect("init-i32-weights", ["--data", good, "--init", f], 1, [name + " has dtype I32"])
    bad = dict(w)
    inf = np.array(w[name], np.float32)
    inf.flat[0] = np.inf
    bad[name] = inf
    f = path("w_inf.safetensors")
    st.save(f, bad)
    expect("init-inf-weights", ["--data", good, "--init", f], 1, [name + " holds +Inf at index"])

    # --init in another float dtype is converted tensor by tensor in chunks (issue 46 item 1):
    # the first non-finite value wins over an earlier value beyond F32's range; a value beyond
    # the range is named by its element; F16 and BF16 files train exactly as the same values in F32.
    big = np.array(w[name], np.float64)
    big.flat[2] = 1e39
    bad[name] = big
    f = path("w_f64_range.safetensors")
    st.save(f, bad)
    expect("init-f64-beyond-f32", ["--data", good, "--init", f], 1,
           [name + " element 2 is 99999999999999993970", "beyond the range of F32"])
    big.flat[7] = np.nan
    st.save(f, bad)
    expect("init-f64-nan-first", ["--data", good, "--init", f], 1, [name + " holds NaN at index"])
    for dt, narrow in (("F16", lambda a: np.array(a, np.float16)), ("BF16", None)):
        half = path("w_%s.safetensors" % dt)
        st.save(half, {k: narrow(v) if narrow else v for k, v in w.items()}, dtypes=None if narrow else
                {k: "BF16" for k in w})
        same = path("w_%s_as_f32.safetensors" % dt)
        st.save(same, {k: np.array(v, np.float32) for k, v in st.load(half).items()})
        outs = []
        for src in (half, same):
            saved = src + ".after"
            rc, out = run(tally, "--data", good, "--init", src, "--save", saved, "--threads", "1")
            outs.append(open(saved, "rb").read() if rc == 0 else b"exit %d" % rc)
        ok = outs[0] == outs[1] and not outs[0].startswith(b"exit")
        print("%s init-%s-equals-f32" % ("PASS" if ok else "FAIL", dt.lower()), flush=True)
        if not ok:
            failed.append("init-%s-equals-f32" % dt.lower())

    # A non-finite loss stops the run, without saving; --allow-nonfinite trains on.
    big = {k: np.full(v.shape, 1e30, np.float32) for k, v in w.items()}
    f = path("w_big.safetensors")
    st.save(f, big)
    out_w = path("never.safetensors")
    expect("nonfinite-loss-stops", ["--data", good, "--init", f, "--save", out_w], 1, ["the loss is"])
    if os.path.exists(out_w):
        print("FAIL nonfinite-loss-stops: %s was written" % out_w)
        failed.append("nonfinite-loss-saved")
    expect("nonfinite-loss-allowed", ["--data", good, "--init", f, "--allow-nonfinite"], 0, [])

    # A non-finite gradient under a finite loss (fc2 all zero, fc1 all 1e29, y = 1e10: the loss
    # is 1e20, fc2's weight gradient overflows) stops the run naming the step and the first
    # gradient, without saving (before, the update ran, and only the save's NaN check or the next
    # step's loss stopped the run, naming neither the step nor the gradient).
    huge = {k: np.full(v.shape, 1e29 if k.startswith("fc1") else 0.0, np.float32) for k, v in w.items()}
    f = path("w_huge.safetensors")
    st.save(f, huge)
    d = path("y_big.safetensors")
    st.save(d, {"x": ones(8, 16), "y": np.full((8, 8), 1e10, np.float32)})
    expect("nonfinite-gradient-stops", ["--data", d, "--init", f, "--save", out_w], 1,
           ["step 1: the gradient norm is not finite (the gradient of ", "stopping without writing --save"])
    if os.path.exists(out_w):
        print("FAIL nonfinite-gradient-stops: %s was written" % out_w)
        failed.append("nonfinite-gradient-saved")
    expect("nonfinite-gradient-allowed", ["--data", d, "--init", f, "--allow-nonfinite"], 0, [])

    # Outputs never replace inputs: the model, --data, --init; the data and weights stay whole.
    expect("save-over-model", ["--data", good, "--save", model], 2, ["refusing to write --save"], keep=[model])
    expect("save-over-data", ["--data", good, "--save", good], 2, ["refusing to write --save", "--data"], keep=[good])
    expect("dump-over-init", ["--data", good, "--init", weights, "--dump-grads", weights], 2,
           ["refusing to write --dump-grads", "--init"], keep=[weights])
    os.link(good, path("good_link.safetensors"))
    expect("save-over-hard-link-of-data", ["--data", good, "--save", path("good_link.safetensors")], 2,
           ["refusing to write"], keep=[good])
    expect("threads-bound", ["--threads", "100000"], 2, ["--threads takes at most 1024"])
    check_cache(tally, tmp, failed)
    print("%d failed" % len(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
