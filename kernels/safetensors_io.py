"""A standard-library + numpy reader and writer for the safetensors format (no new dependency).

The format, as Hugging Face specifies it:

    [ 8 bytes: N, little-endian u64 ][ N bytes: JSON header ][ raw tensor bytes ............ ]
    header = {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
              "__metadata__": {"key": "string value"}}            (metadata optional)

Offsets are relative to the first byte after the header, tensors are little-endian and
C-ordered, and the byte ranges must tile the data region exactly (no gaps, no overlap). The
reader checks all of that and raises `ValueError` on any violation rather than returning views
into a malformed file.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

# safetensors dtype tags that map onto numpy types; BF16 is widened to float32 on read.
DTYPES: dict[str, np.dtype[Any]] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
BF16 = "BF16"
MAX_HEADER_BYTES = 100 * 2**20  # the reference implementation's limit


def save_file(
    tensors: Mapping[str, npt.NDArray[Any]], path: str | Path, metadata: Mapping[str, str] | None = None
) -> None:
    """Write `tensors` (names sorted, data packed in that order) to `path`."""
    header: dict[str, Any] = {}
    chunks: list[bytes] = []
    offset = 0
    tags = {dtype: tag for tag, dtype in DTYPES.items()}
    for name in sorted(tensors):
        array = np.asarray(tensors[name])
        dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
        if dtype not in tags:
            raise ValueError(f"tensor {name!r}: dtype {array.dtype} has no safetensors tag")
        data = np.ascontiguousarray(array, dtype=dtype).tobytes()
        header[name] = {"dtype": tags[dtype], "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {str(key): str(value) for key, value in metadata.items()}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # pad so the data region starts 8-byte aligned
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)))
        handle.write(encoded)
        for chunk in chunks:
            handle.write(chunk)


def load_file(path: str | Path) -> tuple[dict[str, npt.NDArray[Any]], dict[str, str]]:
    """Read every tensor (as its own array) and the metadata from `path`."""
    raw = Path(path).read_bytes()
    if len(raw) < 8:
        raise ValueError(f"{path}: {len(raw)} bytes, too short for a safetensors header")
    (length,) = struct.unpack("<Q", raw[:8])
    if length > MAX_HEADER_BYTES or 8 + length > len(raw):
        raise ValueError(f"{path}: header length {length} exceeds the file ({len(raw)} bytes)")
    try:
        header = json.loads(raw[8 : 8 + length].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: header is not JSON: {error}") from error
    if not isinstance(header, dict):
        raise ValueError(f"{path}: header must be a JSON object")
    data = raw[8 + length :]
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError(f"{path}: __metadata__ must map strings to strings")
    tensors: dict[str, npt.NDArray[Any]] = {}
    spans: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        array, begin, end = _read_tensor(path, name, entry, data)
        tensors[name] = array
        spans.append((begin, end, name))
    _check_tiling(path, spans, len(data))
    return tensors, metadata


def _read_tensor(path: str | Path, name: str, entry: Any, data: bytes) -> tuple[npt.NDArray[Any], int, int]:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise ValueError(f"{path}: tensor {name!r} needs exactly dtype, shape and data_offsets")
    tag, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if tag not in DTYPES and tag != BF16:
        raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {tag!r}")
    if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise ValueError(f"{path}: tensor {name!r} has a malformed shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(n, int) for n in offsets)):
        raise ValueError(f"{path}: tensor {name!r} has malformed data_offsets {offsets!r}")
    begin, end = offsets
    itemsize = 2 if tag == BF16 else DTYPES[tag].itemsize
    if not 0 <= begin <= end <= len(data) or end - begin != int(np.prod(shape, dtype=np.int64)) * itemsize:
        raise ValueError(f"{path}: tensor {name!r} bytes [{begin}, {end}) do not hold shape {shape} of {tag}")
    if tag == BF16:  # bfloat16 is the top half of a float32
        bits = np.frombuffer(data[begin:end], dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape).copy(), begin, end
    return np.frombuffer(data[begin:end], dtype=DTYPES[tag]).reshape(shape).copy(), begin, end


def _check_tiling(path: str | Path, spans: list[tuple[int, int, str]], size: int) -> None:
    position = 0
    for begin, end, name in sorted(spans):
        if begin != position:
            raise ValueError(f"{path}: tensor {name!r} starts at {begin}, expected {position} (gap or overlap)")
        position = end
    if position != size:
        raise ValueError(f"{path}: {size - position} bytes after the last tensor")
