"""A step's numbers on their way to the host, read `depth` steps late (train.overlap_host).

Each step's forward and backward leave running sums on the device (DeviceSums). They reach the host
as ONE float64 vector [loss, *aux, *flattened stats, grad norm] per step (one host sync per step,
not a float() per aux loss and a .cpu() per statistic). With depth 0 the host reads a step's numbers
as soon as it is done; with depth 1 it reads them while the device runs the next step, so the host's
bookkeeping no longer leaves the GPU idle between steps (BENCHMARKS.md: ~40% of a small model's
step on the H200).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import torch


@dataclass
class StepOutput:
    """One optimizer step's loss (mean over micro-batches) and per-layer routing statistics."""

    loss: float
    aux: dict[str, float]
    stats: dict[str, torch.Tensor]


@dataclass
class DeviceSums:
    """forward_backward's running sums, still on the device: the LM loss, each aux loss and each
    statistic summed over `n_micro` micro-batches."""

    loss: torch.Tensor
    aux: dict[str, torch.Tensor]
    stats: dict[str, torch.Tensor]
    n_micro: int

    def means(self) -> torch.Tensor:
        """[loss, *aux, *flattened stats] means, one float64 vector (unpack's input)."""
        parts = [self.loss.reshape(1), *(v.reshape(1) for v in self.aux.values())]
        parts += [v.reshape(-1) for v in self.stats.values()]
        return torch.cat(parts) / self.n_micro

    def to_host(self) -> StepOutput:
        """The means on the host, in one copy (waits for the device)."""
        return unpack(self.means().cpu(), list(self.aux), self.stats)


def unpack(
    values: torch.Tensor, aux_names: list[str], stats_like: dict[str, torch.Tensor]
) -> StepOutput:
    """[loss, *aux, *flattened stats] (a CPU float64 vector) -> a StepOutput whose statistics take
    the names and shapes of stats_like."""
    scalars, rest = values[: 1 + len(aux_names)].tolist(), values[1 + len(aux_names) :]
    stats = {}
    for name, like in stats_like.items():
        stats[name], rest = rest[: like.numel()].reshape(like.shape), rest[like.numel() :]
    return StepOutput(
        loss=scalars[0], aux=dict(zip(aux_names, scalars[1:], strict=True)), stats=stats
    )


@dataclass
class InFlight:
    """A step whose update is done or queued, and whose numbers [loss, *aux, *flattened stats,
    grad norm, *the orchestrator's `n_measured` measurements] are in `values` (being copied into
    pinned host memory until `copied`; None when the copy is done)."""

    step: int
    lr: float
    t0: float  # when the step was launched
    aux_names: list[str]
    stats_like: dict[str, torch.Tensor]
    values: torch.Tensor
    stepped: bool | None  # None: the update ran if the grad norm is finite (a guarded step)
    skipped: bool = False  # the orchestrator skipped the update (loss-spike guard)
    n_measured: int = 0  # Orchestrator.measure's values at the end (0: orchestrator off)
    copied: torch.cuda.Event | None = None

    @classmethod
    def read(
        cls,
        step: int,
        lr: float,
        t0: float,
        out: StepOutput,
        grad_norm: float | None,
        stepped: bool,
        skipped: bool,
        measured: torch.Tensor | None,
    ) -> InFlight:
        """A step the host has already read (depth 0)."""
        norm = math.nan if grad_norm is None else grad_norm
        parts = [torch.tensor([out.loss, *out.aux.values()], dtype=torch.float64)]
        parts += [v.to(torch.float64).reshape(-1) for v in out.stats.values()]
        parts.append(torch.tensor([norm], dtype=torch.float64))
        n_measured = 0
        if measured is not None:
            parts.append(measured.cpu())
            n_measured = measured.numel()
        values = torch.cat(parts)
        return cls(step, lr, t0, list(out.aux), out.stats, values, stepped, skipped, n_measured)

    @classmethod
    def queued(
        cls,
        step: int,
        lr: float,
        t0: float,
        sums: DeviceSums,
        grad_norm: torch.Tensor,
        measured: torch.Tensor | None,
    ) -> InFlight:
        """A step still on the device: its numbers start copying to the host now."""
        parts = [sums.means(), grad_norm.double().reshape(1)]
        if measured is not None:
            parts.append(measured)
        values = torch.cat(parts)
        n_measured = 0 if measured is None else measured.numel()
        launched = cls(
            step,
            lr,
            t0,
            list(sums.aux),
            sums.stats,
            values.to("cpu", non_blocking=True),
            None,
            n_measured=n_measured,
        )
        if values.is_cuda:
            launched.copied = torch.cuda.Event()
            launched.copied.record()
        return launched

    def wait(self) -> tuple[StepOutput, float | None, bool, torch.Tensor | None]:
        """(numbers, grad norm (None if the update was skipped), whether the update ran, the
        orchestrator's measurements (None when it is off))."""
        if self.copied is not None:
            self.copied.synchronize()
        end = len(self.values) - self.n_measured
        measured = self.values[end:] if self.n_measured else None
        grad_norm = float(self.values[end - 1])
        out = unpack(self.values[: end - 1], self.aux_names, self.stats_like)
        if self.skipped:
            return out, None, False, measured
        # a guarded step skipped a non-finite update on the device
        stepped = math.isfinite(grad_norm) if self.stepped is None else self.stepped
        return out, grad_norm, stepped, measured


class HostOverlap:
    """The steps launched but not yet recorded: at most `depth` wait at any time."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self._steps: deque[InFlight] = deque()

    def push(self, step: InFlight) -> InFlight | None:
        """Queue `step`; returns the oldest one if more than `depth` now wait."""
        self._steps.append(step)
        return self._steps.popleft() if len(self._steps) > self.depth else None

    def pop(self) -> InFlight | None:
        """The oldest waiting step, or None."""
        return self._steps.popleft() if self._steps else None

    def discard(self) -> None:
        """Forget the waiting steps unrecorded (a rollback replaces the run they belong to)."""
        self._steps.clear()
