"""TrainConfig: TOML + dotted overrides, typed parsing, nearest-key suggestions, validation."""

from pathlib import Path

import pytest
from ats_train.config import (
    ConfigError,
    TrainConfig,
    build_config,
    load_config,
    to_toml,
    valid_keys,
)
from ats_train.model_config import build_model_config
from ats_train.orchestrator.settings import RENAMED


def test_defaults_round_trip_through_toml(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(to_toml(TrainConfig()))
    assert load_config(path) == TrainConfig()


def test_overrides_are_parsed_by_field_type() -> None:
    c = load_config(
        None,
        [
            "train.steps=10",
            "optim.lr=3e-4",
            "train.compile=true",
            "optim.betas=[0.8, 0.99]",
            "data.tokenizer=none",
            "train.micro_batch_size=4",
            "data.source=some/file.txt",
            "kernels=reference",
        ],
    )
    assert c.train.steps == 10 and isinstance(c.train.steps, int)
    assert c.optim.lr == 3e-4 and isinstance(c.optim.lr, float)
    assert c.train.compile is True
    assert c.optim.betas == (0.8, 0.99)
    assert c.data.tokenizer is None
    assert c.train.micro_batch_size == 4
    assert c.data.source == "some/file.txt"
    assert c.kernels == "reference"


def test_overrides_win_over_the_file_and_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text(
        'kernels = "reference"\n[train]\nsteps = 7\nseq_len = 32\n[optim]\nlr = 1\n'
        '[model]\npreset = "tiny-moe"\nn_layer = 3\n[model.moe]\nn_experts = 4\n'
    )
    c = load_config(path, ["train.steps=9", "model.moe.top_k=1"])
    assert (c.train.steps, c.train.seq_len, c.optim.lr) == (9, 32, 1.0)
    assert c.kernels == "reference"
    assert c.model.preset == "tiny-moe"
    assert c.model.overrides == {"n_layer": 3, "moe.n_experts": 4, "moe.top_k": 1}
    again = tmp_path / "again.toml"
    again.write_text(to_toml(c))
    assert load_config(again) == c


@pytest.mark.parametrize(
    ("override", "suggestion"),
    [
        ("train.stesp=3", "train.steps"),
        ("optim.weight_decy=0.1", "optim.weight_decay"),
        ("trian.seed=1", "train.seed"),
        ("model.n_layr=2", "model.n_layer"),
        ("model.moe.n_expert=2", "model.moe.n_experts"),
        ("checkpoint.evry=5", "checkpoint.every"),
        # by meaning first: the closest spelling of learning_rate is optim.min_lr
        ("optim.learning_rate=1e-3", "optim.lr"),
        ("train.learning_rate=1e-3", "optim.lr"),
        ("train.max_steps=10", "train.steps"),
        ("train.block_size=64", "train.seq_len"),
        ("optim.max_grad_norm=1", "optim.grad_clip"),
    ],
)
def test_unknown_key_suggests_the_nearest(override: str, suggestion: str) -> None:
    with pytest.raises(ConfigError, match=f"did you mean '{suggestion}'"):
        load_config(None, [override])


def test_a_kinds_old_generic_knob_names_its_new_key() -> None:
    """orchestrator.<kind>.threshold / factor / limit / target are refused with the kind's own
    name for that knob, which is a key the config accepts; no kind has a generic knob left."""
    assert len(RENAMED) == 46  # every generic knob a kind used
    keys = set(valid_keys())
    for old, new in RENAMED.items():
        assert new in keys and old not in keys, (old, new)
        with pytest.raises(ConfigError, match=f"{old!r} was renamed; use {new!r}"):
            load_config(None, [f"{old}=1"])
    generic = {"threshold", "factor", "limit", "target"}
    assert not [k for k in keys if k.startswith("orchestrator.") and k.split(".")[-1] in generic]
    config = load_config(
        None, ["orchestrator.lr_cut.sigmas=3", "orchestrator.early_stop.patience=5"]
    )
    assert (config.orchestrator.lr_cut.sigmas, config.orchestrator.early_stop.patience) == (3, 5)


def test_unknown_key_in_a_file_suggests_the_nearest(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text("[train]\nbatch_sise = 4\n")
    with pytest.raises(ConfigError, match="train.batch_sise.*did you mean 'train.batch_size'"):
        load_config(path)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.steps=ten"], "train.steps = 'ten' is not a valid int"),
        (["optim.lr=fast"], "optim.lr = 'fast' is not a valid float"),
        (["train.compile=maybe"], "train.compile = 'maybe' is not a valid bool"),
        (["optim.betas=[0.9]"], "expected 2 values"),
        (["train.precision=fp4"], "train.precision = 'fp4' is not one of fp32, bf16, fp16, fp8"),
        (
            ["train.residual_stream=bf16"],
            "train.residual_stream = 'bf16' is not one of fp32, autocast$",
        ),
        (["train.residual_stream=autocast"], "'autocast' needs train.precision bf16 or fp16"),
        (
            ["train.precision=fp16", "train.fused_loss=true"],
            "train.fused_loss = true cannot run with train.precision = 'fp16'",
        ),
        (["train.fused_loss_rows=-1"], "train.fused_loss_rows = -1 must be >= 0"),
        (["train.steps=0"], "train.steps = 0 must be > 0"),
        (["optim.min_lr=1", "optim.lr=0.1"], "optim.min_lr = 1.0 must be in"),
        (["train.batch_size=6", "train.micro_batch_size=4"], "not a multiple"),
        (["optim.schedule=linear"], "optim.schedule = 'linear' is not one of cosine, wsd"),
        (["parallel.backend=nccl"], "parallel.backend = 'nccl' is not one of single, ddp, fsdp2"),
        (
            ["parallel.fsdp2.cpu_offload=true"],
            "parallel.fsdp2.cpu_offload = true needs parallel.backend = 'fsdp2', not 'single'",
        ),
        (
            ["parallel.backend=ddp", "parallel.fsdp2.reshard_after_forward=false"],
            "parallel.fsdp2.reshard_after_forward = false needs parallel.backend = 'fsdp2', "
            "not 'ddp'",
        ),
        (
            ["parallel.backend=fsdp2", "parallel.fsdp2.unit_blocks=-1"],
            "parallel.fsdp2.unit_blocks = -1 must be >= 0",
        ),
        (
            ["parallel.backend=deepspeed", "parallel.deepspeed.zero_stage=4"],
            "parallel.deepspeed.zero_stage = 4 is not one of 1, 2, 3",
        ),
        (
            ["parallel.backend=deepspeed", "parallel.deepspeed.zero_stage=two"],
            "parallel.deepspeed.zero_stage = 'two' is not a valid int",
        ),
        (
            ["parallel.backend=deepspeed", "parallel.deepspeed.offload_param=cpu"],
            "parallel.deepspeed.offload_param = 'cpu' needs parallel.deepspeed.zero_stage = 3",
        ),
        (
            ["parallel.backend=colossalai", "parallel.colossalai.plugin=gemini"],
            "parallel.colossalai.plugin = 'gemini' is not one of low_level_zero$",
        ),
        (["train.steps"], "not of the form key=value"),
        # no float knob means anything at inf or nan: refused when the config is read, not at
        # the last step (optim.lr = inf trained to a nan sample)
        (["optim.lr=inf"], "optim.lr = inf is not a finite number"),
        (["optim.lr=nan"], "optim.lr = nan is not a finite number"),
        (["optim.lr=-1e-3"], "optim.lr = -0.001 must be > 0"),
        (["optim.weight_decay=inf"], "optim.weight_decay = inf is not a finite number"),
        (["optim.grad_clip=inf"], "optim.grad_clip = inf is not a finite number"),
        (["optim.eps=inf"], "optim.eps = inf is not a finite number"),
        (["optim.betas=[0.9, nan]"], "optim.betas = nan is not a finite number"),
        (["loss.moe_z_weight=inf"], "loss.moe_z_weight = inf is not a finite number"),
        (["orchestrator.lr_cut.scale=inf"], "orchestrator.lr_cut.scale = inf is not a finite"),
        (["plan.flops=inf"], "plan.flops = inf is not a finite number"),
        (["model.dropout=nan"], "model.dropout = nan is not a finite number"),
        (["faults.diverge_lr_factor=-30"], "faults.diverge_lr_factor = -30.0 must be > 0"),
        (["faults.nan_grad_times=0"], "faults.nan_grad_times = 0 must be >= 1"),
        (["checkpoint.format=dcp"], "checkpoint.format = 'dcp' is not one of full, sharded"),
        (
            ["checkpoint.format=sharded", "parallel.backend=colossalai"],
            "checkpoint.format = 'sharded' is not implemented for parallel.backend = 'colossalai'",
        ),
    ],
)
def test_bad_values_name_key_and_value(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        load_config(None, overrides)


def test_wrong_type_in_toml_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('[train]\nsteps = "many"\n')
    with pytest.raises(ConfigError, match="train.steps = 'many' is not a valid int"):
        load_config(path)


def test_missing_or_invalid_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match=f"config file {tmp_path} is a directory; pass a TOML"):
        load_config(tmp_path)
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    bad.write_bytes(b"[train]\nsample_prompt = '\xff'\n")
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        load_config(bad)


