#!/usr/bin/python3
"""safetensors_cross.py — the C++ safetensors reader/writer (codegen/runtime/common/
tally_safetensors.h, via tests/step/safetensors_tool) against the python one
(tests/step/e2e/safetensors.py), both ways (ctest step-safetensors-python):

  python writes → C++ reads and writes a copy → python reads the copy: every dtype, a scalar,
      an empty tensor, names with quotes, backslashes, newlines and non-ASCII characters, and
      metadata (which the C++ side accepts and drops); the C++ side also reports the names,
      dtypes and shapes it read, as JSON through rt::json_escape.
  C++ writes fixed tensors → python reads them and checks every value against the formula the
      C++ side used, and the header layout (names sorted, padded with spaces to 8 bytes).
  python-made malformed files → the C++ reader exits 2 with "safetensors: <path>: <what>".

Usage: /usr/bin/python3 safetensors_cross.py SAFETENSORS_CHECK_BINARY WORK_DIR
"""
import json
import os
import struct
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "e2e"))
import safetensors as st  # noqa: E402

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(binary, *args):
    return subprocess.run([binary] + list(args), capture_output=True, text=True)


def python_to_cpp(binary, work):
    rng = np.random.default_rng(7)
    tensors = {
        "w.0.weight": rng.standard_normal((3, 4)).astype(np.float32),
        "f64": rng.standard_normal(5),
        "half": rng.standard_normal((2, 2)).astype(np.float16),
        "bf": rng.standard_normal((2, 3)).astype(np.float32),   # stored as BF16
        "tokens": rng.integers(-5, 100, size=(4, 16)).astype(np.int32),
        "i64": np.array([2 ** 40, -3], dtype=np.int64),
        "mask": np.array([[0, 1, 255]], dtype=np.uint8),
        "scalar": np.array(3.25, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
        'quote"back\\slash\nnewline': np.array([1.0], dtype=np.float32),
        "café/ü.☃": np.array([2.0, 3.0], dtype=np.float32),
    }
    src = os.path.join(work, "from_python.safetensors")
    dst = os.path.join(work, "copied_by_cpp.safetensors")
    st.save(src, tensors, dtypes={"bf": "BF16"}, metadata={"format": "pt", "note": 'a "quoted" value'})
    r = run(binary, "--copy", src, dst)
    check(r.returncode == 0, "C++ reads and copies the python file (rc %d: %s)" % (r.returncode, r.stderr.strip()))
    if r.returncode != 0:
        return
    listing = json.loads(r.stdout)
    with open(src, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    header.pop("__metadata__")
    check(listing["names"] == list(header), "C++ names() in the header's order: %s" % listing["names"])
    check(listing["dtypes"] == [header[k]["dtype"] for k in header], "C++ dtypes match the header")
    check(listing["shapes"] == [header[k]["shape"] for k in header], "C++ shapes match the header")
    orig, odt, _ = st.parse_raw(raw)
    with open(dst, "rb") as f:
        copy_raw = f.read()
    back, bdt, meta = st.parse_raw(copy_raw)
    check(meta == {}, "the C++ copy has no metadata (the reader ignores it)")
    check(sorted(back) == sorted(orig), "the C++ copy has every tensor")
    for name in orig:
        same = (name in back and bdt[name] == odt[name] and back[name].dtype == orig[name].dtype and
                back[name].shape == orig[name].shape and back[name].tobytes() == orig[name].tobytes())
        check(same, "tensor %r survives python → C++ → python bit for bit (%s %s)"
              % (name, odt[name], list(orig[name].shape)))


def cpp_to_python(binary, work):
    path = os.path.join(work, "from_cpp.safetensors")
    r = run(binary, "--write-fixed", path)
    check(r.returncode == 0, "C++ writes the fixed tensors (rc %d: %s)" % (r.returncode, r.stderr.strip()))
    if r.returncode != 0:
        return
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    text = raw[8:8 + n].decode("utf-8")
    check(n % 8 == 0, "header length %d is a multiple of 8" % n)
    body = text.rstrip(" ")
    check(body.endswith("}") and len(text) - len(body) < 8, "the header is padded with fewer than 8 spaces")
    names = list(json.loads(text))
    check(names == sorted(names), "the C++ writer's names are sorted: %s" % names)
    tensors, dtypes, meta = st.parse_raw(raw)   # also checks that the tensors tile the buffer
    values = {k: (st.f32_from_bf16_bits(v) if dtypes[k] == "BF16" else v) for k, v in tensors.items()}
    i = np.arange
    want = {
        "f32": ("F32", (0.25 * i(6, dtype=np.float32) - 1.0).astype(np.float32).reshape(2, 3)),
        "f64": ("F64", 1.0 / (i(5, dtype=np.float64) + 1)),
        "bf16": ("BF16", (1.5 * i(4, dtype=np.float32) - 2.0).astype(np.float32)),
        "f16": ("F16", (0.125 * i(3) + 0.5).astype(np.float16).reshape(3, 1)),
        "i32": ("I32", (1000 * i(4) - 7).astype(np.int32).reshape(2, 2)),
        "i64": ("I64", np.array([2 ** 40, -3], dtype=np.int64)),
        "u8": ("U8", np.array([0, 128, 255], dtype=np.uint8)),
        "scalar": ("F32", np.array(3.25, dtype=np.float32)),
        "empty": ("F32", np.zeros((0, 3), dtype=np.float32)),
        'quote"back\\slash\nnewline': ("F32", np.array([1.0], dtype=np.float32)),
        "café.w": ("F32", np.array([2.0], dtype=np.float32)),
    }
    check(sorted(values) == sorted(want), "the C++ file has exactly the fixed tensors: %s" % sorted(values))
    for name, (dtype, arr) in want.items():
        got = values.get(name)
        ok = (got is not None and dtypes[name] == dtype and got.shape == arr.shape and
              got.dtype == (np.float32 if dtype == "BF16" else arr.dtype) and np.array_equal(got, arr))
        check(ok, "tensor %r from C++: %s %s equals its formula" % (name, dtype, list(arr.shape)))


def malformed(binary, work):
    good = st.serialize({"a": np.arange(4, dtype=np.float32)})
    cases = [
        ("truncated", good[:-3], "are outside the 13-byte data buffer"),
        ("header past the end", struct.pack("<Q", len(good)) + good[8:], "runs past the end of the file"),
        ("bad JSON", struct.pack("<Q", 8) + b'{"a" 1} ', "header JSON at byte 5: expected ':' after a name"),
        ("shape/bytes", st.serialize({"a": np.arange(4, dtype=np.float32)}).replace(b"[4]", b"[5]"),
         "F32 [5] needs 20 bytes but data_offsets span 16"),
    ]
    for what, data, message in cases:
        path = os.path.join(work, "bad.safetensors")
        with open(path, "wb") as f:
            f.write(data)
        r = run(binary, "--copy", path, os.path.join(work, "unused.safetensors"))
        err = r.stderr.strip()
        check(r.returncode == 2 and err.startswith("safetensors: %s: " % path) and message in err,
              "malformed (%s): rc %d, %r" % (what, r.returncode, err))


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    binary, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    python_to_cpp(binary, work)
    cpp_to_python(binary, work)
    malformed(binary, work)
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
