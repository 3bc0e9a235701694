"""The orchestrator as a whole: no intervention on a clean run, modes advise and off, and the
decision history (and every setting it changed) surviving checkpoint and resume, exactly."""

import shutil

import pytest
import torch
from ats_train.batch_geometry import BatchGeometry
from ats_train.build import build_trainer
from ats_train.checkpoint import LATEST, checkpoints_dir
from ats_train.config import load_config
from ats_train.orchestrator import changes
from ats_train.orchestrator.decisions import read_decisions
from ats_train.run_handle import TrainerRunHandle
from safetensors.torch import load_file


def test_clean_run_triggers_no_intervention(clean_run) -> None:
    assert clean_run.decisions == []
    assert clean_run.trainer.orchestrator.history == []
    assert clean_run.trainer.orchestrator.lr_scale == 1.0
    records = clean_run.train_records
    every = clean_run.trainer.orchestrator.config.every
    assert len(records) == 30 and all("memory_gb" in r for r in records)
    # the weights are measured on the steps the every-N kinds judge, and only there
    assert [r["step"] for r in records if "param_norm" in r] == list(range(every, 31, every))
    assert clean_run.final_val_loss < records[0]["loss"] - 0.8  # it did learn


def weights(run) -> dict[str, torch.Tensor]:
    return load_file(str(run.run_dir / "checkpoints" / "step-000030" / "model.safetensors"))


def test_act_is_the_default_mode() -> None:
    assert load_config(None, []).orchestrator.mode == "act"


def test_advise_logs_and_changes_nothing_but_recovery(run) -> None:
    """A routing collapse moves the MoE kinds, which advise only logs: the run is bitwise the
    run without an orchestrator."""
    # grad_clip, a recovery kind, answers the collapse's grad-norm jump: off for this comparison
    collapse = {"faults.routing_collapse_at_step": 2, "orchestrator.grad_clip.enabled": False}
    advised = run(**collapse, **{"orchestrator.mode": "advise"})
    off = run(**collapse, **{"orchestrator.mode": "off"})
    kinds = {d["kind"] for d in advised.decisions}
    assert kinds and not kinds & {"rollback", "skip_batch", "oom", "grad_clip"}
    assert all(d["applied"] is False and d["change"] == {} for d in advised.decisions)
    assert advised.trainer.raw_model.config.moe.n_experts == 8
    a, b = weights(advised), weights(off)
    assert all(torch.equal(a[k], b[k]) for k in a)  # bitwise the run without an orchestrator
    assert read_decisions(off.run_dir) == [] and "param_norm" not in off.train_records[0]


def test_advise_applies_the_recovery_kinds(run) -> None:
    spike = {"faults.grad_spike_at_step": 12, "faults.loss_spike_at_step": 18}
    advised = run(**spike, **{"orchestrator.mode": "advise", "optim.grad_clip": 0.0})
    applied = {d["kind"] for d in advised.decisions if d["applied"]}
    assert {"grad_clip", "skip_batch"} <= applied
    assert advised.trainer.config.optim.grad_clip > 0.0  # clipping switched on
    assert [r["step"] for r in advised.train_records if r.get("skipped")] == [18]


def test_off_mode_does_not_recover_from_oom(run) -> None:
    with pytest.raises(torch.OutOfMemoryError, match="injected out of memory"):
        run(**{"orchestrator.mode": "off", "faults.oom_at_step": 3})


def test_advise_mode_recovers_from_oom(run, tmp_path) -> None:
    r = run(**{"orchestrator.mode": "advise", "faults.oom_at_step": 3})
    (d,) = read_decisions(tmp_path / "run0")
    assert d["kind"] == "oom" and d["applied"] is True
    assert r.trainer.step == 30 and r.trainer.batch.micro_batch == 1


def test_per_kind_switch(run) -> None:
    r = run(**{"orchestrator.grad_clip.enabled": False, "faults.grad_spike_at_step": 12})
    assert "grad_clip" not in {d["kind"] for d in r.decisions}
    assert r.trainer.config.optim.grad_clip == 1.0


