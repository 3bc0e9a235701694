"""Judgement that knows the run's phase: nothing trend-like during the LR warmup, a cooldown after
any change, and a change made one step later (and judged on the same numbers) with
train.overlap_host."""

from ats_train.orchestrator.base import AFTER_EVALUATIONS
from ats_train.orchestrator.kinds import KINDS

TREND_KINDS = {name for name, kind in KINDS.items() if kind.phase == AFTER_EVALUATIONS}


def test_trend_kinds_never_judge_the_warmup(run) -> None:
    """The clean tiny-moe run of issue 25 (batch 4 x 64, the default 30-step warmup, 30 steps),
    where lr_rewarm once fired at step 10 and weight_decay at 30 on ordinary early training."""
    r = run(
        **{
            "model.preset": "tiny-moe",
            "train.seq_len": 64,
            "optim.warmup_steps": 30,
            "orchestrator.every": 10,
        }
    )
    assert {"lr_rewarm", "weight_decay", "lr_cut"} <= TREND_KINDS
    assert not [d for d in r.decisions if d["kind"] in TREND_KINDS]
    assert r.trainer.orchestrator.lr_scale == 1.0


def test_every_n_kinds_wait_out_the_cooldown_after_any_change(run) -> None:
    """A routing collapse keeps several MoE kinds firing; after each applied change the others
    wait orchestrator.cooldown steps and judge only records from after it."""
    r = run(**{"faults.routing_collapse_at_step": 2, "orchestrator.cooldown": 10})
    applied = [d for d in r.decisions if d["applied"] and d["kind"] not in ("skip_batch", "oom")]
    assert len(applied) >= 2
    for before, after in zip(applied, applied[1:], strict=False):
        assert after["step"] - before["step"] >= 10, (before, after)
        assert after["evidence"]["records"] <= after["step"] - before["step"]


REWARM_AT_FIRST_CHANCE = {  # lr_rewarm alone, told that any window is a plateau
    "orchestrator.lr_rewarm.plateau": 10.0,
    "orchestrator.lr_rewarm.sigmas": 1000.0,
    "orchestrator.lr_rewarm.max_lr_ratio": 4.0,
    "orchestrator.min_evaluations": 1,
}


def test_with_overlap_host_a_change_lands_one_step_later(run, only) -> None:
    # no evaluation before the end: an evaluation records the pending step first (flush)
    extra = {**only("lr_rewarm"), **REWARM_AT_FIRST_CHANCE, "train.eval_every": 0}
    sync = run(**extra)
    overlap = run(**extra, **{"train.overlap_host": True})
    (first, *_) = sync.fired("lr_rewarm")
    assert overlap.fired("lr_rewarm")[0]["step"] == first["step"]  # judged on the same numbers
    s = first["step"]
    lr_sync = {r["step"]: r["lr"] for r in sync.train_records}
    lr_overlap = {r["step"]: r["lr"] for r in overlap.train_records}
    assert all(lr_sync[k] == lr_overlap[k] for k in range(1, s + 1))
    assert lr_sync[s + 1] == 2.0 * lr_overlap[s + 1]  # the overlapped step s + 1 was in flight
    assert lr_sync[s + 2] == lr_overlap[s + 2]  # from s + 2 on both run with the change
    # the orchestrator's measurements travel with each step: the same numbers, one step late
    for a, b in zip(sync.train_records[:s], overlap.train_records[:s], strict=True):
        assert (a.get("param_norm"), a.get("update_ratio")) == (
            b.get("param_norm"),
            b.get("update_ratio"),
        )
    assert any("param_norm" in r for r in overlap.train_records[:s])



class Run:
    """What _in_phase reads of a run (the RunHandle protocol): its settings and whether its
    objective's loss tracks progress, taken from the objective classes themselves."""

    def __init__(self, objective: type | None) -> None:
        self.values = {"optim.warmup_steps": 10}
        self.loss_tracks_progress = objective is None or objective.loss_tracks_progress

    def setting(self, key: str) -> object:
        return self.values[key]


def test_trend_kinds_do_not_judge_a_grpo_loss() -> None:
    """GRPO's loss is an advantage-weighted log-prob around 0: a "rise" or "plateau" in it says
    nothing about the run (on the H200 lr_cut halved a GRPO run's lr on such noise). Past the
    warmup, with evaluations, the trend kinds judge a pretraining, SFT or DPO run and not a GRPO
    one; the kinds that judge any time still do."""
    from ats_train.objectives.dpo import DPOObjective
    from ats_train.objectives.grpo import GRPOObjective
    from ats_train.objectives.sft import SFTObjective
    from ats_train.orchestrator.orchestrator import Orchestrator
    from ats_train.orchestrator.settings import OrchestratorSection

    orch = Orchestrator(OrchestratorSection())
    orch.eval_means.extend([4.0] * orch.config.min_evaluations)
    lr_cut, grad_clip = orch.kinds["lr_cut"], orch.kinds["grad_clip"]
    for objective in (None, SFTObjective, DPOObjective):
        assert orch._in_phase(lr_cut, Run(objective), step=50)
    assert not orch._in_phase(lr_cut, Run(GRPOObjective), step=50)
    assert orch._in_phase(grad_clip, Run(GRPOObjective), step=50)
