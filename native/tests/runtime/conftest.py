"""Fixtures of the native runtime tests: small random ats-model models saved with save_pretrained
(the reference the native forward is compared against), built once per session."""

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from ats_model import ModelConfig, build_model, presets, save_pretrained


def tiny_config(preset: str, **changes: object) -> ModelConfig:
    """A tiny preset with a larger init (so greedy decoding does not collapse onto one token)."""
    return dataclasses.replace(presets.get(preset), init_std=0.2, **changes)


@pytest.fixture(scope="session")
def saved_model(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[..., tuple[torch.nn.Module, Path]]:
    """saved_model(preset, dtype=torch.float32, **config changes) -> (eval model, model dir)."""
    cache: dict[tuple, tuple[torch.nn.Module, Path]] = {}

    def make(
        preset: str, dtype: torch.dtype = torch.float32, **changes: object
    ) -> tuple[torch.nn.Module, Path]:
        key = (preset, str(dtype), repr(sorted(changes.items())))
        if key not in cache:
            torch.manual_seed(len(cache))
            model = build_model(tiny_config(preset, **changes), dtype=dtype).eval()
            directory = tmp_path_factory.mktemp(preset)
            save_pretrained(model, directory)
            cache[key] = (model, directory)
        return cache[key]

    return make
