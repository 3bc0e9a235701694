"""`ats-train plan` output, and a run sized by [plan]."""

import math

import pytest
from ats_model import count_params, flops_per_token, presets
from ats_train.build import build_trainer
from ats_train.cli import main
from ats_train.config import load_config


def test_plan_cli_prints_the_compute_optimal_plan(capsys) -> None:
    assert main(["plan", "--flops", "1e20"]) == 0
    out = capsys.readouterr().out
    assert "compute-optimal N   9.09e+08 parameters" in out  # Table 3: ~1B at 1.21e20
    assert "compute-optimal D   1.834e+10 tokens" in out
    assert "tokens / parameter  20.2" in out


def test_plan_cli_for_a_preset_and_bad_input(capsys) -> None:
    assert main(["plan", "--flops", "1e18", "--preset", "20m-dense", "--seq-len", "1024"]) == 0
    out = capsys.readouterr().out
    assert "preset 20m-dense" in out and "steps of 256 x 1024" in out
    assert main(["plan", "--flops", "0"]) == 2
    assert main(["plan", "--flops", "1e18", "--preset", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "--preset 'nope' is not a preset" in err
    for flops in ("inf", "nan", "-1e20"):  # inf printed a plan of nan, rc 0
        assert main(["plan", f"--flops={flops}"]) == 2
        err = capsys.readouterr()
        assert err.out == ""
        assert (
            err.err
            == f"ats-train plan: error: --flops = {float(flops)} must be a finite number > 0\n"
        )


@pytest.mark.parametrize("steps_from", ["tokens_per_param", "flops"])
def test_the_trainer_sizes_its_run_from_the_plan(overrides, tmp_path, steps_from) -> None:
    extra = {"plan__steps_from": steps_from, "plan__tokens_per_param": 2, "plan__flops": 3e11}
    config = load_config(None, overrides(**extra))
    trainer = build_trainer(config, tmp_path)
    trainer.close()
    model_config = trainer.raw_model.config
    tokens_per_step = 4 * 32
    if steps_from == "tokens_per_param":
        tokens = 2 * count_params(model_config)[1]
    else:
        tokens = 3e11 / flops_per_token(model_config, 32)
    assert trainer.config.train.steps == math.ceil(tokens / tokens_per_step)
    assert trainer.schedule.total_steps == trainer.config.train.steps
    assert load_config(tmp_path / "config.toml").train.steps == trainer.config.train.steps
    assert presets.get("tiny-hybrid").moe.n_experts == model_config.moe.n_experts
