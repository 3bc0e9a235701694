"""One fault-injection test per intervention kind, each on a real tiny training run.

Each test injects a condition (TrainConfig [faults], or a config that creates it), switches every
other kind off, and checks (1) the kind fired and logged to decisions.jsonl, (2) the thing it names
changed, read from the optimizer, the model or the run's settings afterwards, and (3) the run
finished with a final val loss within a stated margin of the clean baseline run (conftest).
"""

import math

import pytest
import torch
from ats_model.serialization.model_dir import read_config

# Final val loss of a faulted run minus the clean run's, in nats. The clean tiny run ends near
# 4.56 from 5.75 at init; a run the fault did not derail ends within MARGIN of it.
MARGIN = 0.25


STEPS = 30  # conftest's run length


def last_lr(run) -> float:
    """The lr the last step used: schedule x fault factor x the orchestrator's lr_scale."""
    t = run.trainer
    return t.schedule(STEPS - 1) * t.faults.lr_factor(STEPS) * t.orchestrator.lr_scale


def assert_close_to_clean(run, clean_run, margin: float = MARGIN) -> None:
    assert math.isfinite(run.final_val_loss)
    assert run.final_val_loss < clean_run.final_val_loss + margin, (
        run.final_val_loss,
        clean_run.final_val_loss,
    )


def test_lr_cut_on_divergence(run, clean_run, only) -> None:
    diverge = {"faults.diverge_at_step": 12, "faults.diverge_lr_factor": 50}
    r = run(**only("lr_cut"), **diverge, **{"orchestrator.lr_cut.scale": 0.2})
    (first, *_) = r.fired("lr_cut")
    assert first["change"]["lr_scale"] == [1.0, 0.2]
    assert r.trainer.orchestrator.lr_scale <= 0.2
    for group in r.trainer.optimizer.param_groups:
        assert group["lr"] == pytest.approx(last_lr(r))
    assert_close_to_clean(r, clean_run, margin=0.5)  # 50x the lr for a few steps costs something


def test_lr_rewarm_on_plateau(run, clean_run, only) -> None:
    stall = {"faults.plateau_at_step": 4, "faults.plateau_lr_factor": 0.002}
    # judged from the first evaluation after warmup (the default waits for 3); one re-warm of
    # x400 (once the lr moves, the loss falls faster than its noise: no second plateau)
    soon = {"orchestrator.min_evaluations": 1}
    # by default a re-warm only gives back what an lr cut took (lr_scale <= max_lr_ratio 1.0):
    # the same stall is left alone
    assert not run(**only("lr_rewarm"), **stall, **soon).fired("lr_rewarm")
    above_schedule = {"orchestrator.lr_rewarm.scale": 400, "orchestrator.lr_rewarm.max_lr_ratio": 400}
    r = run(**only("lr_rewarm"), **stall, **soon, **above_schedule)
    assert r.fired("lr_rewarm")
    assert r.trainer.orchestrator.lr_scale >= 20.0
    for group in r.trainer.optimizer.param_groups:
        assert group["lr"] == pytest.approx(last_lr(r))
    # the stall is injected for the whole run: the re-warm must beat the same stall left alone
    stalled = run(**stall, **{"orchestrator.mode": "off"})
    assert r.final_val_loss < stalled.final_val_loss - 0.1
    # 6 steps at 0.2% of the lr cannot be made up in 30: a wide stated margin
    assert_close_to_clean(r, clean_run, margin=1.1)


def test_grad_clip_tightened_on_grad_spike(run, clean_run, only) -> None:
    spike = {**only("grad_clip"), "faults.grad_spike_at_step": 12}
    # the default clip 1.0 is within bounded_ratio (4) x the median grad norm (~1.2): it already
    # bounds the spike's update, and is left alone
    assert not run(**spike).fired("grad_clip")
    r = run(**spike, **{"optim.grad_clip": 10.0})
    (d,) = r.fired("grad_clip")
    assert d["change"]["optim.grad_clip"] == [10.0, 5.0]
    assert r.trainer.config.optim.grad_clip == 5.0  # what train_step hands the backend
    assert_close_to_clean(r, clean_run)


def test_skip_batch_on_loss_spike(run, clean_run, only) -> None:
    r = run(**only("skip_batch"), **{"faults.loss_spike_at_step": 15})
    (d,) = r.fired("skip_batch")
    assert d["step"] == 15
    spiked = [x for x in r.train_records if x["step"] == 15][0]
    assert spiked["skipped"] is True and spiked["stepped"] is False
    # the optimizer took one update fewer than the steps run
    state = r.trainer.optimizer.state[r.trainer.optimizer.param_groups[0]["params"][0]]
    assert int(state["step"]) == STEPS - 1
    assert_close_to_clean(r, clean_run)


