"""Optimizer state <-> one safetensors shard per rank plus JSON, for the single, ddp and fsdp2
backends' sharded checkpoints: every rank writes only what it holds, any layout reads it back.

    optimizer_shards/
      param_groups.json        rank 0: torch's param_groups (lr, betas, ...), params by name
      rank-00000.safetensors   this rank's chunks, one tensor per (parameter, state) it writes
      rank-00000.json          for each of them: parameter, state name, global shape, offsets

Why not torch.distributed.checkpoint: its reader pickle.load()s the `.metadata` file and
torch.load()s non-tensor values, so a checkpoint from elsewhere (the manifest's sha256 is written
by the same hand) could run code on resume (issue 22). Here nothing is unpickled: safetensors holds
only bytes with a dtype and shape, the rest is JSON, and every index entry is checked (types,
bounds, chunks of one tensor disjoint and covering it exactly) before a byte is copied.

The state dict is torch's distributed one (get_optimizer_state_dict, full_state_dict=False): keyed
by parameter name, so it does not depend on the wrapper (DDP's `module.` prefix is stripped) or on
the optimizer's parameter order. fsdp2 hands DTensor shards, single and ddp plain tensors, which
rank 0 writes once (ddp's replicas are equal). Each chunk is stored with its offsets in the global
tensor, so a state saved by fsdp2 on 2 ranks loads into plain tensors on 1 rank, into fsdp2 shards
on 2 or into ddp replicas: each rank copies the parts of the saved chunks that overlap what it
holds (the resharding DCP did).
"""

from __future__ import annotations

import json
import math
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor, Replicate, Shard

from ats_train.checkpoint import CheckpointError, load_tree, save_tree

SHARDED = StateDictOptions(full_state_dict=False)
PARAM_GROUPS = "param_groups"
INDEX_VERSION = 1


def _rank_file(rank: int) -> str:
    return f"rank-{rank:05d}"


@dataclass(frozen=True)
class Chunk:
    """A box of a tensor: where it starts in the global tensor and how large it is per dim."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    def overlap(self, other: Chunk) -> Chunk | None:
        lo = [max(a, b) for a, b in zip(self.offsets, other.offsets, strict=True)]
        hi = [
            min(a + n, b + m)
            for a, n, b, m in zip(self.offsets, self.sizes, other.offsets, other.sizes, strict=True)
        ]
        if any(h <= lo_ for lo_, h in zip(lo, hi, strict=True)):
            return None
        return Chunk(tuple(lo), tuple(h - lo_ for lo_, h in zip(lo, hi, strict=True)))

    def slices_within(self, outer: Chunk) -> tuple[slice, ...]:
        """This box's index into a tensor that holds `outer`."""
        return tuple(
            slice(o - p, o - p + n)
            for o, n, p in zip(self.offsets, self.sizes, outer.offsets, strict=True)
        )

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)


def _local_chunk(value: torch.Tensor, rank: int) -> tuple[Chunk, torch.Tensor, bool]:
    """(this rank's box of the global tensor, the local tensor, whether this rank writes it).
    A replica is written by one holder: rank 0 for plain tensors, coordinate 0 on every
    replicated mesh dim for a DTensor."""
    if not isinstance(value, DTensor):
        return Chunk((0,) * value.ndim, tuple(value.shape)), value, rank == 0
    for placement in value.placements:
        if not isinstance(placement, (Shard, Replicate)):
            raise TypeError(f"optimizer state with placement {placement} cannot be checkpointed")
    (meta,) = value.__create_chunk_list__()  # a DTensor holds one box (DCP's own protocol)
    local = value.to_local()
    chunk = Chunk(tuple(meta.offsets), tuple(meta.sizes))
    if chunk.sizes != tuple(local.shape):
        raise RuntimeError(f"DTensor local shape {tuple(local.shape)} is not its box {chunk}")
    coordinate = value.device_mesh.get_coordinate()
    writes = coordinate is not None and all(
        c == 0 for c, p in zip(coordinate, value.placements, strict=True) if p.is_replicate()
    )
    return chunk, local, writes