def test_deeply_nested_toml_is_one_error_line(tmp_path: Path) -> None:
    """tomllib recurses per nesting level: a RecursionError became a traceback."""
    deep = tmp_path / "deep.toml"
    deep.write_text("[model]\noverrides = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match=f"config file {deep} nests tables or arrays too deeply"):
        load_config(deep)
    with pytest.raises(
        ConfigError, match=r"optim.betas = '\[\[\[.*\.\.\. \(6002 characters\) is not a valid tuple"
    ):
        load_config(None, ["optim.betas=" + "[" * 3000 + "]" * 3000])


def test_top1_routing_must_keep_the_probability_as_its_weight() -> None:
    """Renormalizing one weight makes it 1.0: the router would learn nothing from the loss."""
    switch = build_config({"model.preset": "tiny-moe", "model.moe.top_k": 1})
    with pytest.raises(ConfigError, match="model.moe.top_k = 1 with model.moe.norm_topk = true"):
        build_model_config(switch.model, 320, 32)
    weighted = build_config(
        {"model.preset": "tiny-moe", "model.moe.top_k": 1, "model.moe.norm_topk": False}
    )
    assert build_model_config(weighted.model, 320, 32).moe.norm_topk is False


@pytest.mark.parametrize(
    ("overrides", "shape"),
    [
        ([], (12, 12, 64)),  # (n_head, n_kv_head, head_dim) of the preset
        (["model.n_head=16"], (16, 16, 48)),  # derived again: not 64 wide, not 12 KV heads
        (["model.dim=1536"], (12, 12, 128)),
        (["model.n_head=16", "model.head_dim=32", "model.n_kv_head=4"], (16, 4, 32)),  # explicit
    ],
)
def test_derived_head_shape_follows_an_overridden_shape(
    overrides: list[str], shape: tuple[int, int, int]
) -> None:
    config = load_config(None, ["model.preset=124m-dense", *overrides])
    model = build_model_config(config.model, 50304, 128)
    assert (model.n_head, model.n_kv_head, model.head_dim) == shape


@pytest.mark.parametrize(("precision", "fused"), [("fp32", True), ("bf16", True), ("fp16", False)])
def test_fused_loss_defaults_to_on_except_under_fp16(precision: str, fused: bool) -> None:
    assert build_config({"train.precision": precision}).train.fused_loss is fused
