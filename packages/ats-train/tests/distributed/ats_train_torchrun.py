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


def launch(entry: list[str], nproc: int | None) -> subprocess.CompletedProcess:
    """`python ENTRY` (a script, or -m module, with its arguments) in one plain process (nproc
    None) or under torchrun with nproc ranks on this host."""
    launcher = (
        []
        if nproc is None
        else ["-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone"]
    )
    cmd = [sys.executable, *launcher, *entry]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)


def run_ats_train_deepspeed_launcher(args: list[str], nproc: int) -> subprocess.CompletedProcess:
    """The real `ats-train ARGS` CLI under DeepSpeed's own launcher (`deepspeed --num_gpus N
    --no_local_rank --module ats_train.cli`, as packages/ats-train/README.md documents), which
    sets RANK / LOCAL_RANK / WORLD_SIZE / MASTER_* itself; on a CPU host it starts N CPU ranks."""
    launcher = shutil.which("deepspeed", path=str(Path(sys.executable).parent))
    assert launcher is not None, "the deepspeed launcher is not installed beside this python"
    with socket.socket() as s:  # a free port: the launcher's default 29500 may be taken
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [launcher, "--num_gpus", str(nproc), "--master_port", str(port), "--no_local_rank"]
    cmd += ["--module", "ats_train.cli", *args]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)


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
