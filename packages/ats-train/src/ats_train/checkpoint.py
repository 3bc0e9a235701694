"""Training checkpoints (ARCHITECTURE.md section 4): atomic step directories with a sha256 manifest.

    run_dir/checkpoints/
      step-000123/             the model directory (config.json, model.safetensors, tokenizer.json)
        trainer_state/         optimizer, scheduler, RNG, loader position, orchestrator history
        manifest.json          sha256 of every other file
      latest                   "step-000123", replaced atomically after the step dir is complete

A step is written into step-000123.tmp/, fsynced, renamed into place, and only then is `latest`
replaced (temp file + os.replace), so a crash at any moment leaves `latest` naming a complete
checkpoint. A write that fails (a full disk) removes its .tmp dir and raises CheckpointError;
`latest` still names the previous checkpoint. Nothing here pickles: tensors go to safetensors,
everything else to JSON, and every JSON file read is checked for its shape before use. A sharded
checkpoint (checkpoint_sharded.py) adds every rank's optimizer shard (safetensors + JSON, or
DeepSpeed's own files, loaded weights-only) inside trainer_state/; the manifest covers those too.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

MANIFEST = "manifest.json"
LATEST = "latest"
_STEP_DIR = re.compile(r"^step-(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, corrupted, or made for another model."""


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


# ----------------------------------------------------------------------------------------------
# Trees of tensors and plain values <-> (JSON, safetensors). Tuples, non-string dict keys (the
# optimizer's integer parameter ids) and numpy arrays are tagged so they load back as they were.


def _encode(obj: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors[path] = obj.detach().to("cpu").contiguous().clone()
        return {"__tensor__": path}
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.tolist(), "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, f"{path}.{i}", tensors) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, f"{path}.{i}", tensors) for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _encode(v, f"{path}.{k}", tensors) for k, v in obj.items()}
        return {
            "__items__": [
                [_encode(k, f"{path}.k{i}", tensors), _encode(v, f"{path}.{i}", tensors)]
                for i, (k, v) in enumerate(obj.items())
            ]
        }
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(
        f"cannot checkpoint {type(obj).__name__} at {path!r}: not a tensor or JSON value"
    )


def _decode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        return tensors[obj["__tensor__"]]
    if "__ndarray__" in obj:
        return np.asarray(obj["__ndarray__"], dtype=obj["dtype"])
    if "__tuple__" in obj:
        return tuple(_decode(v, tensors) for v in obj["__tuple__"])
    if "__items__" in obj:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in obj["__items__"]}
    return {k: _decode(v, tensors) for k, v in obj.items()}


def save_tree(directory: Path, name: str, tree: Any) -> None:
    """Write `tree` as name.json (+ name.safetensors when it holds tensors)."""
    tensors: dict[str, torch.Tensor] = {}
    encoded = _encode(tree, name, tensors)
    (directory / f"{name}.json").write_text(json.dumps(encoded))
    if tensors:
        save_file(tensors, str(directory / f"{name}.safetensors"))


def read_json(path: Path) -> Any:
    """A checkpoint's JSON file; CheckpointError naming it when it is not UTF-8 JSON."""
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path} is not UTF-8 text: {e}") from e
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from e
    except RecursionError as e:
        raise CheckpointError(f"{path} is nested too deeply to be a checkpoint file") from e


def load_tree(directory: Path, name: str) -> Any:
    tensor_file = directory / f"{name}.safetensors"
    try:
        tensors = load_file(str(tensor_file)) if tensor_file.exists() else {}
    except SafetensorError as e:
        raise CheckpointError(f"{tensor_file} is not a readable safetensors file: {e}") from e
    document = read_json(directory / f"{name}.json")
    try:
        return _decode(document, tensors)
    except (KeyError, TypeError, ValueError, RecursionError) as e:
        raise CheckpointError(
            f"{directory / name}.json does not describe a checkpointed value: {e!r}"
        ) from e


