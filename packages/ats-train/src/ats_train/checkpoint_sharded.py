"""Sharded training checkpoints (checkpoint.format = "sharded", issue 6): every rank writes its own
shard of the optimizer state, nothing is gathered; rank 0 still writes the model directory.

    step-000123/                    the model directory (gathered weights: 2-4 bytes/param on rank 0)
      trainer_state/
        state.json                  scheduler, loader, backend, knobs, orchestrator (as "full")
        sharded.json                the layout: writer (safetensors | deepspeed), backend, world
                                    size, stage
        rng/rank-00000.json ...     every rank's RNG streams
        optimizer_shards/           writer safetensors (single, ddp, fsdp2): rank-<r>.safetensors
                                    + rank-<r>.json per rank, param_groups.json
        deepspeed/zero/             writer deepspeed: DeepSpeed's own mp_rank_* / zero_pp_rank_* files
      manifest.json                 sha256 of every file, shards included

checkpoint.py's atomicity holds: rank 0 creates step-N.tmp/ | barrier | every rank writes its shard
and RNG, rank 0 the model directory and state | barrier | rank 0 hashes every file into the
manifest, renames, updates `latest`. A SIGKILL anywhere before the rename leaves only a .tmp dir.

Resume reads whatever the checkpoint holds, whatever checkpoint.format says now (it decides how the
next checkpoints are written): no sharded.json is the "full" format (any backend, any world size);
safetensors shards reshard on load (single, ddp or fsdp2, any world size; backends/
optimizer_shards.py); DeepSpeed's ZeRO shards resume only under deepspeed with the same world size
and ZeRO stage (no universal-checkpoint conversion), and load without unpickling code
(backends/deepspeed_load.py).

Format version 1 held torch.distributed.checkpoint files, whose reader unpickles its `.metadata`:
a checkpoint from elsewhere could run code on resume. This ats-train refuses them (issue 22).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ats_train.checkpoint import (
    CheckpointError,
    begin_checkpoint,
    checkpoints_dir,
    failed_write_removed,
    load_tree,
    publish_checkpoint,
    read_json,
    save_tree,
    step_dir_name,
)

if TYPE_CHECKING:  # backends import this module for the directory names below
    from ats_train.backends.base import Backend

TRAINER_STATE = "trainer_state"
LAYOUT = "sharded.json"
LAYOUT_VERSION = 2  # 1: torch.distributed.checkpoint shards (unpickled on load: refused)
RNG_DIR = "rng"
SHARDS_DIR = "optimizer_shards"
DEEPSPEED_DIR = "deepspeed"
DEEPSPEED_TAG = "zero"  # DeepSpeed's checkpoint tag: its files go to deepspeed/zero/
# which backends read each writer's shards
READERS = {"safetensors": ("single", "ddp", "fsdp2"), "deepspeed": ("deepspeed",)}


def _rank_name(rank: int) -> str:
    return f"rank-{rank:05d}"


def save_sharded_checkpoint(
    run_dir: Path,
    step: int,
    backend: Backend,
    optimizer: torch.optim.Optimizer,
    write_main: Callable[[Path], None],
    rng: dict[str, Any],
    keep_last: int,
) -> Path:
    """Called on every rank. `write_main(tmp_dir)` (main rank) writes the model directory and
    trainer_state/state; `rng` is this rank's RNG streams. Returns the step directory."""
    if backend.is_main:
        (begin_checkpoint(run_dir, step) / TRAINER_STATE).mkdir()
    backend.barrier()  # stale .tmp dirs are gone and the new one exists before any rank writes
    tmp = checkpoints_dir(run_dir) / f"{step_dir_name(step)}.tmp"
    state_dir = tmp / TRAINER_STATE
    with failed_write_removed(run_dir, step):
        backend.save_optimizer_shards(optimizer, state_dir)  # each rank its own shard
        (state_dir / RNG_DIR).mkdir(exist_ok=True)
        save_tree(state_dir / RNG_DIR, _rank_name(backend.rank), rng)
        if backend.is_main:
            write_main(tmp)
            layout = {"format_version": LAYOUT_VERSION, **backend.sharded_layout()}
            (state_dir / LAYOUT).write_text(json.dumps(layout, indent=1))
    backend.barrier()  # every rank's files are complete before rank 0 hashes them
    if backend.is_main:
        return publish_checkpoint(run_dir, step, keep_last)
    return checkpoints_dir(run_dir) / step_dir_name(step)


def read_layout(checkpoint: Path) -> dict[str, Any] | None:
    """The sharded layout a checkpoint was written with; None for a "full" checkpoint."""
    path = Path(checkpoint) / TRAINER_STATE / LAYOUT
    if not path.is_file():
        return None
    layout = read_json(path)
    if not isinstance(layout, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(layout).__name__}")
    version = layout.get("format_version")
    if version == 1:
        raise CheckpointError(
            f"{path}: format_version 1, optimizer shards in torch.distributed.checkpoint's "
            "format, which unpickles on load and can run code: this ats-train does not read it. "
            "Resume it with the ats-train that wrote it, with checkpoint.format = 'full', and "
            "resume here from that run's next checkpoint"
        )
    if version != LAYOUT_VERSION:
        raise CheckpointError(
            f"{path}: format_version {version!r}, this ats-train reads {LAYOUT_VERSION}"
        )
    for key, kind in (("writer", str), ("backend", str), ("world_size", int)):
        if not isinstance(layout.get(key), kind):
            raise CheckpointError(f"{path}: {key!r} missing or not a {kind.__name__}")
    return layout


def _describe(layout: dict[str, Any]) -> str:
    text = f"{layout['backend']} on {layout['world_size']} rank(s)"
    if "zero_stage" in layout:
        text += f", ZeRO stage {layout['zero_stage']}"
    return text


def check_resumable(checkpoint: Path, backend: Backend) -> None:
    """CheckpointError unless this backend, at this world size, can read the checkpoint's shards
    (a "full" checkpoint resumes anywhere). Cheap: called before anything is built or written."""
    saved = read_layout(checkpoint)
    if saved is None:
        return
    writer = saved["writer"]
    if writer not in READERS:
        raise CheckpointError(f"{checkpoint / TRAINER_STATE / LAYOUT}: unknown writer {writer!r}")
    current = backend.sharded_layout()  # colossalai raises: it reads only "full" checkpoints
    if current["writer"] != writer:
        raise CheckpointError(
            f"{checkpoint} holds sharded optimizer state written by {_describe(saved)} "
            f"({writer} shards, which only {' / '.join(READERS[writer])} read); this run is "
            f"{_describe(current)}"
        )
    if writer == "deepspeed" and (
        saved["world_size"] != current["world_size"] or saved["zero_stage"] != current["zero_stage"]
    ):
        raise CheckpointError(
            f"{checkpoint} holds DeepSpeed ZeRO shards written by {_describe(saved)}; this run is "
            f"{_describe(current)}. DeepSpeed's sharded checkpoints resume only with the same world "
            "size and ZeRO stage (converting them is not supported): resume with those, or write "
            "checkpoint.format = 'full' checkpoints, which resume anywhere"
        )


def load_rank_rng(checkpoint: Path, layout: dict[str, Any], rank: int, world_size: int) -> Any:
    """This rank's saved RNG streams at the saved world size. On another world size no rank has a
    counterpart, and every rank takes rank 0's (what a "full" checkpoint holds)."""
    source = rank if world_size == layout["world_size"] else 0
    return load_tree(Path(checkpoint) / TRAINER_STATE / RNG_DIR, _rank_name(source))
