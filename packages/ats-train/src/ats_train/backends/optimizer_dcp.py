"""Optimizer state <-> torch.distributed.checkpoint (DCP), for the single, ddp and fsdp2 backends'
sharded checkpoints: every rank writes only what it holds, DCP reshards on load.

The state dict is torch's distributed one (get_optimizer_state_dict, full_state_dict=False): keyed
by parameter name, so it does not depend on the wrapper (DDP's `module.` prefix is stripped) or on
the optimizer's parameter order. fsdp2 hands DTensor shards, single and ddp plain tensors (ddp's
replicas are written once: DCP's planner deduplicates them). DCP stores the global shape of every
tensor, so a state saved by fsdp2 on 2 ranks loads into plain tensors on 1 rank, into fsdp2 shards
on 2 or into ddp replicas: each rank reads the chunks that overlap what it holds.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from ats_train.checkpoint import CheckpointError

SHARDED = StateDictOptions(full_state_dict=False)


@contextmanager
def _single_process_if_no_group() -> Iterator[bool]:
    """Yields no_dist: True without a process group (the single backend). DCP then runs in this
    process alone, which is what we want; its warning saying it assumes so is silenced here."""
    no_dist = not dist.is_initialized()
    with warnings.catch_warnings():
        if no_dist:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield no_dist


def save_optimizer_dcp(model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
    """Every rank calls this (a collective under a process group): its shard of the optimizer state
    into directory/ (__<rank>_0.distcp files and the coordinator's .metadata)."""
    state = get_optimizer_state_dict(model, optimizer, options=SHARDED)
    with _single_process_if_no_group() as no_dist:
        dcp.save(state, checkpoint_id=directory, no_dist=no_dist)


def load_optimizer_dcp(model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
    """Every rank: the saved state, resharded to this run's layout, into the optimizer."""
    # On an optimizer that has not stepped, get_optimizer_state_dict creates the Adam state with a
    # zero-lr step (parameters unchanged), so the template DCP fills in place has every tensor.
    state = get_optimizer_state_dict(model, optimizer, options=SHARDED)
    with _single_process_if_no_group() as no_dist:
        try:
            dcp.load(state, checkpoint_id=directory, no_dist=no_dist)
        except CheckpointException as e:
            raise CheckpointError(
                f"{directory}: the sharded optimizer state does not load into this run's "
                f"optimizer (another model?): {e}"
            ) from e
    set_optimizer_state_dict(model, optimizer, state, options=SHARDED)
