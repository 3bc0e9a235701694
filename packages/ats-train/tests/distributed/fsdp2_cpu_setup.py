"""The setup the fsdp2_*_check.py modules share (imported from this directory, which Python puts
on sys.path when torchrun starts rank_checks_runner.py): this rank's FSDP2 backend on the CPU (gloo, fp32)
and a freshly seeded model of a preset on the reference kernels, not yet wrapped."""

import torch
from ats_model import ModelConfig, build_model, presets
from ats_train.backends import build_backend
from ats_train.config import FSDP2Settings, ParallelSection
from ats_train.precision import build_precision
from torch import nn


def cpu_fsdp2(preset: str, **fsdp2: object) -> tuple[object, ModelConfig, nn.Module]:
    """(backend, the preset's config, its model built after torch.manual_seed(0)); `fsdp2`:
    FSDP2Settings fields (parallel.fsdp2.*)."""
    device = torch.device("cpu")
    backend = build_backend(
        ParallelSection(backend="fsdp2", fsdp2=FSDP2Settings(**fsdp2)),
        device,
        build_precision("fp32", device),
    )
    config = presets.get(preset)
    torch.manual_seed(0)
    return backend, config, build_model(config, kernels="reference")