def test_rollback_on_nan(run, clean_run, only) -> None:
    nan = {"faults.nan_grad_at_step": 13, "checkpoint.every": 5}
    r = run(**only("rollback"), **nan, **{"orchestrator.rollback.first_scale": 0.5})
    (d,) = r.fired("rollback")
    assert d["change"]["step"] == [13, 10]
    assert d["change"]["lr_scale"] == [1.0, 0.5]
    steps = [x["step"] for x in r.train_records]
    assert steps.count(11) == 2 and steps.count(14) == 1  # 11-13 replayed from the checkpoint
    assert r.trainer.step == STEPS
    for group in r.trainer.optimizer.param_groups:
        assert group["lr"] == pytest.approx(last_lr(r))
    assert all(torch.isfinite(p).all() for p in r.trainer.raw_model.parameters())
    assert_close_to_clean(r, clean_run)


def test_oom_recovery_keeps_the_global_batch(run, clean_run, only) -> None:
    r = run(**only("oom"), **{"faults.oom_at_step": 5, "faults.oom_max_micro_batch": 1})
    (d,) = r.fired("oom")
    assert d["step"] == 5
    assert d["change"] == {"train.micro_batch_size": [2, 1], "accumulation": [2, 4]}
    train = r.trainer.config.train
    assert (train.batch_size, train.micro_batch_size, r.trainer.batch.micro_batch) == (4, 1, 1)
    assert [x["step"] for x in r.train_records] == list(range(1, STEPS + 1))  # step 5 retried
    assert_close_to_clean(r, clean_run)


def test_prune_experts_under_utilization_floor(run, clean_run, only) -> None:
    r = run(**only("prune_experts"), **{"faults.routing_collapse_at_step": 2})
    (d, *_) = r.fired("prune_experts")
    model, opt = r.trainer.raw_model, r.trainer.optimizer
    n = 8 - len(r.fired("prune_experts"))
    assert d["change"]["n_experts"] == [8, 7]
    assert all(e >= 2 for layer in d["change"]["dropped"][1] for e in layer)  # unused ones only
    assert model.config.moe.n_experts == n
    opt_params = {id(p) for g in opt.param_groups for p in g["params"]}
    for layer in model.moe_layers():
        assert layer.router.weight.shape[0] == layer.experts.w1.shape[0] == n
        assert layer.expert_bias.shape == (n,)
        for p in (layer.router.weight, layer.experts.w1, layer.experts.w2, layer.experts.w3):
            assert id(p) in opt_params and opt.state[p]["exp_avg"].shape == p.shape
    # the pruned model checkpoints: its config.json carries the new expert count
    saved = read_config(r.run_dir / "checkpoints" / f"step-{STEPS:06d}")
    assert saved.moe.n_experts == n
    assert_close_to_clean(r, clean_run)


def test_split_overloaded_expert(run, clean_run, only) -> None:
    r = run(**only("split_expert"), **{"faults.routing_collapse_at_step": 2})
    (d, *_) = r.fired("split_expert")
    assert d["change"]["n_experts"] == [8, 9] and set(d["change"]["split"][1]) <= {0, 1}
    model, opt = r.trainer.raw_model, r.trainer.optimizer
    n = 8 + len(r.fired("split_expert"))
    assert model.config.moe.n_experts == n
    for layer in model.moe_layers():
        assert (
            layer.experts.w1.shape[0] == n and opt.state[layer.experts.w1]["exp_avg"].shape[0] == n
        )
    assert_close_to_clean(r, clean_run)


def test_capacity_factor_raised_on_drops(run, clean_run, only) -> None:
    r = run(
        **only("capacity_factor"),
        **{"model.moe.capacity_factor": 1.0, "faults.routing_collapse_at_step": 2},
    )
    decisions = r.fired("capacity_factor")
    assert decisions
    expected = min(4.0, 1.25 ** len(decisions))
    for layer in r.trainer.raw_model.moe_layers():
        assert layer.capacity_factor == pytest.approx(expected)
    assert_close_to_clean(r, clean_run, margin=0.5)  # 2 of 8 experts, capacity-bound, all run


def test_router_temperature_raised_on_entropy_collapse(run, clean_run, only) -> None:
    r = run(
        **only("router_temperature"),
        **{"faults.router_sharpen_at_step": 5, "faults.router_sharpen_factor": 100},
    )
    decisions = r.fired("router_temperature")
    assert decisions and decisions[0]["change"]["moe.temperature"][1] == [1.5, 1.5]
    for layer in r.trainer.raw_model.moe_layers():
        assert layer.temperature == pytest.approx(min(4.0, 1.5 ** len(decisions)))
    assert_close_to_clean(r, clean_run, margin=0.5)  # 100x router logits stay hard-routed


def test_aux_loss_weight_raised_on_imbalance(run, clean_run, only) -> None:
    r = run(**only("aux_loss_weights"), **{"faults.routing_collapse_at_step": 2})
    (d, *_) = r.fired("aux_loss_weights")
    assert d["change"]["loss.moe_lb_weight"] == [0.01, 0.02]
    weight = r.trainer.config.loss.moe_lb_weight
    assert weight == pytest.approx(0.01 * 2 ** len(r.fired("aux_loss_weights")))
    assert r.trainer.aux_weights()["moe_lb"] == weight  # what forward_backward multiplies by
    assert_close_to_clean(r, clean_run, margin=0.5)


