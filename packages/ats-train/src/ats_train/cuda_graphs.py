"""train.cuda_graphs: the training forward + backward replayed from captured CUDA graphs.

For small models the CPU, not the GPU, sets the step time: the 6 x 384 Shakespeare model issues
~600 kernel launches per step (1,500 as an MoE) and measured 30 ms of CPU per step against 14 ms of
GPU work on the H200. A captured graph pair (torch.cuda.make_graphed_callables) replays all of
them with one launch each way.

Captured once, on the first batch, under the run's autocast (with its weight-cast cache off, as
graphs require). With train.compile the compiled blocks are captured too: capture's warm-up
iterations run (and so compile) the forward and backward first, and a replay never re-enters
Python, so nothing is guarded or recompiled afterwards. What it needs, checked by config
validation: CUDA, the single backend, no gradient accumulation, no Mixture-of-Depths (its top-k
capacity reads a count on the host), no MoE capacity factor (the kept-slot count is read on the
host) and no reference MoE kernels; dropless MoE is fine (every shape is static, the kernels never
synchronize). Dropout draws fresh numbers on every replay (the CUDA generator's philox offset
advances per replay).

The warm-up iterations that capture needs would consume random numbers and nudge MoE bias
buffers; both are restored afterwards, so a run with graphs is deterministic and resumes exactly
(it captures again after a restart, from the restored state).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import torch
from ats_model import ModelConfig
from torch import nn

from ats_train.batch_geometry import BatchGeometry
from ats_train.config import ConfigError, TrainConfig

LossParts = tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]


def check_cuda_graphs(
    config: TrainConfig, model: ModelConfig, device: torch.device, batch: BatchGeometry
) -> None:
    """Refuse, naming the setting, what a captured forward + backward cannot replay."""
    train = config.train
    if not train.cuda_graphs:
        return
    problems = {
        "train.device": (device.type == "cuda", f"is {device.type!r}; CUDA graphs need 'cuda'"),
        "parallel.backend": (
            config.parallel.backend == "single",
            f"is {config.parallel.backend!r}; graphs are captured for 'single' only",
        ),
        "train.micro_batch_size": (
            batch.accumulation == 1,
            f"= {train.micro_batch_size} accumulates gradients; replayed gradient buffers are "
            "reused, so graphs need one micro-batch per step",
        ),
        "model.family": (
            model.mod is None,
            f"is {model.family!r}: Mixture-of-Depths reads its token count on the host",
        ),
        "kernels": (
            config.kernels != "reference" or model.moe is None,
            "= 'reference' with MoE: the reference permute and expert loop read token counts on "
            "the host (bincount, tolist); use 'auto' or 'triton'",
        ),
        "model.moe.capacity_factor": (
            model.moe is None or model.moe.capacity_factor is None,
            "is set: capacity dropping reads the kept-slot count on the host; use dropless MoE",
        ),
        "faults.oom_at_step": (
            config.faults.oom_at_step is None,
            f"= {config.faults.oom_at_step}; the OOM drill hooks the eager forward",
        ),
    }
    for key, (ok, why) in problems.items():
        if not ok:
            raise ConfigError(f"train.cuda_graphs = true: {key} {why}")


class _FlatLoss(nn.Module):
    """model(idx, targets) as a flat tuple: (loss, *aux values, *stats values) in fixed key order."""

    def __init__(self, model: nn.Module, aux_keys: list[str], stats_keys: list[str]) -> None:
        super().__init__()
        self.model = model
        self.aux_keys, self.stats_keys = aux_keys, stats_keys

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(idx, targets=targets)
        if sorted(out.aux) != self.aux_keys or sorted(out.stats) != self.stats_keys:
            raise RuntimeError("cuda_graphs: the model's aux/stats keys changed after capture")
        aux = (out.aux[k] for k in self.aux_keys)
        return (out.loss, *aux, *(out.stats[k] for k in self.stats_keys))


class GraphedLoss:
    """Callable (idx, targets) -> (loss, aux, stats), replaying graphs captured at the first call."""

    def __init__(
        self, model: nn.Module, autocast: Callable[[], AbstractContextManager[None]]
    ) -> None:
        self.model, self.autocast = model, autocast
        self._graphed: nn.Module | None = None
        self._shape = torch.Size()
        self._keys: tuple[list[str], list[str]] = ([], [])

    def __call__(self, idx: torch.Tensor, targets: torch.Tensor) -> LossParts:
        if self._graphed is None:
            self._capture(idx, targets)
            self._shape = idx.shape
        elif idx.shape != self._shape:
            raise RuntimeError(
                f"cuda_graphs: batch of shape {tuple(idx.shape)}, graphs were captured for "
                f"{tuple(self._shape)} (the micro-batch size must not change)"
            )
        assert self._graphed is not None
        with self.autocast():
            flat = self._graphed(idx, targets)
        aux_keys, stats_keys = self._keys
        n_aux = len(aux_keys)
        aux = dict(zip(aux_keys, flat[1 : 1 + n_aux], strict=True))
        stats = dict(zip(stats_keys, flat[1 + n_aux :], strict=True))
        return flat[0], aux, stats

    def _capture(self, idx: torch.Tensor, targets: torch.Tensor) -> None:
        with _restored_state(self.model):
            with torch.no_grad(), self.autocast():
                probe = self.model(idx, targets=targets)  # which aux / stats outputs exist
            self._keys = (sorted(probe.aux), sorted(probe.stats))
            del probe
            flat = _FlatLoss(self.model, *self._keys)
            with self.autocast():
                self._graphed = torch.cuda.make_graphed_callables(flat, (idx, targets))


@contextlib.contextmanager
def _restored_state(model: nn.Module) -> Iterator[None]:
    """Buffers and RNG streams as they were before the block (capture's warm-up runs)."""
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    cpu_rng, cuda_rng = torch.get_rng_state(), torch.cuda.get_rng_state()
    try:
        yield
    finally:
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                buffer.copy_(buffers[name])
        torch.set_rng_state(cpu_rng)
        torch.cuda.set_rng_state(cuda_rng)
