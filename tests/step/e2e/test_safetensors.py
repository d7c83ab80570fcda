#!/usr/bin/python3
"""test_safetensors.py — unit tests of safetensors.py (ctest e2e-safetensors).

Round trips of every dtype; a file assembled by hand byte by byte from the format's definition
(so the reader is not only checked against its own writer); bf16 rounding against PyTorch's
float → bfloat16 conversion (Debian's python3-torch; skipped without it); malformed files give
SafetensorsError with a message naming the problem.
Usage: /usr/bin/python3 test_safetensors.py
"""
import json
import os
import struct
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors as st  # noqa: E402


def hand_made():
    """A two-tensor file written from the format's definition, not by st.serialize."""
    header = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "ids": {"dtype": "I32", "shape": [1, 3], "data_offsets": [8, 20]},
              "__metadata__": {"format": "pt"}}
    text = json.dumps(header).encode()
    data = struct.pack("<ff", 1.5, -2.0) + struct.pack("<iii", 7, -1, 65536)
    return struct.pack("<Q", len(text)) + text + data


class RoundTrip(unittest.TestCase):
    def test_every_dtype(self):
        rng = np.random.default_rng(1)
        tensors = {
            "w.0.weight": rng.standard_normal((3, 4)).astype(np.float32),
            "f64": rng.standard_normal(5),
            "half": rng.standard_normal((2, 2)).astype(np.float16),
            "tokens": rng.integers(-5, 100, size=(4, 16)).astype(np.int32),
            "i64": np.array([2 ** 40, -3], dtype=np.int64),
            "bytes": np.array([[0, 128, 255]], dtype=np.uint8),
            "scalar": np.array(3.25, dtype=np.float32),
            "empty": np.zeros((0, 3), dtype=np.float32),
        }
        back, meta = st.parse(st.serialize(tensors, metadata={"k": "v"}))
        self.assertEqual(meta, {"k": "v"})
        self.assertEqual(sorted(back), sorted(tensors))
        for name, arr in tensors.items():
            self.assertEqual(back[name].dtype, arr.dtype, name)
            self.assertEqual(back[name].shape, arr.shape, name)
            np.testing.assert_array_equal(back[name], arr)

    def test_file_round_trip_and_alignment(self):
        data = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.safetensors")
            st.save(path, data)
            with open(path, "rb") as f:
                raw = f.read()
            (n,) = struct.unpack("<Q", raw[:8])
            self.assertEqual(n % 8, 0)                    # padded header
            self.assertEqual(len(raw), 8 + n + 24)        # 6 floats after it
            np.testing.assert_array_equal(st.load(path)["x"], data["x"])

    def test_bf16_values_exact_in_bf16_round_trip(self):
        vals = np.array([0.0, -0.0, 1.0, -2.5, 3.140625, 9.18355e-41, np.inf, -np.inf], np.float32)
        vals[5] = np.array([0x00010000], np.uint32).view(np.float32)[0]  # a bf16 subnormal
        back = st.parse(st.serialize({"b": vals}, dtypes={"b": "BF16"}))[0]["b"]
        self.assertEqual(back.dtype, np.float32)
        np.testing.assert_array_equal(back, vals)
        self.assertTrue(np.isnan(st.parse(st.serialize(
            {"b": np.array([np.nan], np.float32)}, dtypes={"b": "BF16"}))[0]["b"][0]))

    def test_bf16_ties_to_even(self):
        # 1 + 2^-8 lies halfway between bf16 1 and 1 + 2^-7: ties to the even 1.0;
        # 1 + 3·2^-8 halfway between 1 + 2^-7 and 1 + 2^-6: ties to the even 1 + 2^-6.
        vals = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20], np.float32)
        bits = st.bf16_bits_from_f32(vals)
        np.testing.assert_array_equal(bits, np.array([0x3F80, 0x3F82, 0x3F81], np.uint16))

    def test_header_sorted_names_and_raw_bits(self):
        raw = st.serialize({"b": np.array([1.0], np.float32), "a": np.array([2], np.int32)})
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + n])
        self.assertEqual(header["a"], {"dtype": "I32", "shape": [1], "data_offsets": [0, 4]})
        self.assertEqual(header["b"], {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]})
        self.assertEqual(raw[8 + n:], struct.pack("<i", 2) + struct.pack("<f", 1.0))


