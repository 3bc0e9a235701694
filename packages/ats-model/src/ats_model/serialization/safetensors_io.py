"""Reading and writing sets of tensors as safetensors files, one or sharded (never pickle).

A tensor set is one `model.safetensors`, or `model-0000i-of-0000n.safetensors` shards listed by
`model.safetensors.index.json` in the HF index format ({"metadata": {"total_size"}, "weight_map"}).
Headers are parsed and checked against the file size before any tensor is read, so a truncated or
malformed file gives an error naming the file instead of a crash deep inside a reader.
"""

import errno
import json
import math
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# The largest header safetensors itself accepts (100 MB); anything bigger is a corrupt length field.
MAX_HEADER_BYTES = 100_000_000

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def path_kind(path: Path) -> str:
    """What `path` is, in words ("file", "directory", "missing", "symlink loop", "character
    device", ...; symlinks followed), so that errors say what is wrong, not "no such file"."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "dangling symlink" if os.path.islink(path) else "missing"
    except OSError as e:
        return "symlink loop" if e.errno == errno.ELOOP else f"path that cannot be read ({e})"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    return "character device" if stat.S_ISCHR(mode) else "special file (not a regular file)"


def require_file(path: Path) -> None:
    """Raise unless `path` is a regular file (symlinks followed)."""
    kind = path_kind(path)
    if kind == "missing":
        raise FileNotFoundError(f"{path.name}: no such file in {path.parent}")
    if kind != "file":
        raise ValueError(f"{path.name}: is a {kind} in {path.parent}, not a regular file")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice")
        out[key] = value
    return out


def parse_json(raw: bytes, what: str) -> Any:
    """JSON from bytes; bad UTF-8, bad JSON, repeated keys and deep nesting name `what`."""
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except UnicodeDecodeError as e:
        raise ValueError(f"{what}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except RecursionError:
        raise ValueError(f"{what}: not JSON (nested too deeply)") from None
    except ValueError as e:  # JSONDecodeError, or a repeated key from the hook
        raise ValueError(f"{what}: not JSON ({e})") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class TensorInfo:
    """What a safetensors header says about one tensor, and which file holds it."""

    file: str
    dtype: torch.dtype
    shape: tuple[int, ...]


def read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Parse and validate one safetensors header: returns ({name: TensorInfo}, metadata)."""
    name = path.name
    require_file(path)
    file_size = path.stat().st_size
    if file_size < 8:
        raise ValueError(f"{name}: truncated: {file_size} bytes, a safetensors file has at least 8")
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > MAX_HEADER_BYTES or 8 + header_len > file_size:
            raise ValueError(
                f"{name}: truncated or corrupt: header length field says {header_len} bytes, "
                f"file has {file_size - 8} after it"
            )
        raw = f.read(header_len)
    header = parse_json(raw, f"{name}: corrupt header")
    if not isinstance(header, dict):
        raise ValueError(f"{name}: corrupt header: expected a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError(f"{name}: __metadata__ = {metadata!r}: expected an object of strings")
    data_size = file_size - 8 - header_len
    infos: dict[str, TensorInfo] = {}
    spans: list[tuple[int, int, str]] = []
    for key, entry in header.items():
        if not isinstance(entry, dict):
            raise ValueError(f"{name}: {key} has a malformed header entry {entry!r}")
        dtype_name, shape, offsets = (
            entry.get("dtype"),
            entry.get("shape"),
            entry.get("data_offsets"),
        )
        if dtype_name not in DTYPES:
            raise ValueError(f"{name}: {key} has unsupported dtype {dtype_name!r}")
        if not (
            isinstance(shape, list)
            and all(_is_int(d) and d >= 0 for d in shape)
            and isinstance(offsets, list)
            and len(offsets) == 2
            and all(_is_int(o) and o >= 0 for o in offsets)
        ):
            raise ValueError(f"{name}: {key} has a malformed header entry {entry!r}")
        dtype = DTYPES[dtype_name]
        n_bytes = math.prod(shape) * dtype.itemsize
        begin, end = offsets
        if end - begin != n_bytes:
            raise ValueError(
                f"{name}: {key} has data_offsets {offsets} ({end - begin} bytes) but shape "
                f"{tuple(shape)} of {dtype_name} needs {n_bytes} bytes"
            )
        if end > data_size:
            raise ValueError(
                f"{name}: truncated: {key} ends at byte {end} of the data section, "
                f"which has only {data_size} bytes"
            )
        infos[key] = TensorInfo(file=name, dtype=dtype, shape=tuple(shape))
        spans.append((begin, end, key))
    _check_spans(name, sorted(spans), data_size)
    return infos, metadata


def _check_spans(name: str, spans: list[tuple[int, int, str]], data_size: int) -> None:
    """The sorted (begin, end) spans must tile the data area, as the safetensors library requires:
    an overlap would read one tensor's bytes as another's."""
    for (_, end, first), (begin, _, second) in zip(spans, spans[1:], strict=False):
        if begin < end:
            raise ValueError(f"{name}: tensors {first} and {second} overlap at byte {begin}")
    covered = 0
    for begin, end, _ in spans:
        if begin > covered:
            raise ValueError(f"{name}: bytes {covered} to {begin} belong to no tensor (a gap)")
        covered = end
    if covered != data_size:
        raise ValueError(f"{name}: the tensors cover {covered} of the {data_size} data bytes")


def shard_name(i: int, n: int) -> str:
    return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def _plan_shards(tensors: dict[str, torch.Tensor], max_shard_bytes: int) -> list[list[str]]:
    """Greedy split in state-dict order; a tensor larger than the limit gets a shard of its own."""
    shards: list[list[str]] = [[]]
    size = 0
    for key, t in tensors.items():
        n_bytes = t.numel() * t.element_size()
        if shards[-1] and size + n_bytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(key)
        size += n_bytes
    return shards


def _remove_previous(directory: Path) -> None:
    """Drop tensor files a previous save left, so the directory never holds two tensor sets."""
    for path in [directory / SINGLE_FILE, directory / INDEX_FILE]:
        path.unlink(missing_ok=True)
    for path in directory.glob("model-*-of-*.safetensors"):
        path.unlink()


def write_tensors(
    directory: Path,
    tensors: dict[str, torch.Tensor],
    metadata: dict[str, str],
    max_shard_bytes: int,
) -> list[str]:
    """Write `tensors` (one file, or shards + index above `max_shard_bytes`); returns file names."""
    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
    ptrs: dict[tuple[int, int], str] = {}
    for key, t in tensors.items():
        # safetensors refuses aliased tensors; name the pair so the caller knows what is tied.
        ptr = (t.untyped_storage().data_ptr(), t.storage_offset())
        if t.numel() > 0 and ptr in ptrs:
            raise ValueError(f"tensors {ptrs[ptr]} and {key} share memory; save only one of them")
        ptrs[ptr] = key
    cpu = {k: t.detach().to("cpu").contiguous() for k, t in tensors.items()}
    _remove_previous(directory)
    total = sum(t.numel() * t.element_size() for t in cpu.values())
    if total <= max_shard_bytes:
        save_file(cpu, str(directory / SINGLE_FILE), metadata=metadata)
        return [SINGLE_FILE]
    plan = _plan_shards(cpu, max_shard_bytes)
    weight_map: dict[str, str] = {}
    files = []
    for i, keys in enumerate(plan):
        file = shard_name(i, len(plan))
        save_file({k: cpu[k] for k in keys}, str(directory / file), metadata=metadata)
        weight_map.update(dict.fromkeys(keys, file))
        files.append(file)
    index = {"metadata": {"total_size": total, **metadata}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return [*files, INDEX_FILE]


def read_tensor_infos(directory: Path) -> tuple[dict[str, TensorInfo], dict[str, str], str]:
    """Headers of the tensor set in `directory`: ({name: TensorInfo}, metadata, source file name).

    The source is model.safetensors or the index file; names in the index must match the shards.
    """
    single, index = directory / SINGLE_FILE, directory / INDEX_FILE
    has_single, has_index = path_kind(single) != "missing", path_kind(index) != "missing"
    if has_single and has_index:
        raise ValueError(f"{directory}: holds both {SINGLE_FILE} and {INDEX_FILE}; keep one")
    if has_single:
        infos, metadata = read_header(single)
        return infos, metadata, SINGLE_FILE
    if not has_index:
        raise FileNotFoundError(f"{directory}: no {SINGLE_FILE} and no {INDEX_FILE}")
    require_file(index)
    data = parse_json(index.read_bytes(), INDEX_FILE)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        raise ValueError(f"{INDEX_FILE}: not an index (a JSON object with a 'weight_map' object)")
    for file in weight_map.values():
        if not isinstance(file, str) or not file or os.sep in file or file.startswith("."):
            raise ValueError(f"{INDEX_FILE}: shard name {file!r} is not a plain file name")
    infos = {}
    metadata: dict[str, str] = {}
    for file in sorted(set(weight_map.values())):
        shard_infos, metadata = read_header(directory / file)
        for key in shard_infos:
            if weight_map.get(key) != file:
                raise ValueError(
                    f"{file}: holds {key}, which {INDEX_FILE} maps to {weight_map.get(key)}"
                )
        infos.update(shard_infos)
    for key, file in weight_map.items():
        if key not in infos:
            raise ValueError(f"{INDEX_FILE}: maps {key} to {file}, which does not hold it")
    return infos, metadata, INDEX_FILE


def load_tensors(directory: Path, infos: dict[str, TensorInfo]) -> dict[str, torch.Tensor]:
    """Read every tensor named in `infos` (headers already validated by read_tensor_infos)."""
    by_file: dict[str, list[str]] = {}
    for key, info in infos.items():
        by_file.setdefault(info.file, []).append(key)
    tensors = {}
    for file, keys in by_file.items():
        with safe_open(str(directory / file), framework="pt", device="cpu") as f:
            for key in keys:
                tensors[key] = f.get_tensor(key)
    return tensors
