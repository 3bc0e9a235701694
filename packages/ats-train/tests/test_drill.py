"""Saves runs: each injected fault is answered in the default orchestrator mode and the run ends
within 2% of the fault-free run's val loss (ats_train.drill, what `ats-train drill` runs). The quick
tier drills three faults through the command (one fault-free run shared by the three); the full
suite adds the other three."""

from pathlib import Path

import pytest
from ats_train.cli import main
from ats_train.config import load_config
from ats_train.drill import BY_NAME, RECOVERED, TINY, run_drills

SAVES_RUNS = ("nan_grad", "loss_spike", "oom", "routing_collapse", "mod_collapse", "dead_experts")
QUICK = ("nan_grad", "oom", "loss_spike")  # drilled by the command in the quick tier


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


@pytest.mark.slow  # four 40-step runs; the quick tier's command test drills the other faults
def test_collapse_and_dead_expert_faults_are_recovered(prepared, tmp_path: Path) -> None:
    others = [name for name in SAVES_RUNS if name not in QUICK]
    assert len(others) == 3
    _check(run_drills(others, _base(prepared), tmp_path, show=lambda _: None))


def test_the_drill_command_refuses_an_unknown_drill(capsys) -> None:
    assert main(["drill", "--only", "nan_grad,meteor"]) == 2
    err = capsys.readouterr().err
    assert "unknown drill 'meteor'" in err and "nan_grad" in err


def _reports(out: str) -> dict[str, tuple[list[str], str, str]]:
    """drill name -> (detected "kind@step"s, done line, outcome line) of ats_train.drill.describe's
    three lines per drill."""
    lines = out.splitlines()
    reports = {}
    for i, line in enumerate(lines):
        if line[:1].strip() and " detected: " in line:
            name, detected = line.split(" detected: ")
            done, outcome = lines[i + 1].strip(), lines[i + 2].strip()
            reports[name.strip()] = (detected.split(", "), done, outcome)
    return reports


def test_the_drill_command_recovers_nan_gradient_oom_and_loss_spike(
    prepared, tmp_path: Path, capsys
) -> None:
    """Each fault detected by a kind that answers it, acted on, and recovered (the drill's
    RECOVERED: within 2% of the fault-free val loss); exit status 0."""
    shards, tokenizer = prepared
    args = ["drill", "--run-dir", str(tmp_path), "--only", ",".join(QUICK)]
    args += [f"data.source={shards}", f"data.tokenizer={tokenizer}", "train.device=cpu"]
    assert main(args) == 0
    out = capsys.readouterr().out
    reports = _reports(out)
    assert list(reports) == list(QUICK), out
    for name, (detected, done, outcome) in reports.items():
        assert {d.split("@")[0] for d in detected} & set(BY_NAME[name].answers), (name, detected)
        assert done.startswith("done: ") and done != "done: nothing", (name, done)
        assert outcome.startswith("RECOVERED (val "), (name, outcome)
    assert "skip_batch@15" in reports["loss_spike"][0]
    assert "3 of 3 recovered" in out
