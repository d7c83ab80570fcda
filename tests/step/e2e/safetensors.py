"""safetensors.py — a small reader and writer of the safetensors format, numpy only.

The end-to-end checks (check_e2e.py) hand weights and data to `tally run` and read its gradients
and saved weights in this format. The format (Hugging Face's): an 8-byte little-endian unsigned
header length N, N bytes of a UTF-8 JSON object, then the raw data buffer. The header maps each
tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the buffer, which
the tensors must cover exactly, without overlap); an optional "__metadata__" maps strings to
strings. Data is little-endian and row-major. Supported dtypes: F32, F64, I32, I64, F16, BF16, U8.

BF16 has no numpy type: read() returns BF16 tensors as float32 (exact: the 16 bits shifted left),
and write() rounds float32 to bf16 to nearest, ties to even (NaN kept NaN), as PyTorch does.
Every malformed input raises SafetensorsError with what is wrong, never another exception.
"""
import json
import struct

import numpy as np

# dtype name -> (numpy dtype of the stored bytes, bytes per element)
_DTYPES = {
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I32": np.dtype("<i4"),
    "I64": np.dtype("<i8"),
    "U8": np.dtype("u1"),
}
# The largest header accepted (the reference implementation's limit is 100 MB).
_MAX_HEADER = 100 * 1000 * 1000


class SafetensorsError(ValueError):
    """A file or a tensor set that is not valid safetensors (the message says what and where)."""


