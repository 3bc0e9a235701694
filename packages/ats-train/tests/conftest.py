"""Shared fixtures: a small prepared dataset (one stdlib module as text), run overrides, and the
bitwise comparison of two run dirs."""

import json
import sysconfig
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from ats_data import prepare
from ats_data.sources import open_source
from ats_tokenizer import Tokenizer
from safetensors.torch import load_file


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(shard dir, tokenizer.json): argparse.py as one text file, split into paragraphs."""
    root = tmp_path_factory.mktemp("data")
    corpus = root / "corpus.txt"
    corpus.write_text((Path(sysconfig.get_paths()["stdlib"]) / "argparse.py").read_text())
    source = open_source(str(corpus))
    tokenizer = Tokenizer.train(iter(source), 320)
    tokenizer.save(root / "tokenizer.json")
    shards = prepare(source, root / "tokenizer.json", root / "shards", val_fraction=0.2, workers=1)
    return shards, root / "tokenizer.json"


@pytest.fixture(scope="session")
def overrides(prepared: tuple[Path, Path]) -> Callable[..., list[str]]:
    """overrides(train__steps=9, ...) -> key=value list of a tiny MoE+MoD run on `prepared`."""
    return lambda **extra: _run_overrides(prepared, **extra)


def _run_overrides(prepared: tuple[Path, Path], **extra: object) -> list[str]:
    """A tiny MoE+MoD run on the prepared data: a few steps of (4 x 32) tokens."""
    shards, tokenizer = prepared
    values = {
        "data.source": shards,
        "data.tokenizer": tokenizer,
        "model.preset": "tiny-hybrid",
        "train.steps": 6,
        "train.batch_size": 4,
        "train.micro_batch_size": 2,
        "train.seq_len": 32,
        "train.eval_every": 3,
        "train.eval_batches": 2,
        "train.log_every": 1,
        "train.sample_tokens": 8,
        "train.device": "cpu",
        "optim.warmup_steps": 2,
        "checkpoint.every": 2,
        "checkpoint.keep_last": 2,
        "kernels": "reference",
    }
    values.update({k.replace("__", "."): v for k, v in extra.items()})
    return [f"{k}={v}" for k, v in values.items()]


def _history(run_dir: Path) -> list[dict]:
    """metrics.jsonl without the wall-clock and RSS readings."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in records:
        for key in ("time", "tokens_per_s", "mfu", "memory_gb"):
            r.pop(key, None)
    return records


def _assert_same_run(a: Path, b: Path) -> None:
    """Final weights bitwise equal and the same metrics history, step by step."""
    wa = load_file(str(a / "model" / "model.safetensors"))
    wb = load_file(str(b / "model" / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name
    assert _history(a) == _history(b)


@pytest.fixture
def assert_same_run() -> Callable[[Path, Path], None]:
    return _assert_same_run
