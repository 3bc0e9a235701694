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


def test_val_line_shows_perplexity_only_for_a_token_loss(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """A pretraining / SFT val loss is a token NLL: its perplexity is shown. DPO's and GRPO's are
    not (GRPO's is minus the mean reward): their own numbers are shown instead, and every number
    is in the val record."""
    from ats_train.metrics import Metrics, read_metrics

    metrics = Metrics(tmp_path, total_steps=4, start_step=0, log_every=1, enabled=True)
    metrics.open()
    try:
        metrics.val(2, 2.0, {"loss": 2.0})
        metrics.val(4, -0.25, {"loss": -0.25, "reward": 0.25})
    finally:
        metrics.close()
    lines = [x for x in capsys.readouterr().out.splitlines() if "val loss" in x]
    assert "val ppl 7.4" in lines[0]
    assert "val reward 0.2500" in lines[1] and "ppl" not in lines[1]
    val = [r for r in read_metrics(tmp_path) if r["kind"] == "val"]
    assert val[1]["val/reward"] == 0.25 and val[1]["val_loss"] == -0.25