def bf16_bits_from_f32(x):
    """Round float32 values to bf16, to nearest with ties to even; returns the uint16 bits."""
    bits = np.ascontiguousarray(x, dtype="<f4").view("<u4").astype(np.uint64)
    lsb = (bits >> 16) & 1
    rounded = ((bits + 0x7FFF + lsb) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    # NaN: keep the sign and the top mantissa bits, force the quiet bit.
    rounded[nan] = ((bits[nan] >> 16).astype(np.uint16) | 0x0040)
    return rounded.reshape(np.shape(x))


def f32_from_bf16_bits(bits):
    """The float32 value of bf16 bits (exact)."""
    wide = np.asarray(bits, dtype=np.uint16).astype("<u4") << 16
    return wide.view("<f4").reshape(np.shape(bits))


def _product(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def parse(data):
    """Parses safetensors bytes; returns (tensors, metadata): name -> numpy array, and a dict.

    F32/F64/F16/I32/I64 arrays keep their type; BF16 arrays are returned as float32.
    """
    tensors, dtypes, metadata = parse_raw(data)
    out = {}
    for name, arr in tensors.items():
        out[name] = f32_from_bf16_bits(arr) if dtypes[name] == "BF16" else arr
    return out, metadata


def parse_raw(data):
    """Parses safetensors bytes; returns (tensors, dtypes, metadata) with BF16 as uint16 bits."""
    if len(data) < 8:
        raise SafetensorsError("file too short for the 8-byte header length (%d bytes)" % len(data))
    (n,) = struct.unpack("<Q", data[:8])
    if n > _MAX_HEADER:
        raise SafetensorsError("header length %d is over the limit of %d bytes" % (n, _MAX_HEADER))
    if 8 + n > len(data):
        raise SafetensorsError("header length %d runs past the end of the file (%d bytes)"
                               % (n, len(data)))
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise SafetensorsError("header is not UTF-8 JSON: %s" % e)
    if not isinstance(header, dict):
        raise SafetensorsError("header is not a JSON object")
    buf = memoryview(data)[8 + n:]
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise SafetensorsError("__metadata__ must map strings to strings")
    tensors, dtypes, spans = {}, {}, []
    for name, info in header.items():
        if not isinstance(info, dict):
            raise SafetensorsError("tensor '%s': entry is not an object" % name)
        dtype = info.get("dtype")
        shape = info.get("shape")
        offsets = info.get("data_offsets")
        if dtype not in _DTYPES:
            raise SafetensorsError("tensor '%s': unsupported dtype %r (supported: %s)"
                                   % (name, dtype, ", ".join(sorted(_DTYPES))))
        if (not isinstance(shape, list) or
                not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise SafetensorsError("tensor '%s': shape must be a list of non-negative integers"
                                   % name)
        if (not isinstance(offsets, list) or len(offsets) != 2 or
                not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
            raise SafetensorsError("tensor '%s': data_offsets must be [begin, end]" % name)
        begin, end = offsets
        if not 0 <= begin <= end <= len(buf):
            raise SafetensorsError("tensor '%s': data_offsets [%d, %d] outside the %d-byte buffer"
                                   % (name, begin, end, len(buf)))
        np_dtype = _DTYPES[dtype]
        nbytes = _product(shape) * np_dtype.itemsize
        if end - begin != nbytes:
            raise SafetensorsError("tensor '%s': %s %s needs %d bytes but data_offsets span %d"
                                   % (name, dtype, shape, nbytes, end - begin))
        arr = np.frombuffer(buf[begin:end], dtype=np_dtype).reshape(shape).copy()
        tensors[name] = arr
        dtypes[name] = dtype
        spans.append((begin, end, name))
    # The tensors must tile the buffer: sorted by offset, each starts where the last ended.
    spans.sort()
    pos = 0
    for begin, end, name in spans:
        if begin != pos:
            what = "overlaps the tensor before it" if begin < pos else "leaves a hole before it"
            raise SafetensorsError("tensor '%s' at offset %d %s" % (name, begin, what))
        pos = end
    if pos != len(buf):
        raise SafetensorsError("%d bytes after the last tensor are not covered by any tensor"
                               % (len(buf) - pos))
    return tensors, dtypes, metadata


def serialize(tensors, dtypes=None, metadata=None):
    """Serializes name -> array into safetensors bytes.

    The stored dtype follows the array (float32 → F32, float64 → F64, float16 → F16, int32 → I32,
    int64 → I64, uint8 → U8) unless `dtypes` names it; "BF16" rounds the values to bf16 (nearest even).
    Tensors are written in name order; the header is padded with spaces to a multiple of 8 bytes.
    """
    dtypes = dict(dtypes or {})
    by_numpy = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64",
                np.dtype(np.float16): "F16", np.dtype(np.int32): "I32", np.dtype(np.int64): "I64",
                np.dtype(np.uint8): "U8"}
    header, chunks, pos = {}, [], 0
    for name in sorted(tensors):
        if not isinstance(name, str) or name == "__metadata__":
            raise SafetensorsError("tensor name %r is not allowed" % (name,))
        arr = np.asarray(tensors[name])
        dtype = dtypes.pop(name, None) or by_numpy.get(arr.dtype)
        if dtype is None:
            raise SafetensorsError("tensor '%s': numpy dtype %s has no safetensors dtype; name one"
                                   % (name, arr.dtype))
        if dtype not in _DTYPES:
            raise SafetensorsError("tensor '%s': unsupported dtype %r" % (name, dtype))
        if dtype == "BF16":
            raw = bf16_bits_from_f32(arr.astype(np.float32)).astype("<u2").tobytes()
        else:
            raw = np.ascontiguousarray(arr, dtype=_DTYPES[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": [int(d) for d in arr.shape],
                        "data_offsets": [pos, pos + len(raw)]}
        chunks.append(raw)
        pos += len(raw)
    if dtypes:
        raise SafetensorsError("dtypes given for unknown tensors: %s" % ", ".join(sorted(dtypes)))
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def load(path):
    """Reads a .safetensors file: name -> numpy array (BF16 as float32)."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return parse(data)[0]
    except SafetensorsError as e:
        raise SafetensorsError("%s: %s" % (path, e))


def save(path, tensors, dtypes=None, metadata=None):
    """Writes name -> array to a .safetensors file (see serialize for the dtypes)."""
    data = serialize(tensors, dtypes, metadata)
    with open(path, "wb") as f:
        f.write(data)
