"""Joining the torch.distributed process group that torchrun describes in the environment.

ATS never launches ranks itself (ARCHITECTURE.md, "Distributed backends"): torchrun (or another
launcher speaking the same env:// protocol) sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT, and each rank joins with gloo on CPU or NCCL on CUDA.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.distributed as dist

from ats_train.config import ConfigError

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device  # this rank's device: cuda:LOCAL_RANK, or the CPU


def join_process_group(backend_name: str, device: torch.device) -> RankInfo:
    """Init the default process group from torchrun's env; a clear error without torchrun."""
    missing = [k for k in TORCHRUN_ENV if k not in os.environ]
    if missing:
        raise ConfigError(
            f"parallel.backend = {backend_name!r} needs the environment torchrun sets; "
            f"{', '.join(missing)} not set. Launch with e.g. `torchrun --nproc-per-node 2 "
            f"-m ats_train.cli parallel.backend={backend_name} ...`"
        )
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    if device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(
                f"LOCAL_RANK = {local_rank} but this node has {torch.cuda.device_count()} CUDA "
                "device(s); use --nproc-per-node <= the GPU count"
            )
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        pg_backend = "nccl"
    elif device.type == "cpu":
        pg_backend = "gloo"
    else:
        raise ConfigError(f"parallel.backend = {backend_name!r} runs on cpu or cuda, not {device}")
    if not dist.is_initialized():
        dist.init_process_group(pg_backend, device_id=device if device.type == "cuda" else None)
    return RankInfo(rank, world_size, local_rank, device)


def leave_process_group() -> None:
    """Every rank together: a rank whose gloo threads die while a peer still talks to it aborts
    ("terminate called without an active exception"; seen in 1 of 6 CPU runs without this)."""
    dist.barrier()
    dist.destroy_process_group()


def exit_rank(code: int) -> NoReturn:
    """End a torchrun rank without interpreter finalization, after leave_process_group().

    Wrapped modules (DDP's reducer, FSDP2's DeviceMesh) keep the gloo process group alive past
    destroy_process_group(); when finalization then destroys it, its joinable worker threads abort
    the rank ("terminate called without an active exception", SIGABRT; 2 of ~30 CPU runs of the
    test suite). Everything is written and flushed by now, so nothing is lost by skipping it.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def all_reduce_mean(value: float, device: torch.device) -> float:
    return float(all_reduce_mean_tensor(torch.tensor([value], dtype=torch.float64), device))


def all_reduce_mean_tensor(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """One collective on `device` (NCCL needs CUDA tensors); the result comes back to the CPU."""
    t = values.to(device=device, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.cpu() / dist.get_world_size()


def average_expert_biases(model: torch.nn.Module) -> None:
    """Aux-loss-free balancing (DeepSeek-V3) moves each MoE layer's expert_bias inside forward
    from the rank's own expert load; averaging after every step keeps the ranks' routers identical
    (each rank's sign update counts 1/world_size), so no rank drifts to a different routing."""
    world_size = dist.get_world_size()
    for layer in model.moe_layers():
        if layer.bias_update_rate > 0:
            dist.all_reduce(layer.expert_bias, op=dist.ReduceOp.SUM)
            layer.expert_bias /= world_size