def save_optimizer_shards(
    model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path, rank: int
) -> None:
    """Every rank (no collective): its chunks of the optimizer state into directory/."""
    state = get_optimizer_state_dict(model, optimizer, options=SHARDED)
    directory.mkdir(exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    index: dict[str, dict[str, Any]] = {}
    for param, per_param in state["state"].items():
        for name, value in per_param.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"optimizer state {param}/{name} is a {type(value).__name__}")
            chunk, local, writes = _local_chunk(value, rank)
            if not writes or chunk.numel == 0:
                continue
            key = f"{param}/{name}"
            tensors[key] = local.detach().to("cpu").contiguous()
            index[key] = {
                "param": param,
                "state": name,
                "global_shape": list(value.shape),
                "offsets": list(chunk.offsets),
            }
    save_file(tensors, str(directory / f"{_rank_file(rank)}.safetensors"))
    document = {"format_version": INDEX_VERSION, "chunks": index}
    (directory / f"{_rank_file(rank)}.json").write_text(json.dumps(document, indent=1))
    if rank == 0:
        save_tree(directory, PARAM_GROUPS, state["param_groups"])


# ----------------------------------------------------------------------------------------------
# Loading: the index of every rank's chunks, checked before anything is copied.


@dataclass(frozen=True)
class SavedChunk:
    file: Path
    key: str
    box: Chunk


def _is_int_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    )


def _read_rank_index(json_path: Path) -> dict[str, Any]:
    try:
        document = json.loads(json_path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise CheckpointError(f"{json_path}: not a JSON shard index: {e}") from e
    if not (isinstance(document, dict) and isinstance(document.get("chunks"), dict)):
        raise CheckpointError(f"{json_path}: expected an object with a 'chunks' object")
    if document.get("format_version") != INDEX_VERSION:
        raise CheckpointError(
            f"{json_path}: format_version {document.get('format_version')!r}, this ats-train "
            f"reads {INDEX_VERSION}"
        )
    return document["chunks"]


def read_index(directory: Path) -> dict[tuple[str, str], tuple[tuple[int, ...], list[SavedChunk]]]:
    """(parameter, state) -> (global shape, the saved chunks that tile it), from every rank's
    files; CheckpointError naming the file for anything malformed, out of bounds, overlapping or
    incomplete."""
    found: dict[tuple[str, str], tuple[tuple[int, ...], list[SavedChunk]]] = {}
    json_paths = sorted(directory.glob("rank-*.json"))
    if not json_paths:
        raise CheckpointError(f"{directory}: no rank-NNNNN.json optimizer shard index")
    for json_path in json_paths:
        tensor_path = json_path.with_suffix(".safetensors")
        chunks = _read_rank_index(json_path)
        try:
            with safe_open(str(tensor_path), framework="pt") as f:
                shapes = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}  # noqa: SIM118
        except (OSError, SafetensorError) as e:
            raise CheckpointError(f"{tensor_path}: not a readable safetensors file: {e}") from e
        if set(shapes) != set(chunks):
            raise CheckpointError(f"{json_path} and {tensor_path.name} list different tensors")
        for key, entry in chunks.items():
            where = f"{json_path}: {key!r}"
            if not (
                isinstance(entry, dict)
                and isinstance(entry.get("param"), str)
                and isinstance(entry.get("state"), str)
                and _is_int_list(entry.get("global_shape"))
                and _is_int_list(entry.get("offsets"))
            ):
                raise CheckpointError(f"{where}: expected param, state, global_shape, offsets")
            shape, box = tuple(entry["global_shape"]), Chunk(tuple(entry["offsets"]), shapes[key])
            if not (len(shape) == len(box.offsets) == len(box.sizes)) or any(
                o + n > s for o, n, s in zip(box.offsets, box.sizes, shape, strict=True)
            ):
                raise CheckpointError(f"{where}: chunk {box} lies outside the shape {list(shape)}")
            name = (entry["param"], entry["state"])
            saved_shape, saved = found.setdefault(name, (shape, []))
            if saved_shape != shape:
                raise CheckpointError(f"{where}: shape {list(shape)}, another rank's {saved_shape}")
            if any(box.overlap(other.box) is not None for other in saved):
                raise CheckpointError(f"{where}: chunk {box} overlaps another rank's")
            saved.append(SavedChunk(tensor_path, key, box))
    for (param, state), (shape, saved) in found.items():
        if sum(c.box.numel for c in saved) != math.prod(shape):
            raise CheckpointError(f"{directory}: the chunks of {param}/{state} do not cover it")
    return found


