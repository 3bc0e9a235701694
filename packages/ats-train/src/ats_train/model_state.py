"""A plain model's full state dict <-> an ATS model directory, whatever backend trained it.

Backends hand over the full, unsharded state (FSDP2 gathers it first), so every checkpoint and the
final model directory have one format and load on any world size and any backend.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from ats_model.serialization.model_dir import (
    CONFIG_FILE,
    DEFAULT_MAX_SHARD_BYTES,
    DTYPE_KEY,
    check_tensors,
    copy_tokenizer,
    dtype_name,
)
from ats_model.serialization.safetensors_io import load_tensors, read_tensor_infos, write_tensors
from torch import nn


def write_model_dir(
    model: nn.Module,
    state: dict[str, torch.Tensor],
    directory: Path,
    tokenizer_json: Path | None,
) -> Path:
    """What ats_model.save_pretrained writes, from a gathered state dict instead of the module."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CONFIG_FILE).write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")
    dtypes = {t.dtype for t in state.values() if t.is_floating_point()}
    if len(dtypes) != 1:
        raise ValueError(f"model state has float dtypes {sorted(map(str, dtypes))}; expected one")
    metadata = {"format": "pt", DTYPE_KEY: dtype_name(dtypes.pop())}
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    write_tensors(directory, tensors, metadata, DEFAULT_MAX_SHARD_BYTES)
    copy_tokenizer(tokenizer_json, directory)
    return directory


def read_model_state(expected: dict[str, torch.Tensor], directory: Path) -> dict[str, torch.Tensor]:
    """The directory's tensors, checked by name, shape and dtype against `expected`."""
    infos, _, source = read_tensor_infos(directory)
    check_tensors(infos, expected, source, "this run's model")
    return load_tensors(directory, infos)
