"""The NaN/inf rollback guard on a real tiny run (conftest), first and repeated: it reloads the latest
checkpoint, replays a one-off NaN at the same lr and a NaN that comes back at the same place at
lr_scale x orchestrator.rollback.scale, logs each rollback in decisions.jsonl, and the run ends
exactly where a fault-free run with that lr ends (the oracle: the same weights, bitwise).

The NaN is faults.nan_grad_at_step (a NaN in a real gradient after backward); nan_grad_times = 2
makes the replay of that step meet it again. A NaN that outlasts orchestrator.rollback.max_rollbacks
stops the run with DivergedError. Checkpoints every 5 steps: a NaN at step 13 rolls back to 10."""

from pathlib import Path

import pytest
import torch
from ats_train.cli import main
from ats_train.errors import DivergedError
from ats_train.orchestrator.decisions import read_decisions
from safetensors.torch import load_file

STEPS = 30  # conftest's run length
NAN_AT, CHECKPOINT_AT = 13, 10
CHECKPOINTS = {"checkpoint.every": 5, "checkpoint.keep_last": 2}


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "checkpoints" / f"step-{STEPS:06d}" / "model.safetensors"))


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = final_weights(a), final_weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name


@pytest.fixture
def rollback_only(only) -> dict[str, object]:
    return {**only("rollback"), **CHECKPOINTS}


def test_a_one_off_nan_replays_at_the_same_lr_and_ends_as_the_clean_run(run, rollback_only):
    r = run(**rollback_only, **{"faults.nan_grad_at_step": NAN_AT})
    (d,) = r.fired("rollback")
    assert (d["step"], d["applied"]) == (NAN_AT, True)
    assert d["reason"] == f"non-finite grad_norm at step {NAN_AT}"
    assert d["change"] == {"step": [NAN_AT, CHECKPOINT_AT], "lr_scale": [1.0, 1.0]}
    steps = [x["step"] for x in r.train_records]
    assert steps == [*range(1, NAN_AT + 1), *range(CHECKPOINT_AT + 1, STEPS + 1)]
    clean = run(**rollback_only)
    assert clean.decisions == []
    assert_same_weights(r.run_dir, clean.run_dir)
    assert r.final_val_loss == clean.final_val_loss


def test_a_nan_that_comes_back_rolls_back_again_at_half_the_lr(run, rollback_only):
    nan_twice = {"faults.nan_grad_at_step": NAN_AT, "faults.nan_grad_times": 2}
    r = run(**rollback_only, **nan_twice, **{"orchestrator.rollback.max_rollbacks": 2})
    first, second = r.fired("rollback")
    assert [first["step"], second["step"]] == [NAN_AT, NAN_AT]
    assert first["applied"] and second["applied"]
    # both back to the same checkpoint; the first replays at the same lr, the repeat at x 0.5
    assert first["change"] == {"step": [NAN_AT, CHECKPOINT_AT], "lr_scale": [1.0, 1.0]}
    assert second["change"] == {"step": [NAN_AT, CHECKPOINT_AT], "lr_scale": [1.0, 0.5]}
    assert r.trainer.orchestrator.lr_scale == 0.5
    # steps 11-13 ran three times: twice into the NaN, once past it
    replay = [*range(CHECKPOINT_AT + 1, NAN_AT + 1)]
    steps = [x["step"] for x in r.train_records]
    assert steps == [*range(1, NAN_AT + 1), *replay, *range(CHECKPOINT_AT + 1, STEPS + 1)]
    bad = [x for x in r.train_records if x["step"] == NAN_AT][:2]
    assert all(x["grad_norm"] != x["grad_norm"] for x in bad)  # NaN, both times
    # the oracle: no NaN, and the lr x 0.5 from step 11 on by another mechanism (the lr fault)
    half = run(**rollback_only, **{"faults.plateau_at_step": 11, "faults.plateau_lr_factor": 0.5})
    assert half.decisions == []
    after = [x for x in r.train_records[NAN_AT + len(replay) :]]
    assert [x["lr"] for x in after] == [x["lr"] for x in half.train_records[CHECKPOINT_AT:]]
    assert_same_weights(r.run_dir, half.run_dir)
    assert r.final_val_loss == half.final_val_loss


def test_a_nan_the_replays_never_get_past_stops_the_run(run_in, rollback_only, tmp_path):
    nan_thrice = {"faults.nan_grad_at_step": NAN_AT, "faults.nan_grad_times": 3}
    run_dir = tmp_path / "run"
    with pytest.raises(DivergedError) as raised:
        run_in(run_dir, **rollback_only, **nan_thrice, **{"orchestrator.rollback.max_rollbacks": 2})
    message = str(raised.value)
    assert f"non-finite loss or grad norm at step {NAN_AT} after 2 rollbacks" in message
    assert f"max_rollbacks = 2), the last to step-{CHECKPOINT_AT:06d} at lr_scale 0.5" in message
    decisions = read_decisions(run_dir)
    assert [(d["kind"], d["step"]) for d in decisions] == [("rollback", NAN_AT)] * 2
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("step-*"))
    assert saved == ["step-000005", f"step-{CHECKPOINT_AT:06d}"]  # nothing saved past the NaN


def test_the_cli_ends_a_run_the_rollbacks_cannot_save_with_one_line(overrides, tmp_path, capsys):
    nan = {"faults__nan_grad_at_step": 3, "faults__nan_grad_times": 3}
    args = overrides(**nan, orchestrator__rollback__max_rollbacks=2)  # checkpoints every 2 steps
    assert main(["--run-dir", str(tmp_path / "run"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert "error: non-finite loss or grad norm at step 3 after 2 rollbacks" in err
    assert "the last to step-000002 at lr_scale 0.5" in err
