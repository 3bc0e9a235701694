"""parallel.expert_parallel: read from the command line, and each setting it cannot run with
refused in one line naming the key, the value and what is expected (no launch: the model and
world-size checks take them as arguments)."""

import dataclasses
import re

import pytest
from ats_model import presets
from ats_train.config import ConfigError, load_config
from ats_train.config.parallel import check_expert_parallel

NO_SURGERY = ["orchestrator.prune_experts.enabled=false", "orchestrator.split_expert.enabled=false"]
DDP_EP2 = ["parallel.backend=ddp", "parallel.expert_parallel=2", *NO_SURGERY]
FSDP2_EP2 = ["parallel.backend=fsdp2", "parallel.expert_parallel=2", *NO_SURGERY]


def test_the_key_reads_as_an_int_and_defaults_to_1() -> None:
    assert load_config(None).parallel.expert_parallel == 1
    assert load_config(None, DDP_EP2).parallel.expert_parallel == 2
    assert load_config(None, FSDP2_EP2).parallel.expert_parallel == 2


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["parallel.backend=ddp", "parallel.expert_parallel=0"],
            "parallel.expert_parallel = 0 must be an int >= 1 (1 = experts replicated)",
        ),
        (
            ["parallel.expert_parallel=2", *NO_SURGERY],
            "parallel.expert_parallel = 2 runs with parallel.backend ddp or fsdp2, not 'single'",
        ),
        (
            [*FSDP2_EP2, "parallel.fsdp2.cpu_offload=true"],
            "parallel.expert_parallel = 2 cannot run with parallel.fsdp2.cpu_offload = true",
        ),
        (
            ["parallel.backend=deepspeed", "parallel.expert_parallel=2", *NO_SURGERY],
            "parallel.expert_parallel = 2 runs with parallel.backend ddp or fsdp2, not 'deepspeed'",
        ),
        (
            ["parallel.backend=ddp", "parallel.expert_parallel=2"],
            "parallel.expert_parallel = 2 cannot run with orchestrator.prune_experts.enabled = true",
        ),
        (
            [*DDP_EP2[:2], "orchestrator.prune_experts.enabled=false"],
            "parallel.expert_parallel = 2 cannot run with orchestrator.split_expert.enabled = true",
        ),
        (
            [*DDP_EP2, "train.trainable=lora"],
            "parallel.expert_parallel = 2 cannot run with train.trainable = 'lora'",
        ),
        (
            [*DDP_EP2, "checkpoint.format=sharded"],
            "parallel.expert_parallel = 2 cannot run with checkpoint.format = 'sharded'",
        ),
        (
            [*DDP_EP2, "train.cuda_graphs=true"],
            "parallel.expert_parallel = 2 cannot run with train.cuda_graphs = true",
        ),
        (
            [*DDP_EP2, "train.objective=grpo", "model.init_from=/models/base"],
            "parallel.expert_parallel = 2 cannot run with train.objective = 'grpo'",
        ),
        (
            [*DDP_EP2, "train.precision=fp16"],
            "parallel.expert_parallel = 2 cannot run with train.precision = 'fp16'",
        ),
    ],
    ids=[
        "zero",
        "single",
        "fsdp2-cpu-offload",
        "deepspeed",
        "prune-experts",
        "split-expert",
        "lora",
        "sharded-checkpoint",
        "cuda-graphs",
        "grpo",
        "fp16",
    ],
)
def test_a_setting_expert_parallelism_cannot_run_with_is_refused(
    overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match="^" + re.escape(message)) as caught:
        load_config(None, overrides)
    assert "\n" not in str(caught.value)


def test_surgery_kinds_are_allowed_where_the_orchestrator_only_advises() -> None:
    config = load_config(
        None, ["parallel.backend=ddp", "parallel.expert_parallel=2"] + ["orchestrator.mode=advise"]
    )
    assert config.parallel.expert_parallel == 2


def test_the_model_and_the_world_size_are_checked() -> None:
    moe = presets.get("tiny-moe")  # 8 experts
    check_expert_parallel(2, moe, world_size=4)
    check_expert_parallel(8, moe, world_size=8)
    check_expert_parallel(1, presets.get("tiny-dense"), world_size=3)  # 1 holds for anything
    cases = [
        (
            2,
            presets.get("tiny-dense"),
            2,
            "parallel.expert_parallel = 2 needs a model with MoE layers (family moe or hybrid), "
            "not family 'dense'",
        ),
        (
            2,
            presets.get("tiny-mod"),
            2,
            "parallel.expert_parallel = 2 needs a model with MoE layers (family moe or hybrid), "
            "not family 'mod'",
        ),
        (
            3,
            moe,
            3,
            "parallel.expert_parallel = 3 must divide model.moe.n_experts = 8 (each rank holds "
            "n_experts / expert_parallel experts)",
        ),
        (
            2,
            dataclasses.replace(moe, moe=dataclasses.replace(moe.moe, n_experts=6)),
            3,
            "parallel.expert_parallel = 2 must divide the world size 3 (torchrun --nproc-per-node)",
        ),
    ]
    for size, model, world, message in cases:
        with pytest.raises(ConfigError, match="^" + re.escape(message) + "$"):
            check_expert_parallel(size, model, world)
