"""Saves runs: each injected fault is answered in the default orchestrator mode and the run ends
within 2% of the fault-free run's val loss (ats_train.drill, what `ats-train drill` runs)."""

from pathlib import Path

import pytest
from ats_train.cli import main
from ats_train.config import load_config
from ats_train.drill import BY_NAME, RECOVERED, TINY, run_drills

SAVES_RUNS = ("nan_grad", "loss_spike", "oom", "routing_collapse", "mod_collapse", "dead_experts")


def _base(prepared: tuple[Path, Path]) -> dict[str, object]:
    shards, tokenizer = prepared
    return {**TINY, "data.source": shards, "data.tokenizer": tokenizer, "train.device": "cpu"}


def _check(results) -> None:  # noqa: ANN001
    for r in results:
        assert r.recovered, r
        assert r.val_loss <= r.reference * (1 + RECOVERED)
        assert any(d.split("@")[0] in r.drill.answers for d in r.detected), r.detected
        assert r.done  # what was detected was acted on


def test_the_drill_runs_in_the_default_mode() -> None:
    assert "orchestrator.mode" not in TINY and load_config(None, []).orchestrator.mode == "act"
    assert {*SAVES_RUNS} <= set(BY_NAME)


def test_nan_gradient_and_oom_are_recovered(prepared, tmp_path: Path) -> None:
    _check(run_drills(["nan_grad", "oom"], _base(prepared), tmp_path, show=lambda _: None))


@pytest.mark.slow
def test_every_fault_is_recovered(prepared, tmp_path: Path) -> None:
    _check(run_drills(list(SAVES_RUNS), _base(prepared), tmp_path, show=lambda _: None))


def test_the_drill_command_refuses_an_unknown_drill(capsys) -> None:
    assert main(["drill", "--only", "nan_grad,meteor"]) == 2
    err = capsys.readouterr().err
    assert "unknown drill 'meteor'" in err and "nan_grad" in err


def test_the_drill_command_reports_and_exits_zero(prepared, tmp_path: Path, capsys) -> None:
    shards, tokenizer = prepared
    args = ["drill", "--run-dir", str(tmp_path), "--only", "loss_spike"]
    args += [f"data.source={shards}", f"data.tokenizer={tokenizer}", "train.device=cpu"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "skip_batch@15" in out and "RECOVERED" in out and "1 of 1 recovered" in out