class HandMade(unittest.TestCase):
    def test_read(self):
        tensors, meta = st.parse(hand_made())
        self.assertEqual(meta, {"format": "pt"})
        np.testing.assert_array_equal(tensors["a"], np.array([1.5, -2.0], np.float32))
        self.assertEqual(tensors["ids"].dtype, np.int32)
        np.testing.assert_array_equal(tensors["ids"], np.array([[7, -1, 65536]]))

    def test_bf16_and_f16_bytes(self):
        # bf16 0x4049 = 3.140625; f16 0x3C00 = 1.0, 0xC000 = -2.0.
        header = {"b": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]},
                  "h": {"dtype": "F16", "shape": [2], "data_offsets": [2, 6]}}
        text = json.dumps(header).encode()
        data = struct.pack("<Q", len(text)) + text + struct.pack("<HHH", 0x4049, 0x3C00, 0xC000)
        tensors = st.parse(data)[0]
        self.assertEqual(float(tensors["b"][0]), 3.140625)
        np.testing.assert_array_equal(tensors["h"], np.array([1.0, -2.0], np.float16))
        raw_tensors, dtypes, _ = st.parse_raw(data)
        self.assertEqual(dtypes, {"b": "BF16", "h": "F16"})
        self.assertEqual(int(raw_tensors["b"][0]), 0x4049)


class Malformed(unittest.TestCase):
    def bad(self, data, words):
        with self.assertRaises(st.SafetensorsError) as ctx:
            st.parse(data)
        self.assertIn(words, str(ctx.exception))

    def with_header(self, header, data):
        text = json.dumps(header).encode()
        return struct.pack("<Q", len(text)) + text + data

    def test_errors(self):
        good = hand_made()
        self.bad(good[:5], "too short")
        self.bad(good[:30], "past the end")
        self.bad(struct.pack("<Q", 2 ** 40) + b"{}", "over the limit")
        self.bad(struct.pack("<Q", 3) + b"{x}", "not UTF-8 JSON")
        self.bad(struct.pack("<Q", 2) + b"[]", "not a JSON object")
        self.bad(good + b"\0\0\0\0", "not covered")
        self.bad(self.with_header({"a": {"dtype": "Q8", "shape": [1], "data_offsets": [0, 1]}},
                                  b"\0"), "unsupported dtype")
        self.bad(self.with_header({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}},
                                  b"\0" * 4), "needs 8 bytes")
        self.bad(self.with_header({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}},
                                  b"\0" * 4), "outside")
        self.bad(self.with_header({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}},
                                  b""), "non-negative")
        self.bad(self.with_header({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                   "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}},
                                  b"\0" * 8), "overlaps")
        self.bad(self.with_header({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}},
                                  b"\0" * 8), "hole")
        self.bad(self.with_header({"__metadata__": {"k": 1}}, b""), "strings")

    def test_writer_errors(self):
        with self.assertRaises(st.SafetensorsError):
            st.serialize({"a": np.array([1], dtype=np.uint16)})
        with self.assertRaises(st.SafetensorsError):
            st.serialize({"a": np.zeros(1, np.float32)}, dtypes={"zz": "F32"})


class AgainstTorch(unittest.TestCase):
    def test_bf16_rounding_matches_torch(self):
        try:
            import torch
        except Exception as e:  # any import failure: no PyTorch for this interpreter
            self.skipTest("PyTorch not importable: %s" % e)
        rng = np.random.default_rng(7)
        vals = np.concatenate([
            rng.standard_normal(20000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 20000),
            # exact ties and their neighbours, both parities of the kept bit
            (np.arange(0x3F800000, 0x3F800000 + 0x40000, 0x4000, dtype=np.uint32)
             + np.uint32(0x8000)).view(np.float32),
            np.array([3.4e38, -3.4e38, 1e-45, 1e-39], np.float32),
        ]).astype(np.float32)
        want = torch.from_numpy(vals).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        np.testing.assert_array_equal(st.bf16_bits_from_f32(vals), want)
        # A bf16 file read back equals torch's bf16 → float32.
        back = st.parse(st.serialize({"b": vals}, dtypes={"b": "BF16"}))[0]["b"]
        np.testing.assert_array_equal(
            back, torch.from_numpy(vals).to(torch.bfloat16).to(torch.float32).numpy())


if __name__ == "__main__":
    unittest.main()
