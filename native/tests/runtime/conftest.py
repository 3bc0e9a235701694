"""Fixtures of the native runtime tests: small random ats-model models saved with save_pretrained
(the reference the native forward is compared against), and tiny models trained on standard-library
source (for the quality gates of quantized runtimes), built once per session."""

import dataclasses
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from ats_model import ModelConfig, build_model, presets, save_pretrained

# test modules import the shared helper kernel_sets.py from this folder
sys.path.insert(0, str(Path(__file__).parent))

TRAIN_STEPS = 250  # a few seconds on one CPU core; held-out byte perplexity falls from 512 to ~11


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


def stdlib_bytes() -> np.ndarray:
    """Byte ids of a fixed slice of the standard library's own source (the same on every
    machine with this Python): training and held-out text of the trained fixtures."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:40]
    text = b"".join(p.read_bytes() for p in files)
    return np.frombuffer(text, dtype=np.uint8).astype(np.int64)


@pytest.fixture(scope="session")
def trained_model(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[str], tuple[torch.nn.Module, Path, np.ndarray]]:
    """trained_model(preset) -> (eval model, model dir, held-out byte ids): a tiny preset trained
    for a few seconds on standard-library source bytes (a plain AdamW loop), so that top-1
    agreement and perplexity of quantized runtimes measure something (random weights give
    near-ties everywhere). The held-out ids come from text the model never saw."""
    cache: dict[str, tuple[torch.nn.Module, Path, np.ndarray]] = {}

    def make(preset: str) -> tuple[torch.nn.Module, Path, np.ndarray]:
        if preset not in cache:
            data = stdlib_bytes()
            split = len(data) - 4096
            train, held_out = data[:split], data[split:]
            torch.manual_seed(0)
            config = dataclasses.replace(presets.get(preset), tie_embeddings=False)
            model = build_model(config)
            opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
            rng = np.random.default_rng(0)
            B, T = 16, 64
            threads = torch.get_num_threads()
            torch.set_num_threads(1)  # tiny matmuls: a second thread only adds contention
            try:
                for _ in range(TRAIN_STEPS):
                    starts = rng.integers(0, len(train) - T - 1, B)
                    batch = torch.from_numpy(np.stack([train[s : s + T + 1] for s in starts]))
                    out = model(batch[:, :-1], targets=batch[:, 1:])  # (B, T) inputs, targets
                    opt.zero_grad()
                    out.loss.backward()
                    opt.step()
            finally:
                torch.set_num_threads(threads)
            model.eval()
            directory = tmp_path_factory.mktemp(f"trained-{preset}")
            save_pretrained(model, directory)
            cache[preset] = (model, directory, held_out)
        return cache[preset]

    return make