def test_bias_rate_raised_on_imbalance(run, clean_run, only) -> None:
    r = run(**only("bias_rate"), **{"faults.routing_collapse_at_step": 2})
    (d, *_) = r.fired("bias_rate")
    assert d["change"]["moe.bias_update_rate"][1][0] == 1e-3
    for layer in r.trainer.raw_model.moe_layers():
        assert layer.bias_update_rate >= 1e-3
        # the rate is in use: the starved experts' selection bias has been raised since
        assert (layer.expert_bias[2:] > 0).all()
    assert_close_to_clean(r, clean_run, margin=0.5)


def test_mod_capacity_anneals_to_target(run, clean_run, only) -> None:
    r = run(
        **only("mod_capacity"),
        **{"model.mod.capacity": 1.0, "orchestrator.mod_capacity.target_capacity": 0.5},
    )
    decisions = r.fired("mod_capacity")
    assert decisions and decisions[0]["change"]["mod.capacity"] == [1.0, 0.8]
    capacity = r.trainer.raw_model.mod_layers()[0].capacity
    assert capacity == pytest.approx(decisions[-1]["change"]["mod.capacity"][1]) and capacity < 1
    # the model really routes fewer tokens: the step after each decision keeps ceil(c * T) of T
    records = {x["step"]: x for x in r.train_records}
    for d in decisions[:-1]:
        after = d["change"]["mod.capacity"][1]
        kept = records[d["step"] + 1]["mod/selected_fraction"][0]
        assert kept == pytest.approx(math.ceil(after * 32) / 32)
    assert_close_to_clean(r, clean_run)


def test_mod_collapse_guard(run, clean_run, only) -> None:
    r = run(**only("mod_collapse"), **{"faults.mod_collapse_at_step": 5})
    (d, *_) = r.fired("mod_collapse")
    assert d["change"]["loss.mod_predictor_weight"] == [0.1, 0.2]
    assert r.trainer.aux_weights()["mod_predictor"] == r.trainer.config.loss.mod_predictor_weight
    assert_close_to_clean(r, clean_run)


def test_weight_decay_raised_on_weight_growth(run, clean_run, only) -> None:
    r = run(
        **only("weight_decay"),
        **{"faults.weight_growth_at_step": 8, "faults.weight_growth_factor": 2},
    )
    (d, *_) = r.fired("weight_decay")
    assert d["change"]["param_groups[0].weight_decay"] == [0.1, 0.2]
    decay, no_decay = r.trainer.optimizer.param_groups
    assert decay["weight_decay"] == pytest.approx(0.1 * 2 ** len(r.fired("weight_decay")))
    assert no_decay["weight_decay"] == 0.0
    assert_close_to_clean(r, clean_run, margin=0.5)


def test_batch_ramp_doubles_the_global_batch(run, clean_run, only) -> None:
    r = run(
        **only("batch_ramp"),
        **{
            "orchestrator.batch_ramp.max_batch_size": 8,
            "faults.plateau_at_step": 4,
            "faults.plateau_lr_factor": 0.002,
        },
    )
    (d,) = r.fired("batch_ramp")
    assert d["change"] == {"train.batch_size": [4, 8], "accumulation": [2, 4]}
    t = r.trainer
    assert (t.config.train.batch_size, t.batch.micro_batch, t.train_loader.batch_size) == (8, 2, 8)
    x, _ = next(t.train_loader)
    assert x.shape == (8, 32)
    assert_close_to_clean(r, clean_run, margin=1.5)  # the injected plateau stalls learning


def test_eval_and_checkpoint_more_often_under_instability(run, clean_run, only) -> None:
    r = run(
        **only("eval_ckpt_frequency"),
        **{"faults.loss_spike_at_step": 18, "checkpoint.every": 10},
        **{"orchestrator.eval_ckpt_frequency.min_interval": 1},  # the default floor is 50 steps
    )
    (d,) = r.fired("eval_ckpt_frequency")
    assert d["change"] == {"train.eval_every": [10, 5], "checkpoint.every": [10, 5]}
    assert (r.trainer.config.train.eval_every, r.trainer.config.checkpoint.every) == (5, 5)
    val_steps = [x["step"] for x in r.records if x["kind"] == "val"]
    assert [s for s in val_steps if s > d["step"]][0] % 10 == 5  # the new cadence is in use
    assert_close_to_clean(r, clean_run)


def test_early_stop_at_convergence(run, clean_run, only) -> None:
    r = run(
        **only("early_stop"),
        **{"faults.plateau_at_step": 3, "orchestrator.early_stop.patience": 2},
        **{"orchestrator.early_stop.enabled": True},  # opt-in
    )
    (d,) = r.fired("early_stop")
    t = r.trainer
    assert t.orchestrator.stop_requested and t.step == d["step"] < STEPS
    assert (r.run_dir / "checkpoints" / f"step-{t.step:06d}").is_dir()  # final checkpoint
    # stopping lost nothing: the loss had not moved over the last evaluations
    means = t.orchestrator.eval_means
    assert abs(means[-1] - means[-2]) < 0.02 * means[-2]
    assert r.final_val_loss < clean_run.final_val_loss + 1.5  # the injected plateau, not the stop
