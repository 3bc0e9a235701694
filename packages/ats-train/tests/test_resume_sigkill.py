"""Exact resume under SIGKILL, with real subprocesses (ARCHITECTURE.md section 4).

- A run killed at an arbitrary step and restarted ends with weights bitwise equal to an
  uninterrupted run, and with the same metrics history.
- A kill while a checkpoint is being written never leaves `latest` naming a broken checkpoint.
"""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ats_train.checkpoint import checkpoint_step, checkpoints_dir, latest_checkpoint

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
STEPS = 12
EVERY = 3


def _args(overrides, run_dir: Path, checkpoint_format: str = "full") -> list[str]:
    extra = {"train__steps": STEPS, "checkpoint__every": EVERY, "train__eval_every": 4}
    extra["checkpoint__format"] = checkpoint_format
    return ["--run-dir", str(run_dir), *overrides(**extra)]


def _start(args: list[str], delay: float | None = None) -> subprocess.Popen:
    entry = (
        ["-m", "ats_train.cli"]
        if delay is None
        else [str(HERE / "checkpoint_delay_runner.py"), str(delay)]
    )
    return subprocess.Popen(
        [sys.executable, *entry, *args],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(args: list[str]) -> None:
    proc = _start(args)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err


def _train_lines(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    return sum(
        1 for line in path.read_text().splitlines() if line.endswith("}") and '"train"' in line
    )


def _kill_when(proc: subprocess.Popen, ready) -> None:  # noqa: ANN001
    deadline = time.monotonic() + 300
    while not ready():
        assert proc.poll() is None, f"run ended before the kill point: {proc.stderr.read()}"
        assert time.monotonic() < deadline, "kill point never reached"
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL


@pytest.fixture(scope="module")
def reference(overrides, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("reference")
    _finish(_args(overrides, run_dir))
    return run_dir


def test_sigkill_at_several_steps_then_resume_is_bitwise_exact(
    reference: Path, overrides, tmp_path: Path, assert_same_run
) -> None:
    """One run killed three times (after 2, 6 and 10 logged steps, each time resumed from its
    latest checkpoint), then finished: same weights and metrics as the uninterrupted run."""
    args = _args(overrides, tmp_path)
    resumed_from = []
    for kill_after in (2, 6, 10):
        _kill_when(_start(args), lambda n=kill_after: _train_lines(tmp_path) >= n)
        latest = latest_checkpoint(tmp_path)
        resumed_from.append(0 if latest is None else checkpoint_step(latest))
    assert resumed_from == sorted(resumed_from) and resumed_from[-1] >= 6
    _finish(args)
    assert_same_run(reference, tmp_path)


@pytest.mark.parametrize("checkpoint_format", ["full", "sharded"])
def test_sigkill_while_writing_a_checkpoint_keeps_latest_loadable(
    reference: Path, overrides, tmp_path: Path, checkpoint_format: str, assert_same_run
) -> None:
    """Each checkpoint file takes 0.15 s to write (about 1-1.5 s per checkpoint); the run is killed
    at a random moment after the step directory appears, three checkpoints in a row. Sharded: the
    DCP shard files and per-rank RNG files are in the manifest too (the reference run is "full":
    the format does not change what is trained)."""
    args = _args(overrides, tmp_path, checkpoint_format)
    rng = random.Random(0)
    torn = 0
    for target in (EVERY, 2 * EVERY, 3 * EVERY):
        tmp_dir = checkpoints_dir(tmp_path) / f"step-{target:06d}.tmp"
        pause = rng.uniform(0.0, 1.2)
        appeared: list[float] = []

        def ready(
            d: Path = tmp_dir, pause: float = pause, appeared: list[float] = appeared
        ) -> bool:
            if not appeared and d.is_dir():
                appeared.append(time.monotonic())
            return bool(appeared) and time.monotonic() - appeared[0] >= pause

        _kill_when(_start(args, delay=0.15), ready)
        torn += tmp_dir.is_dir()
        latest = latest_checkpoint(tmp_path)  # raises if `latest` names a broken checkpoint
        if latest is None:
            assert target == EVERY
        else:
            assert checkpoint_step(latest) in (target - EVERY, target)
    assert torn >= 1  # at least one kill really landed inside a checkpoint write
    _finish(args)
    assert_same_run(reference, tmp_path)
    layout = latest_checkpoint(tmp_path) / "trainer_state" / "sharded.json"
    assert layout.is_file() == (checkpoint_format == "sharded")
