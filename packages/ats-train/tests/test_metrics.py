"""Every metrics sink is closed when a run ends, normally or by an exception: TensorBoard's writer
thread must be gone before a caller removes the run dir (it raised FileNotFoundError when
benchmarks/shakespeare.py removed its temporary run dir under a writer left open)."""

import shutil
import threading
from pathlib import Path

import pytest
from ats_train.cli import main
from ats_train.trainer import Trainer
from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread


def _writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if isinstance(t, _AsyncWriterThread) and t.is_alive()]


def test_a_finished_run_leaves_no_writer_running(overrides, tmp_path: Path) -> None:  # noqa: ANN001
    before = _writer_threads()
    run_dir = tmp_path / "run"
    assert main(["--run-dir", str(run_dir), *overrides(train__sample_tokens=0)]) == 0
    assert _writer_threads() == before
    assert list((run_dir / "tb").iterdir())  # it did write events
    shutil.rmtree(run_dir)


def test_a_run_that_fails_mid_training_closes_every_sink(
    overrides,  # noqa: ANN001
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An exception out of the training loop (here at the first evaluation) still closes
    metrics.jsonl, TensorBoard and the progress display, and releases the run dir."""
    closed = []
    close = Trainer.close

    def recording_close(self: Trainer) -> None:
        close(self)
        closed.append((self.metrics._file, self.metrics._tb, self.metrics._progress))

    def failing_validate(self: Trainer) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "close", recording_close)
    monkeypatch.setattr(Trainer, "validate", failing_validate)
    before = _writer_threads()
    run_dir = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        main(["--run-dir", str(run_dir), *overrides(train__sample_tokens=0)])
    assert closed == [(None, None, None)]
    assert _writer_threads() == before
    assert not (run_dir / ".ats-train.lock").exists()
    assert (run_dir / "metrics.jsonl").read_text().count('"train"') == 3  # eval_every = 3
