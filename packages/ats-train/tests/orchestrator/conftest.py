"""Tiny real training runs for the orchestrator tests: one clean baseline per session, and `run`
for a faulted run. Every run is the tiny MoE+MoD preset on argparse.py, 30 steps of 4 x 32 tokens
on CPU, orchestrator in mode act evaluating every 5 steps."""

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from ats_train.build import build_trainer
from ats_train.config import load_config
from ats_train.orchestrator import base
from ats_train.orchestrator.decisions import read_decisions
from ats_train.orchestrator.settings import OrchestratorSection
from ats_train.trainer import Trainer

STEPS = 30
KIND_NAMES = tuple(OrchestratorSection().kinds())


@dataclass
class Run:
    trainer: Trainer
    run_dir: Path
    # the step of the newest record at each signals computation (clean_run only)
    signal_steps: list[int] = field(default_factory=list)

    @property
    def decisions(self) -> list[dict]:
        return read_decisions(self.run_dir)

    def fired(self, kind: str) -> list[dict]:
        return [d for d in self.decisions if d["kind"] == kind]

    @property
    def records(self) -> list[dict]:
        lines = (self.run_dir / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    @property
    def train_records(self) -> list[dict]:
        return [r for r in self.records if r["kind"] == "train"]

    @property
    def final_val_loss(self) -> float:
        return [r for r in self.records if r["kind"] == "val"][-1]["val_loss"]


def only_kinds(*kinds: str) -> dict[str, object]:
    """Overrides that switch every other kind off (orchestrator.<kind>.enabled = false)."""
    return {f"orchestrator.{k}.enabled": False for k in KIND_NAMES if k not in kinds}


@pytest.fixture
def only() -> Callable[..., dict[str, object]]:
    return only_kinds


def tiny_overrides(prepared: tuple[Path, Path], extra: dict[str, object]) -> list[str]:
    shards, tokenizer = prepared
    values: dict[str, object] = {
        "data.source": shards,
        "data.tokenizer": tokenizer,
        "model.preset": "tiny-hybrid",
        "train.steps": STEPS,
        "train.batch_size": 4,
        "train.micro_batch_size": 2,
        "train.seq_len": 32,
        "train.eval_every": 10,
        "train.eval_batches": 2,
        "train.log_every": 100,
        "train.sample_tokens": 0,
        "train.device": "cpu",
        "optim.warmup_steps": 4,
        "checkpoint.every": 0,
        "kernels": "reference",
        "orchestrator.mode": "act",
        "orchestrator.every": 5,
    }
    values.update(extra)
    return [f"{k}={v}" for k, v in values.items()]


def train_run(prepared: tuple[Path, Path], run_dir: Path, extra: dict[str, object]) -> Run:
    torch.set_num_threads(1)
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer = build_trainer(load_config(None, tiny_overrides(prepared, extra)), run_dir)
    try:
        trainer.train()
    finally:
        trainer.close()
    return Run(trainer, run_dir)


@pytest.fixture(scope="session")
def clean_run(prepared, tmp_path_factory) -> Run:
    """The baseline: every kind enabled in mode act, no fault; signal_steps records the step of
    each signals computation the kinds asked for."""
    steps: list[int] = []
    real = base.compute_signals

    def counting(records, val, flops_per_token):  # noqa: ANN001, ANN202
        steps.append(records[-1]["step"])
        return real(records, val, flops_per_token)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(base, "compute_signals", counting)
        done = train_run(prepared, tmp_path_factory.mktemp("clean"), {})
    done.signal_steps = steps
    return done


@pytest.fixture
def run(prepared, tmp_path) -> Callable[..., Run]:
    """run(**overrides) with dotted keys, e.g. run(**{"faults.oom_at_step": 5})."""
    counter = iter(range(100))
    return lambda **extra: train_run(prepared, tmp_path / f"run{next(counter)}", extra)


@pytest.fixture
def run_in(prepared) -> Callable[..., Run]:
    """run_in(run_dir, **overrides): train (or resume) in an existing run dir."""
    return lambda run_dir, **extra: train_run(prepared, run_dir, extra)


@pytest.fixture
def tiny_config(prepared) -> Callable[..., object]:
    """tiny_config(**overrides): the runs' config, for a trainer a test steps itself."""
    return lambda **extra: load_config(None, tiny_overrides(prepared, extra))
