#!/usr/bin/env python3
"""safetensors_seeds.py DIR — writes the seed inputs of fuzz/safetensors_fuzz.cpp into DIR.

Valid files the generated step reads (two tensors of different dtypes, metadata, an empty
tensor, a scalar) and a few that the reader must refuse (a header length past the end, an
offset past the buffer, a range of the wrong length), so that the fuzzer starts next to both
sides of every check. Written at run time: nothing binary is committed.
"""
import json
import os
import struct
import sys


def file_of(header, data):
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def main():
    out = sys.argv[1]
    seeds = {
        "two.safetensors": file_of(
            {"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
             "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]},
             "__metadata__": {"format": "pt"}}, bytes(range(32))),
        "empty-and-scalar.safetensors": file_of(
            {"e": {"dtype": "I64", "shape": [0, 5], "data_offsets": [0, 0]},
             "s": {"dtype": "F64", "shape": [], "data_offsets": [0, 8]}}, b"\x00" * 8),
        "tokens.safetensors": file_of(
            {"tokens": {"dtype": "I32", "shape": [2, 4], "data_offsets": [0, 32]}},
            struct.pack("<8i", *range(8))),
        "header-past-end.safetensors": struct.pack("<Q", 1 << 20) + b"{}",
        "offset-past-buffer.safetensors": file_of(
            {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\x00" * 8),
        "wrong-length.safetensors": file_of(
            {"w": {"dtype": "F16", "shape": [3], "data_offsets": [0, 8]}}, b"\x00" * 8),
    }
    os.makedirs(out, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
