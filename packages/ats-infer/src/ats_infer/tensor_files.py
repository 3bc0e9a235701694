"""Reading the files of an ATS model directory without torch: JSON files, and the tensors of
model.safetensors (or the shards its index lists) as numpy arrays.

Every safetensors header is checked before a byte of data is read, as the native loader
(native/src/runtime/safetensors.cpp) and the safetensors library check it: integer offsets inside
the data area, each span exactly dtype size * shape, the spans in order, without overlap or gap,
covering the data area. BF16 has no numpy dtype, so tensors are read from a raw view of the file
and BF16 is widened to float32 exactly (a bf16 value is the top 16 bits of the same float32).
"""

import errno
import json
import math
import mmap
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100_000_000  # the largest header safetensors itself accepts
MAX_DIMS = 8  # as the native loader

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


def path_kind(path: Path) -> str:
    """What `path` is, in words: "file", "directory", "missing", "symlink loop", "character
    device", ... (symlinks followed), so that errors say what is wrong instead of "no such file"."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "dangling symlink" if os.path.islink(path) else "missing"
    except OSError as err:
        return (
            "symlink loop"
            if err.errno == errno.ELOOP
            else f"path that cannot be read ({err.strerror})"
        )
    kinds = (
        (stat.S_ISREG, "file"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISFIFO, "named pipe"),
        (stat.S_ISSOCK, "socket"),
    )
    return next((kind for test, kind in kinds if test(mode)), "special file")


def require_model_dir(path: Path) -> None:
    """Raise unless `path` is a directory holding a config.json file."""
    kind = path_kind(path)
    if kind == "missing":
        raise FileNotFoundError(f"{path}: not a model directory (no such directory)")
    if kind != "directory":
        raise ValueError(f"{path}: not a model directory (it is a {kind})")
    if path_kind(path / CONFIG_FILE) == "missing":
        raise FileNotFoundError(f"{path}: not a model directory (no {CONFIG_FILE})")
    require_file(path / CONFIG_FILE)


def require_file(path: Path) -> None:
    """Raise unless `path` is a regular file (symlinks followed)."""
    kind = path_kind(path)
    if kind == "missing":
        raise FileNotFoundError(f"{path}: no such file")
    if kind != "file":
        raise ValueError(f"{path}: is a {kind}, not a regular file")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice")
        out[key] = value
    return out


def parse_json(raw: bytes, where: str) -> Any:
    """JSON from bytes; bad UTF-8, bad JSON, repeated keys and deep nesting name `where`."""
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except UnicodeDecodeError as err:
        raise ValueError(f"{where}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: invalid JSON: {err}") from None
    except RecursionError:
        raise ValueError(f"{where}: invalid JSON: nested too deeply") from None
    except ValueError as err:  # a repeated key, from the hook
        raise ValueError(f"{where}: invalid JSON: {err}") from None


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file holding an object; every failure names the file."""
    require_file(path)
    data = parse_json(path.read_bytes(), str(path))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as a checked safetensors header describes it."""

    file: Path
    dtype: str  # safetensors dtype name, a key of STORED_DTYPES
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the data in `file`


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_header(path: Path) -> dict[str, TensorEntry]:
    """Parse and check one safetensors header; every failure names the file, tensor and value."""
    require_file(path)
    size = path.stat().st_size
    if size < 8:
        raise ValueError(f"{path}: truncated: {size} bytes, a safetensors file has at least 8")
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > MAX_HEADER_BYTES or header_len > size - 8:
            raise ValueError(
                f"{path}: truncated or corrupt: header length field says {header_len} bytes, "
                f"file has {size - 8} after it (at most {MAX_HEADER_BYTES})"
            )
        header = parse_json(f.read(header_len), f"{path}: header")
    if not isinstance(header, dict):
        raise ValueError(f"{path}: header: expected a JSON object, got {type(header).__name__}")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError(f"{path}: __metadata__ = {metadata!r}: expected an object of strings")
    data_start, data_size = 8 + header_len, size - 8 - header_len
    entries, spans = {}, []
    for name, entry in header.items():
        where = f"{path}: tensor {name}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: header entry {entry!r} is not an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in STORED_DTYPES:
            raise ValueError(f"{where}: dtype {dtype!r} is not one of {', '.join(STORED_DTYPES)}")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise ValueError(f"{where}: shape {shape!r} is not a list of non-negative integers")
        if len(shape) > MAX_DIMS:
            raise ValueError(f"{where}: shape {shape!r} has more than {MAX_DIMS} dimensions")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(_is_int(o) and o >= 0 for o in offsets)
        ):
            raise ValueError(
                f"{where}: data_offsets {offsets!r} is not [begin, end] of non-negative integers"
            )
        begin, end = offsets
        if begin > end or end > data_size:
            raise ValueError(
                f"{where}: data_offsets {offsets} lie outside the data area of {data_size} bytes "
                "(truncated file?)"
            )
        n_bytes = math.prod(shape) * STORED_DTYPES[dtype].itemsize
        if end - begin != n_bytes:
            raise ValueError(
                f"{where}: data_offsets {offsets} span {end - begin} bytes, but {dtype} of shape "
                f"{tuple(shape)} needs {n_bytes}"
            )
        spans.append((begin, end, name))
        entries[name] = TensorEntry(path, dtype, tuple(shape), data_start + begin)
    spans.sort()
    for (_, end, first), (begin, _, second) in zip(spans, spans[1:], strict=False):
        if begin < end:
            raise ValueError(f"{path}: tensors {first} and {second} overlap at byte {begin}")
    covered = 0  # the spans, in order, must tile the data area exactly
    for begin, end, _ in spans:
        if begin > covered:
            raise ValueError(f"{path}: bytes {covered} to {begin} belong to no tensor (a gap)")
        covered = end
    if covered != data_size:
        raise ValueError(
            f"{path}: the tensors cover {covered} of the {data_size} bytes of the data area"
        )
    return entries


def _shard_names(index: Path) -> tuple[dict[str, str], list[str]]:
    weight_map = read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise ValueError(f"{index}: weight_map = {weight_map!r}: expected an object")
    for file in weight_map.values():
        if not isinstance(file, str) or not file or "/" in file or file.startswith("."):
            raise ValueError(f"{index}: shard name {file!r} is not a plain file name")
    return weight_map, sorted(set(weight_map.values()))


def read_tensor_entries(model_dir: Path) -> dict[str, TensorEntry]:
    """The checked headers of the directory's tensors: model.safetensors, or the shards of
    model.safetensors.index.json (each tensor in the shard the index names, and only there)."""
    model_dir = Path(model_dir)
    single, index = model_dir / SINGLE_FILE, model_dir / INDEX_FILE
    has_single, has_index = path_kind(single) != "missing", path_kind(index) != "missing"
    if has_single and has_index:
        raise ValueError(f"{model_dir}: holds both {SINGLE_FILE} and {INDEX_FILE}; keep one")
    if has_single:
        return read_header(single)
    if not has_index:
        raise FileNotFoundError(f"{model_dir}: no {SINGLE_FILE} and no {INDEX_FILE}")
    weight_map, files = _shard_names(index)
    entries: dict[str, TensorEntry] = {}
    for file in files:
        for name, entry in read_header(model_dir / file).items():
            if weight_map.get(name) != file:
                raise ValueError(
                    f"{model_dir / file}: holds {name}, which {INDEX_FILE} maps to "
                    f"{weight_map.get(name)!r}"
                )
            entries[name] = entry
    for name, file in weight_map.items():
        if name not in entries:
            raise ValueError(f"{index}: maps {name} to {file}, which does not hold it")
    return entries


def read_arrays(entries: dict[str, TensorEntry]) -> dict[str, np.ndarray]:
    """The tensors `entries` describe, as read-only numpy arrays (BF16 widened to float32)."""
    maps: dict[Path, mmap.mmap] = {}
    tensors = {}
    for name, entry in entries.items():
        if entry.file not in maps:
            with open(entry.file, "rb") as f:
                maps[entry.file] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        count = math.prod(entry.shape)
        dtype = STORED_DTYPES[entry.dtype]
        array = np.frombuffer(maps[entry.file], dtype=dtype, count=count, offset=entry.offset)
        array = array.reshape(entry.shape)
        if entry.dtype == "BF16":
            array = (array.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = array
    return tensors


def load_tensors(model_dir: Path) -> dict[str, np.ndarray]:
    """Every tensor of the model directory's safetensors file(s), headers checked, as read-only
    numpy arrays (BF16 widened to float32). Which tensors a model needs: model_dir.py."""
    return read_arrays(read_tensor_entries(Path(model_dir)))