# ----------------------------------------------------------------------------------------------
# Manifest, atomic write, `latest`, keep-last-N.


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _hash_and_sync(path: Path) -> str:
    """sha256 of a written file, after forcing it to disk."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())
    return _sha256(path)


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(directory: Path, step: int) -> None:
    files = {p.relative_to(directory).as_posix(): _hash_and_sync(p) for p in _files(directory)}
    manifest = {"format_version": 1, "step": step, "files": files}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1))
    for sub in sorted({p.parent for p in _files(directory)} | {directory}):
        _fsync_dir(sub)


def verify_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of a complete checkpoint; CheckpointError naming the first bad file."""
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"checkpoint {directory} has no {MANIFEST} (incomplete write?)")
    manifest = read_json(manifest_path)
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not (
        isinstance(files, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())
    ):
        raise CheckpointError(
            f"{manifest_path}: expected an object whose 'files' maps each file to its sha256"
        )
    for rel, expected in files.items():
        path = directory / rel
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise CheckpointError(f"{manifest_path}: {rel!r} is not a path inside the checkpoint")
        if not path.is_file():
            raise CheckpointError(f"checkpoint {directory}: {rel} listed in {MANIFEST} is missing")
        actual = _sha256(path)
        if actual != expected:
            raise CheckpointError(
                f"checkpoint {directory}: {rel} has sha256 {actual[:12]}..., "
                f"{MANIFEST} says {expected[:12]}... (corrupted)"
            )
    return manifest


def _write_latest(ckpt_root: Path, name: str) -> None:
    tmp = ckpt_root / f".{LATEST}.tmp"
    with open(tmp, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, ckpt_root / LATEST)
    _fsync_dir(ckpt_root)


def _step_dirs(ckpt_root: Path) -> list[tuple[int, Path]]:
    found = []
    for p in ckpt_root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), p))
    return sorted(found)


def save_checkpoint(
    run_dir: Path, step: int, write: Callable[[Path], None], keep_last: int
) -> Path:
    """Run `write(tmp_dir)` to fill a step directory, then publish it atomically; returns it."""
    with failed_write_removed(run_dir, step):
        write(begin_checkpoint(run_dir, step))
    return publish_checkpoint(run_dir, step, keep_last)


@contextmanager
def failed_write_removed(run_dir: Path, step: int) -> Iterator[None]:
    """A write into step-NNNNNN.tmp/ that fails for want of space or on an I/O error removes the
    .tmp dir and raises CheckpointError: `latest` still names the previous checkpoint."""
    try:
        yield
    except (OSError, SafetensorError) as e:
        tmp = checkpoints_dir(run_dir) / f"{step_dir_name(step)}.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        previous = read_latest_name(run_dir)
        raise CheckpointError(
            f"could not write the checkpoint of step {step} under {checkpoints_dir(run_dir)}: "
            f"{e}; `latest` still names {previous or 'no checkpoint'}"
        ) from e


def begin_checkpoint(run_dir: Path, step: int) -> Path:
    """The empty step-NNNNNN.tmp/ to write into (one writer: the main rank). When several ranks
    write shards, they start only after this returned (a barrier), and the main rank publishes only
    after all of them finished (another barrier)."""
    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob("step-*.tmp"):  # left by a crash mid-write; never named by `latest`
        shutil.rmtree(stale)
    tmp = root / f"{step_dir_name(step)}.tmp"
    tmp.mkdir()
    return tmp


def publish_checkpoint(run_dir: Path, step: int, keep_last: int) -> Path:
    """Hash every file of the written step-NNNNNN.tmp/ into its manifest, rename it into place,
    point `latest` at it, prune to the newest keep_last; returns the step directory."""
    root = checkpoints_dir(run_dir)
    final = root / step_dir_name(step)
    tmp = root / f"{final.name}.tmp"
    with failed_write_removed(run_dir, step):
        write_manifest(tmp, step)
    if final.exists():  # written before a crash that came ahead of its `latest` update
        if read_latest_name(run_dir) == final.name:
            raise CheckpointError(f"refusing to overwrite {final}: `latest` names it")
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    _write_latest(root, final.name)
    latest_name = final.name
    for old_step, path in _step_dirs(root)[:-keep_last]:
        if path.name != latest_name and old_step < step:
            shutil.rmtree(path)
    return final


def read_latest_name(run_dir: Path) -> str | None:
    latest = checkpoints_dir(run_dir) / LATEST
    if not latest.is_file():
        return None
    try:
        return latest.read_bytes().decode("utf-8").strip()
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{latest} is not UTF-8 text: {e}") from e


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The verified checkpoint `latest` names, None when the run dir has none."""
    name = read_latest_name(run_dir)
    if name is None:
        return None
    if not _STEP_DIR.match(name):
        raise CheckpointError(f"{checkpoints_dir(run_dir) / LATEST} holds {name!r}, not a step")
    path = checkpoints_dir(run_dir) / name
    if not path.is_dir():
        raise CheckpointError(f"{checkpoints_dir(run_dir) / LATEST} names {name}, which is missing")
    verify_manifest(path)
    return path


def checkpoint_step(path: Path) -> int:
    m = _STEP_DIR.match(Path(path).name)
    if m is None:
        raise CheckpointError(f"{path} is not a step-NNNNNN checkpoint directory")
    return int(m.group(1))
