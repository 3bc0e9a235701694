"""A CHECK, not a supported mode: `ats-train parallel.backend=colossalai` on CPU ranks (gloo), by
telling ColossalAI 0.5.0 that its CPU accelerator is "cuda" (streams as no-ops, LowLevelZero's
overlap_communication off) and skipping our backend's CUDA-only check. ColossalAI's real ZeRO-2
code (partitioning, reduce-scatter, all-gather, state_dict gathering) then runs on gloo, so the
backend's logic can be compared with the single run where no GPU can run ColossalAI (README.md).

    envs/colossalai/.venv/bin/torchrun --standalone --nproc-per-node 2 \
        envs/colossalai/cpu_emulation.py --run-dir runs/c parallel.backend=colossalai ...
"""

from __future__ import annotations

import contextlib
import functools
import sys

import torch
from colossalai.accelerator import set_accelerator
from colossalai.accelerator.cpu_accelerator import CpuAccelerator
from colossalai.booster.plugin import LowLevelZeroPlugin


class _NoStream:
    def wait_stream(self, other: object) -> None: ...

    def synchronize(self) -> None: ...


class CpuAsCuda(CpuAccelerator):
    """Passes LowLevelZeroOptimizer._sanity_checks (name in cuda/npu); CPU work is synchronous."""

    def __init__(self) -> None:
        super().__init__()
        self._name = "cuda"

    def Stream(self, *args: object, **kwargs: object) -> _NoStream:
        return _NoStream()

    def current_stream(self, *args: object, **kwargs: object) -> _NoStream:
        return _NoStream()

    def stream(self, stream_: object) -> contextlib.nullcontext:
        return contextlib.nullcontext()

    def synchronize(self, *args: object, **kwargs: object) -> None: ...


def _cpu_init(self, device: torch.device, precision: object, plugin: str) -> None:
    """ColossalAIBackend.__init__ without its CUDA-only check."""
    from ats_train.backends.process_group import join_process_group

    info = join_process_group(self.name, device)
    self.device, self.precision, self.plugin = info.device, precision, plugin
    self.rank, self.world_size = info.rank, info.world_size
    self._booster = self._plain = self._optimizer = None


def main() -> int:
    set_accelerator(CpuAsCuda())
    import ats_train.backends.colossalai as backend
    from ats_train.cli import main as ats_train

    # record_stream() on a comm stream needs CUDA tensors; without overlap it is never called
    backend.LowLevelZeroPlugin = functools.partial(LowLevelZeroPlugin, overlap_communication=False)
    backend.ColossalAIBackend.__init__ = _cpu_init
    return ats_train(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