class _OpenFiles:
    """Each shard file opened once (memory-mapped), all closed together."""

    def __init__(self, stack: ExitStack) -> None:
        self.stack, self.files = stack, {}

    def __getitem__(self, path: Path) -> Any:
        if path not in self.files:
            self.files[path] = self.stack.enter_context(safe_open(str(path), framework="pt"))
        return self.files[path]


def _fill(target: torch.Tensor, rank: int, saved: list[SavedChunk], files: _OpenFiles) -> None:
    """Copy the saved chunks' overlap with this rank's box of `target` into its local tensor."""
    box, local, _ = _local_chunk(target, rank)
    for chunk in saved:
        part = box.overlap(chunk.box)
        if part is None:
            continue
        f = files[chunk.file]
        if local.ndim == 0:  # a scalar (Adam's step): one chunk, the whole of it
            source = f.get_tensor(chunk.key)
        else:
            source = f.get_slice(chunk.key)[part.slices_within(chunk.box)]
        if source.dtype != local.dtype:
            raise CheckpointError(
                f"{chunk.file}: {chunk.key} is {source.dtype}, this run's state is {local.dtype}"
            )
        if local.ndim == 0:
            local.copy_(source)
        else:
            local[part.slices_within(box)].copy_(source)


def load_optimizer_shards(
    model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path, rank: int
) -> None:
    """Every rank: the saved state, resharded to this run's layout, into the optimizer."""
    # On an optimizer that has not stepped, get_optimizer_state_dict creates the Adam state with a
    # zero-lr step (parameters unchanged), so the template filled in place has every tensor.
    state = get_optimizer_state_dict(model, optimizer, options=SHARDED)
    index = read_index(directory)
    wanted = {(p, n) for p, per_param in state["state"].items() for n in per_param}
    if wanted != set(index):
        missing, extra = sorted(wanted - set(index)), sorted(set(index) - wanted)
        raise CheckpointError(
            f"{directory}: the sharded optimizer state does not fit this run's optimizer "
            f"(another model?): missing {missing[:3]}, not in this model {extra[:3]}"
        )
    for (param, name), (shape, _) in index.items():
        if tuple(state["state"][param][name].shape) != shape:
            raise CheckpointError(
                f"{directory}: {param}/{name} has shape {list(shape)}, this run's "
                f"{list(state['state'][param][name].shape)} (another model?)"
            )
    groups = load_tree(directory, PARAM_GROUPS)
    names = [g["params"] for g in state["param_groups"]]
    if (
        not isinstance(groups, list)
        or [g.get("params") if isinstance(g, dict) else None for g in groups] != names
    ):
        raise CheckpointError(f"{directory}: {PARAM_GROUPS}.json names other parameter groups")
    with ExitStack() as stack:
        files = _OpenFiles(stack)
        for (param, name), (_, saved) in index.items():
            _fill(state["state"][param][name], rank, saved, files)
    state["param_groups"] = groups
    set_optimizer_state_dict(model, optimizer, state, options=SHARDED)