def deterministic(decisions: list[dict]) -> list[dict]:
    """Decisions without the wall-clock signals (throughput, process memory)."""
    wall_clock = ("tokens_per_s", "memory_gb")
    return [
        {**d, "signals": {k: v for k, v in d["signals"].items() if k not in wall_clock}}
        for d in decisions
    ]


def roll_back_to(run_dir, step: int) -> None:
    """Make run_dir look like a run killed right after checkpointing `step`."""
    shutil.rmtree(run_dir / "model", ignore_errors=True)  # written by the CLI, not by train()
    for path in checkpoints_dir(run_dir).glob("step-*"):
        if int(path.name.split("-")[1]) > step:
            shutil.rmtree(path)
    (checkpoints_dir(run_dir) / LATEST).write_text(f"step-{step:06d}\n")


@pytest.mark.parametrize(
    ("faults", "resume_at", "kind"),
    [
        ({"faults.grad_spike_at_step": 12, "optim.grad_clip": 10.0}, 20, "grad_clip"),
        # one evaluation of evidence (default 4 in a row), so it acts before the stop
        (
            {"faults.routing_collapse_at_step": 2, "orchestrator.prune_experts.evaluations": 1},
            20,
            "prune_experts",
        ),
    ],
)
def test_history_and_settings_survive_resume_exactly(run, run_in, faults, resume_at, kind) -> None:
    """A run stopped after checkpointing step 20 and resumed ends bitwise equal to the
    uninterrupted one, with the same decisions.jsonl; the settings changed before the stop
    (grad clip; expert count) are in force after the resume."""
    extra = {**faults, "checkpoint.every": 5, "checkpoint.keep_last": 10}
    full = run(**extra)
    before = [d for d in full.decisions if d["step"] <= resume_at]
    assert any(d["kind"] == kind for d in before)
    resumed_dir = full.run_dir.parent / "resumed"
    shutil.copytree(full.run_dir, resumed_dir)
    roll_back_to(resumed_dir, resume_at)
    resumed = run_in(resumed_dir, **extra)
    assert deterministic(resumed.decisions) == deterministic(full.decisions)
    assert len(resumed.trainer.orchestrator.history) == len(full.decisions)
    a, b = weights(full), weights(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    if kind == "grad_clip":
        assert resumed.trainer.config.optim.grad_clip == 5.0
    else:
        n = resumed.trainer.raw_model.config.moe.n_experts
        assert n == full.trainer.raw_model.config.moe.n_experts < 8
    # config.toml keeps what the user asked for
    asked = extra.get("optim.grad_clip", 1.0)
    assert load_config(resumed_dir / "config.toml").optim.grad_clip == asked


def test_expert_streak_survives_resume(run, run_in, only) -> None:
    """prune_experts needs the same dead expert at 4 evaluations in a row (every 5 steps from step
    10: it acts at step 25); a run stopped at step 20, 3 evaluations into the streak, acts at the
    same step with the same decision after the resume."""
    extra = {
        **only("prune_experts"),
        "faults.routing_collapse_at_step": 2,
        "checkpoint.every": 5,
        "checkpoint.keep_last": 10,
    }
    full = run(**extra)
    assert [d["step"] for d in full.decisions] == [25]
    resumed_dir = full.run_dir.parent / "resumed"
    shutil.copytree(full.run_dir, resumed_dir)
    roll_back_to(resumed_dir, 20)
    resumed = run_in(resumed_dir, **extra)
    assert deterministic(resumed.decisions) == deterministic(full.decisions)
    a, b = weights(full), weights(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_repeated_advice_is_shown_once_per_advice_every_and_logged_always(tmp_path) -> None:
    from ats_train.orchestrator.decisions import DecisionLog

    shown: list[str] = []
    log = DecisionLog(tmp_path, shown.append, advice_every=20)

    def decision(step: int, kind: str, applied: bool) -> dict:
        return {"step": step, "kind": kind, "applied": applied, "reason": "r",
                "confidence": 1.0, "action": "a", "change": {}}  # fmt: skip

    for step in (10, 20, 30):
        log.write(decision(step, "early_stop", applied=False))
    log.write(decision(40, "lr_cut", applied=True))
    log.write(decision(50, "lr_cut", applied=True))
    assert [d["step"] for d in read_decisions(tmp_path)] == [10, 20, 30, 40, 50]
    # advice at 10 shown, at 20 not (10 steps later), at 30 again; every applied change shown
    assert len(shown) == 4 and "step 10: early_stop" in shown[0]
    assert "step 30: early_stop" in shown[1]
    assert "step 40: lr_cut" in shown[2] and "step 50: lr_cut" in shown[3]


def test_kinds_judging_the_same_records_compute_the_signals_once(clean_run) -> None:
    """A clean run fires nothing, so at every evaluation all every-N kinds see the same records:
    one signals computation per evaluation (every 5 steps, once min_records have accumulated),
    not once per enabled kind. conftest's clean_run counts the computations."""
    calls = clean_run.signal_steps
    assert clean_run.decisions == []
    assert len(calls) >= 4 and calls == sorted(set(calls))  # each evaluation once
    assert all(step % 5 == 0 for step in calls)


def test_run_changes_replace_the_config_and_leave_the_old_one_whole(clean_run) -> None:
    """A change record swaps the run's config for a copy with the new value (the section objects
    handed out before keep what they said); a value that is no record is refused."""
    trainer = clean_run.trainer
    before = trainer.config
    handle = TrainerRunHandle(trainer)
    try:
        handle.apply(changes.SetGradClip(0.25))
        handle.apply(changes.SetLossWeight("moe_lb_weight", 0.5))
        handle.apply(changes.SetCadence(eval_every=3, checkpoint_every=7))
        handle.apply(changes.SplitMicroBatch(1))
        now = trainer.config
        assert (now.optim.grad_clip, now.loss.moe_lb_weight) == (0.25, 0.5)
        assert (now.train.eval_every, now.checkpoint.every, now.train.micro_batch_size) == (3, 7, 1)
        assert handle.setting("optim.grad_clip") == 0.25
        # the step's split follows: micro-batches of 1, the global batch unchanged
        assert handle.batch == BatchGeometry.of(now.train.batch_size, 1, 1)
        assert trainer.aux_weights()["moe_lb"] == 0.5  # what the next forward_backward weighs by
        assert before.optim.grad_clip != 0.25 and before.train.eval_every == 10
        assert before.loss.moe_lb_weight != 0.5 and before.train.micro_batch_size == 2
        with pytest.raises(TypeError, match="not a run change"):
            handle.apply({"optim.grad_clip": 1.0})
    finally:
        trainer.config = before


def test_param_norm_and_update_ratio_match_the_weights(tiny_config, tmp_path) -> None:
    """A judged step's param_norm (the weight matrices after the update) and update_ratio
    (||update|| / ||weights before it||, every parameter) against the weights read by hand."""
    torch.set_num_threads(1)
    with build_trainer(tiny_config(), tmp_path) as trainer:
        every = trainer.orchestrator.config.every
        for _ in range(2 * every - 1):  # the next step is judged, the one before was too
            record = trainer.train_step()
        assert "param_norm" not in record and "update_ratio" not in record  # not judged
        params = list(trainer.raw_model.parameters())
        before = [p.detach().double().clone() for p in params]
        record = trainer.train_step()
        after = [p.detach().double() for p in params]
    delta_sq = sum(float(((a - b) ** 2).sum()) for a, b in zip(after, before, strict=True))
    before_sq = sum(float((b**2).sum()) for b in before)
    matrices_sq = sum(float((a**2).sum()) for a in after if a.ndim >= 2)
    assert delta_sq > 0
    assert record["update_ratio"] == pytest.approx((delta_sq / before_sq) ** 0.5, rel=1e-5)
    assert record["param_norm"] == pytest.approx(matrices_sq**0.5, rel=1e-5)
