"""One ats-train per run dir, and nothing in a run dir changed by a run that is refused: a second
ats-train on a live run's dir (real subprocesses) is refused in one line and leaves the first
untouched; a lock left by a killed run is taken over; a resume refused by a late check (the
loader's state, read with the checkpoint) leaves config.toml and the metrics as they were."""

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ats_train.cli import main
from ats_train.run_lock import LOCK_FILE, RunDirInUse, RunLock

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _snapshot(run_dir: Path) -> dict[str, str]:
    return {
        p.relative_to(run_dir).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file()
    }


def _ats_train(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ats_train.cli", *args],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(condition, what: str, proc: subprocess.Popen, timeout: float = 240.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"ats-train exited before {what}: {proc.stderr.read()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _train_records(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return sum(1 for line in lines if line.endswith("}") and '"train"' in line)


@pytest.mark.slow
def test_a_second_ats_train_on_a_live_run_dir_is_refused_and_changes_nothing(
    overrides,  # noqa: ANN001
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    args = ["--run-dir", str(run_dir), *overrides(train__steps=100_000, checkpoint__every=5)]
    first = _ats_train(args)
    try:
        _wait_for(lambda: _train_records(run_dir) >= 6, "6 steps", first)
        holder = json.loads((run_dir / LOCK_FILE).read_text())
        assert (holder["pid"], holder["host"]) == (first.pid, socket.gethostname())
        records = _train_records(run_dir)
        second = _ats_train(args)
        _, err = second.communicate(timeout=240)
        assert second.returncode == 2
        assert err.strip().splitlines() == [
            f"ats-train train: error: run dir {run_dir} is in use by ats-train pid {first.pid} "
            f"on host {socket.gethostname()} (started {holder['started']}); wait for it to end "
            "or choose another --run-dir"
        ]
        # the first run goes on with its history whole: nothing truncated metrics.jsonl
        _wait_for(lambda: _train_records(run_dir) >= records + 3, "3 more steps", first)
        lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        steps = [r["step"] for r in lines if r["kind"] == "train"]
        assert steps == list(range(1, len(steps) + 1))
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # killed holding the lock: the kernel released it; the next run takes the dir over
    assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == first.pid
    lock = RunLock.acquire(run_dir)
    assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (run_dir / LOCK_FILE).exists()


def test_a_lock_whose_named_holder_has_exited_says_so(tmp_path: Path) -> None:
    """A live flock whose file names a pid of this host that is gone: a process the holder started
    kept the lock (an inherited descriptor). The refusal says so instead of naming a live run."""
    lock = RunLock.acquire(tmp_path)
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = {"pid": gone.pid, "host": socket.gethostname(), "started": "then"}
    (tmp_path / LOCK_FILE).write_text(json.dumps(stale))
    with pytest.raises(RunDirInUse, match=f"pid {gone.pid} .* which has exited"):
        RunLock.acquire(tmp_path)
    lock.release()
    RunLock.acquire(tmp_path).release()  # free again


def test_a_resume_refused_at_the_loader_check_changes_nothing_in_the_run_dir(
    overrides,  # noqa: ANN001
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """train.batch_size changed on resume: the loader's saved state does not match, which is only
    known once the checkpoint is read. config.toml, metrics.jsonl and TensorBoard's events are
    written after every check, so two refused tries leave the run dir byte for byte as it was."""
    run_dir = tmp_path / "run"
    extra = {"train__sample_tokens": 0, "train__steps": 4}
    assert main(["--run-dir", str(run_dir), *overrides(**extra)]) == 0
    before = _snapshot(run_dir)
    changed = ["--run-dir", str(run_dir), *overrides(**extra, train__batch_size=8)]
    changed += ["train.steps=6"]
    for _ in range(2):
        capsys.readouterr()
        assert main(changed) == 2
        err = capsys.readouterr().err
        assert "loader state does not match" in err
        assert len(err.strip().splitlines()) == 1
        assert _snapshot(run_dir) == before
