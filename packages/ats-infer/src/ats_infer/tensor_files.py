"""Reading an ATS model directory without torch: config.json as a dict and the tensors of
model.safetensors (or its shards) as numpy arrays. BF16 has no numpy dtype, so every tensor is read
from a raw view of the file (the safetensors header gives dtype, shape and byte offsets) and BF16 is
widened to float32 exactly (a bf16 value is the top 16 bits of the float32 with the same value).
"""

import json
import math
import mmap
import struct
from pathlib import Path
from typing import Any

import numpy as np

CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100_000_000  # the largest header safetensors itself accepts

# safetensors dtype -> numpy dtype of the stored bytes (BF16 is read as its raw uint16 bits)
STORED_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
}


def read_config(model_dir: Path) -> dict[str, Any]:
    """config.json of a model directory as a dict; absence or bad JSON names the file."""
    path = Path(model_dir) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{model_dir}: not a model directory (no {CONFIG_FILE})")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: invalid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def require(config: dict[str, Any], key: str, where: str = CONFIG_FILE) -> Any:
    if key not in config:
        raise ValueError(f"{where}: missing key {key!r}")
    return config[key]


def tensor_file_names(model_dir: Path) -> list[str]:
    """The safetensors files holding the model's tensors (one file, or the shards of the index)."""
    single, index = model_dir / SINGLE_FILE, model_dir / INDEX_FILE
    if single.is_file():
        return [SINGLE_FILE]
    if not index.is_file():
        raise FileNotFoundError(f"{model_dir}: no {SINGLE_FILE} and no {INDEX_FILE}")
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{index}: not an index (JSON with a 'weight_map'): {err!r}") from None
    for file in files:
        if not isinstance(file, str) or "/" in file or file.startswith("."):
            raise ValueError(f"{index}: shard name {file!r} is not a plain file name")
    return files


def _read_file(path: Path) -> dict[str, np.ndarray]:
    size = path.stat().st_size
    if size < 8:
        raise ValueError(f"{path}: truncated: {size} bytes, a safetensors file has at least 8")
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
            raise ValueError(f"{path}: truncated or corrupt header length {header_len}")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: corrupt header: {err}") from None
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if not isinstance(header, dict):
        raise ValueError(f"{path}: corrupt header: expected a JSON object")
    header.pop("__metadata__", None)
    start = 8 + header_len
    tensors = {}
    for name, entry in header.items():
        if not isinstance(entry, dict) or entry.get("dtype") not in STORED_DTYPES:
            raise ValueError(f"{path}: {name} has an unsupported header entry {entry!r}")
        dtype = STORED_DTYPES[entry["dtype"]]
        shape = tuple(entry.get("shape", ()))
        begin, end = entry.get("data_offsets", (0, -1))
        if end - begin != math.prod(shape) * dtype.itemsize or start + end > size:
            raise ValueError(f"{path}: {name} has offsets {[begin, end]} that do not fit {shape}")
        array = np.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=start + begin)
        array = array.reshape(shape)
        if entry["dtype"] == "BF16":
            array = (array.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = array
    return tensors


def load_tensors(model_dir: Path) -> dict[str, np.ndarray]:
    """Every tensor of the model directory, as read-only numpy arrays (BF16 widened to float32)."""
    model_dir = Path(model_dir)
    tensors: dict[str, np.ndarray] = {}
    for file in tensor_file_names(model_dir):
        for name, array in _read_file(model_dir / file).items():
            if name in tensors:
                raise ValueError(f"{model_dir / file}: tensor {name} appears in two shards")
            tensors[name] = array
    return tensors
