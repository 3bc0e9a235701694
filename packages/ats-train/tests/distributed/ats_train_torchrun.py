"""The one helper that starts ranks for `dist` tests: torchrun (torch.distributed.run) or the
`deepspeed` launcher on this host, gloo on CPU, running the real `ats-train` CLI. Nothing here
spawns ranks by hand."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
# A guard against a hung launch, not a speed limit: a launch that JIT-builds DeepSpeed's async I/O
# op (NVMe offload; rebuilt whenever the venv changes) ran past 300 s on 2 loaded cores.
LAUNCH_TIMEOUT_S = 900


def launch(entry: list[str], nproc: int | None) -> subprocess.CompletedProcess:
    """`python ENTRY` (a script, or -m module, with its arguments) in one plain process (nproc
    None) or under torchrun with nproc ranks on this host."""
    launcher = (
        []
        if nproc is None
        else ["-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone"]
    )
    cmd = [sys.executable, *launcher, *entry]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)


def free_port() -> int:
    """A TCP port nothing on this host listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ats_train_deepspeed_launcher(args: list[str], nproc: int) -> subprocess.CompletedProcess:
    """The real `ats-train ARGS` CLI under DeepSpeed's own launcher (`deepspeed --num_gpus N
    --no_local_rank --module ats_train.cli`, as packages/ats-train/README.md documents), which
    sets RANK / LOCAL_RANK / WORLD_SIZE / MASTER_* itself; on a CPU host it starts N CPU ranks."""
    launcher = shutil.which("deepspeed", path=str(Path(sys.executable).parent))
    assert launcher is not None, "the deepspeed launcher is not installed beside this python"
    # the launcher's default port 29500 may be taken (another test worker, another run)
    cmd = [launcher, "--num_gpus", str(nproc), "--master_port", str(free_port()), "--no_local_rank"]
    cmd += ["--module", "ats_train.cli", *args]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)


def run_ats_train(args: list[str], nproc: int | None) -> subprocess.CompletedProcess:
    """The real `ats-train ARGS` CLI, plain or under torchrun."""
    return launch(["-m", "ats_train.cli", *args], nproc)


def train_records(run_dir: Path) -> dict[int, dict]:
    """step -> the train record of run_dir/metrics.jsonl."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in records if r["kind"] == "train"}


def train_losses(run_dir: Path) -> dict[int, float]:
    """step -> train loss from run_dir/metrics.jsonl."""
    return {step: r["loss"] for step, r in train_records(run_dir).items()}


def model_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "model" / "model.safetensors"))


# what every 2-rank run of test_backends.py and test_deepspeed.py shares with the single-process
# run it must reproduce
STEPS = 6
RUN_VALUES = {
    "train__steps": STEPS,
    "train__sample_tokens": 0,
    "train__precision": "fp32",
    # MoE aux losses and capacity are per micro-batch: the same micro-batches on every layout
    # (2 accumulation steps per rank: the boundary is exercised)
    "train__micro_batch_size": 1,
    "checkpoint__every": 2,
    "checkpoint__keep_last": 3,
    # constant LR after warmup, so a run sized to fewer steps has the same schedule prefix
    "optim__lr": 1e-3,
    "optim__min_lr": 1e-3,
}


# the single-process reference's extra settings (conftest.single_reference): the update ratio is
# measured every 3 steps, which test_backends.py compares; it changes no loss or weight (mode
# advise acts on nothing, and no orchestrator kind fires before min_records 8)
REFERENCE_EXTRA = {"orchestrator__every": 3}


def run_args(overrides, run_dir: Path, **extra: object) -> list[str]:  # noqa: ANN001
    """`ats-train` arguments of a run on conftest's prepared data: RUN_VALUES updated by extra."""
    return ["--run-dir", str(run_dir), *overrides(**{**RUN_VALUES, **extra})]


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    lines = [line for line in proc.stderr.splitlines() if "Warning" not in line]
    assert proc.returncode == 0, "\n".join(lines[:40] + ["..."] + lines[-40:])
