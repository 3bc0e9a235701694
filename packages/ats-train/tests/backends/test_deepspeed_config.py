"""The DeepSpeed JSON generated from TrainConfig, the user's JSON checked against train.*, and the
bad inputs refused before any rank starts (no ranks here; tests/distributed runs the engine)."""

import json
import sys
from pathlib import Path

import pytest
import torch
from ats_train.backends import build_backend
from ats_train.backends.deepspeed_config import (
    PARAM_SWAP_BUFFERS,
    build_ds_config,
    check_nvme_paths,
    check_param_swap,
    check_param_swap_ranks,
    check_partial_offload,
    fit_param_swap_buffers,
    generate,
    load_user,
    offload_device,
    offload_ratio,
)
from ats_train.config import ConfigError, DeepSpeedSettings, ParallelSection, load_config
from ats_train.precision import build_precision
from torch import nn


def _config(*overrides: str):  # noqa: ANN202
    base = ["parallel.backend=deepspeed", "train.batch_size=8", "train.micro_batch_size=2"]
    return load_config(None, [*base, *overrides])


def test_generated_config_follows_train_optim_and_parallel(tmp_path: Path) -> None:
    config = _config(
        "parallel.deepspeed.zero_stage=3",
        "parallel.deepspeed.offload_optimizer=nvme",
        "parallel.deepspeed.offload_param=cpu",
        f"parallel.deepspeed.nvme_path={tmp_path}",
        "train.precision=bf16",
        "optim.grad_clip=0.5",
    )
    ds = generate(config, world_size=2, device_type="cuda")
    # 8 global sequences = 2 ranks x 2 per micro-batch x 2 accumulation steps
    assert ds["train_batch_size"] == 8
    assert ds["train_micro_batch_size_per_gpu"] == 2
    assert ds["gradient_accumulation_steps"] == 2
    assert ds["gradient_clipping"] == 0.5
    assert ds["bf16"] == {"enabled": True}
    assert "fp16" not in ds
    assert ds["zero_optimization"] == {
        "stage": 3,
        "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path), "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True},
    }
    assert offload_device(ds, "optimizer") == "nvme"
    assert offload_device(ds, "param") == "cpu"


def test_generated_config_fp16_uses_gradscaler_constants_and_no_offload() -> None:
    ds = generate(_config("train.precision=fp16"), world_size=4, device_type="cpu")
    assert ds["gradient_accumulation_steps"] == 1  # 8 / 4 ranks = 2 = one micro-batch
    assert ds["zero_optimization"] == {"stage": 1}
    assert ds["fp16"]["enabled"] and 2 ** ds["fp16"]["initial_scale_power"] == 65536.0
    assert ds["fp16"]["loss_scale_window"] == torch.amp.GradScaler("cpu").get_growth_interval()
    assert ds["bf16"] == {"enabled": False}
    assert offload_device(ds, "optimizer") == offload_device(ds, "param") == "none"


def test_generated_config_splits_the_optimizer_and_unpins_on_request() -> None:
    """parallel.deepspeed.offload_optimizer_ratio becomes DeepSpeed's offload_optimizer.ratio
    (partial offload); parallel.deepspeed.offload_pin_memory = false turns the pinned host buffers
    off."""
    config = _config(
        "parallel.deepspeed.zero_stage=3",
        "parallel.deepspeed.offload_optimizer=cpu",
        "parallel.deepspeed.offload_optimizer_ratio=0.4",
        "parallel.deepspeed.offload_pin_memory=false",
    )
    ds = generate(config, world_size=1, device_type="cuda")
    assert ds["zero_optimization"]["offload_optimizer"] == {
        "device": "cpu",
        "pin_memory": False,
        "ratio": 0.4,
    }
    assert offload_ratio(ds) == 0.4
    whole = generate(
        _config("parallel.deepspeed.zero_stage=3", "parallel.deepspeed.offload_optimizer=cpu"),
        1,
        "cuda",
    )
    assert whole["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert offload_ratio(whole) == 1.0


def test_generated_nvme_parameter_offload_puts_every_parameter_on_disk(tmp_path: Path) -> None:
    """offload_param = nvme: no parameter kept in host RAM (max_in_cpu 0), DeepSpeed's reuse and
    NVMe prefetch off (each crashes its parameter swapper), and swap buffers that fit the largest
    partition (ceil(numel / world_size)) once the model is known."""
    config = _config(
        "parallel.deepspeed.zero_stage=3",
        "parallel.deepspeed.offload_optimizer=cpu",
        "parallel.deepspeed.offload_param=nvme",
        f"parallel.deepspeed.nvme_path={tmp_path}",
    )
    ds = generate(config, world_size=2, device_type="cuda")
    zero = ds["zero_optimization"]
    assert zero["offload_param"] == {
        "device": "nvme",
        "nvme_path": str(tmp_path),
        "pin_memory": True,
        "max_in_cpu": 0,
        "buffer_count": PARAM_SWAP_BUFFERS,
    }
    assert zero["stage3_max_reuse_distance"] == zero["stage3_prefetch_bucket_size"] == 0
    model = nn.Sequential(nn.Embedding(1001, 8), nn.Linear(8, 16))  # largest: 8,008 elements
    fit_param_swap_buffers(ds, model, world_size=2)
    assert zero["offload_param"]["buffer_size"] == 4004
    fit_param_swap_buffers(ds, model, world_size=3)
    assert zero["offload_param"]["buffer_size"] == 2670  # ceil(8008 / 3)
    cpu = generate(
        _config("parallel.deepspeed.zero_stage=3", "parallel.deepspeed.offload_param=cpu"),
        1,
        "cuda",
    )
    assert "stage3_max_reuse_distance" not in cpu["zero_optimization"]


@pytest.mark.parametrize(
    ("zero", "message"),
    [
        ({}, r"stage3_max_reuse_distance = 1000000000 with parameters on NVMe \(1,169 elements"),
        (
            {"stage3_max_reuse_distance": 0},
            r"stage3_prefetch_bucket_size = 50000000 .*set stage3_max_reuse_distance and "
            r"stage3_prefetch_bucket_size to 0",
        ),
        (
            {"stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": "auto"},
            "stage3_prefetch_bucket_size = 'auto'",
        ),
    ],
)
def test_user_json_with_parameters_on_nvme_must_turn_reuse_and_prefetch_off(
    zero: dict, message: str, tmp_path: Path
) -> None:
    model = nn.Sequential(nn.Embedding(100, 8), nn.Linear(8, 41))  # 800 + 328 + 41 = 1,169
    offload = {"device": "nvme", "nvme_path": str(tmp_path), "max_in_cpu": 1000}
    ds = {"zero_optimization": {"stage": 3, "offload_param": offload, **zero}}
    path = tmp_path / "ds.json"
    with pytest.raises(ConfigError, match=f"{path}: zero_optimization.{message}"):
        check_param_swap(ds, path, model, world_size=1)


def test_user_json_with_parameters_on_nvme_passes_when_nothing_reaches_the_disk(
    tmp_path: Path,
) -> None:
    """Reuse and prefetch on are fine when every partition fits max_in_cpu (the swapper never
    reads) or when both are off."""
    model = nn.Sequential(nn.Embedding(100, 8), nn.Linear(8, 41))  # 1,169 elements
    offload = {"device": "nvme", "nvme_path": str(tmp_path), "max_in_cpu": 1000}
    path = tmp_path / "ds.json"
    check_param_swap({"zero_optimization": {"offload_param": offload}}, path, model, world_size=2)
    off = {"stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0}
    ds = {"zero_optimization": {"offload_param": offload, **off}}
    check_param_swap(ds, path, model, world_size=1)
    cpu = {"zero_optimization": {"offload_param": {"device": "cpu"}}}
    check_param_swap(cpu, path, model, world_size=1)


def test_parameters_on_nvme_on_one_cpu_rank_are_refused(tmp_path: Path) -> None:
    """DeepSpeed's CPU accelerator computes from the swap buffers themselves there (the check's
    docstring); 2 CPU ranks and one GPU copy them out and are allowed."""
    ds = {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}
    with pytest.raises(ConfigError, match="parameter offload to NVMe on one CPU rank"):
        check_param_swap_ranks(ds, "cpu", world_size=1)
    check_param_swap_ranks(ds, "cpu", world_size=2)
    check_param_swap_ranks(ds, "cuda", world_size=1)
    ds["zero_optimization"]["offload_param"]["device"] = "cpu"
    check_param_swap_ranks(ds, "cpu", world_size=1)


def _write(tmp_path: Path, ds: dict) -> Path:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ds))
    return path


def test_user_json_is_used_and_auto_batch_keys_take_ours(tmp_path: Path) -> None:
    user = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": 2,
        "zero_optimization": {"stage": 2, "overlap_comm": True},
    }
    config = _config(f"parallel.deepspeed.config={_write(tmp_path, user)}")
    ds = build_ds_config(config, world_size=2, device_type="cpu")
    assert ds["train_batch_size"] == 8
    assert ds["gradient_accumulation_steps"] == 2
    assert ds["zero_optimization"] == {"stage": 2, "overlap_comm": True}


def test_user_json_batch_mismatch_names_key_and_both_values(tmp_path: Path) -> None:
    path = _write(tmp_path, {"train_batch_size": 16, "zero_optimization": {"stage": 1}})
    with pytest.raises(
        ConfigError, match=r"train_batch_size = 16 but .* give train_batch_size = 8"
    ):
        load_user(path, _config(), world_size=2)
    path = _write(tmp_path, {"gradient_accumulation_steps": 1, "zero_optimization": {"stage": 1}})
    with pytest.raises(ConfigError, match="gradient_accumulation_steps = 1 but .* = 2"):
        load_user(path, _config(), world_size=2)


@pytest.mark.parametrize(
    ("ds", "message"),
    [
        ({"zero_optimization": {"stage": 1}, "optimizer": {"type": "Adam"}}, "remove 'optimizer'"),
        ({"zero_optimization": {"stage": 1}, "scheduler": {}}, "remove 'scheduler'"),
        ({"zero_optimization": {"stage": 0}}, r"zero_optimization.stage = 0; .* 'ddp'"),
        ({}, "zero_optimization.stage = 0"),
        (
            {"zero_optimization": {"stage": 1}, "bf16": {"enabled": True}},
            "enables bf16 but train.precision = 'fp32'",
        ),
    ],
)
def test_user_json_that_ats_cannot_run_is_refused(ds: dict, message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=message):
        load_user(_write(tmp_path, ds), _config(), world_size=2)


def test_user_json_missing_or_malformed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_user(tmp_path / "nope.json", _config(), world_size=2)
    (tmp_path / "bad.json").write_text("{stage: 3")
    with pytest.raises(ConfigError, match="is not valid JSON"):
        load_user(tmp_path / "bad.json", _config(), world_size=2)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"zero_stage": 2, "offload_param": "cpu"},
            "parallel.deepspeed.offload_param = 'cpu' needs parallel.deepspeed.zero_stage = 3 "
            ".* not 2",
        ),
        ({"zero_stage": 4}, "parallel.deepspeed.zero_stage = 4 is not one of 1, 2, 3"),
        (
            {"offload_optimizer": "disk"},
            "parallel.deepspeed.offload_optimizer = 'disk' is not one of",
        ),
        ({"offload_optimizer": "nvme"}, "'nvme' needs parallel.deepspeed.nvme_path"),
        (
            {"zero_stage": 3, "offload_optimizer": "cpu", "offload_optimizer_ratio": 0.0},
            r"parallel.deepspeed.offload_optimizer_ratio = 0.0 must be in \(0, 1\]",
        ),
        (
            {"zero_stage": 2, "offload_optimizer": "cpu", "offload_optimizer_ratio": 0.5},
            "offload_optimizer_ratio = 0.5 needs parallel.deepspeed.offload_optimizer = 'cpu' and "
            "parallel.deepspeed.zero_stage = 3 .* not 'cpu' and 2",
        ),
        (
            {"zero_stage": 3, "offload_optimizer_ratio": 0.5},
            "offload_optimizer_ratio = 0.5 needs .* not 'none' and 3",
        ),
    ],
)
def test_deepspeed_settings_refuse_inconsistent_keys(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        DeepSpeedSettings(**fields)


@pytest.mark.parametrize(
    ("backend", "fields", "message"),
    [
        ("ddp", {"offload_optimizer": "cpu"}, "= 'cpu' needs parallel.backend = 'deepspeed', not"),
        ("fsdp2", {"config": "x.json"}, "parallel.deepspeed.config = 'x.json' needs"),
    ],
)
def test_deepspeed_settings_need_the_deepspeed_backend(
    backend: str, fields: dict, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        ParallelSection(backend, deepspeed=DeepSpeedSettings(**fields))


def test_nvme_path_missing_is_refused_before_any_rank_starts(tmp_path: Path) -> None:
    """build_backend checks the path first: no torchrun environment is needed to see the error."""
    config = _config(
        "parallel.deepspeed.offload_optimizer=nvme",
        f"parallel.deepspeed.nvme_path={tmp_path / 'no'}",
    )
    cpu = torch.device("cpu")
    with pytest.raises(
        ConfigError, match=r"parallel.deepspeed.nvme_path = '.*/no' is not a directory"
    ):
        build_backend(config.parallel, cpu, build_precision("fp32", cpu), config=config)
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is not a directory"):
        check_nvme_paths(
            DeepSpeedSettings(offload_param="nvme", zero_stage=3, nvme_path=str(tmp_path / "file"))
        )
    check_nvme_paths(DeepSpeedSettings(offload_param="nvme", zero_stage=3, nvme_path=str(tmp_path)))


@pytest.mark.skipif(sys.platform != "linux", reason="/proc is Linux's read-only directory")
def test_nvme_path_not_writable_is_refused() -> None:
    """/proc refuses new files even for root (for whom permission bits would not)."""
    settings = DeepSpeedSettings(offload_optimizer="nvme", nvme_path="/proc")
    with pytest.raises(ConfigError, match="parallel.deepspeed.nvme_path = '/proc' is not writable"):
        check_nvme_paths(settings)


def test_partial_offload_with_deepspeeds_sharded_checkpoint_is_refused(tmp_path: Path) -> None:
    """DeepSpeed's own checkpoint would leave out the GPU part's optimizer state: refused before
    any rank starts, from parallel.* and from the user's JSON alike."""
    partial = ["parallel.deepspeed.zero_stage=3", "parallel.deepspeed.offload_optimizer=cpu"]
    partial.append("parallel.deepspeed.offload_optimizer_ratio=0.5")
    config = _config(*partial, "checkpoint.format=sharded")
    cpu = torch.device("cpu")
    message = "checkpoint.format = 'sharded' with an optimizer offload ratio of 0.5"
    with pytest.raises(ConfigError, match=message):
        build_backend(config.parallel, cpu, build_precision("fp32", cpu), config=config)
    check_partial_offload(_config(*partial))  # the full format gathers both parts
    zero = {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.25}}
    user = f"parallel.deepspeed.config={_write(tmp_path, {'zero_optimization': zero})}"
    with pytest.raises(ConfigError, match="offload ratio of 0.25"):
        check_partial_offload(_config(user, "checkpoint.format=sharded"))


@pytest.mark.parametrize(
    ("zero", "found"),
    [
        ({"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}, "2 and 'cpu'"),
        (
            {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/x", "ratio": 0.5}},
            "3 and 'nvme'",
        ),
    ],
)
def test_partial_offload_in_the_user_json_needs_zero3_cpu(
    zero: dict, found: str, tmp_path: Path
) -> None:
    """Stage 1/2 would ignore the ratio silently, and NVMe swaps sub-groups by size whatever the
    split: both refused, naming the file, the keys and what they hold."""
    user = f"parallel.deepspeed.config={_write(tmp_path, {'zero_optimization': zero})}"
    with pytest.raises(ConfigError, match=rf"ds.json: .*ratio = 0.5 needs .* not {found}"):
        check_partial_offload(_config(user))


def test_partial_offload_with_parameters_on_nvme_is_refused(tmp_path: Path) -> None:
    """DeepSpeed would give the GPU's optimizer sub-groups host fp32 masters beside GPU gradients
    when their parameters are on disk: refused from parallel.* and from the user's JSON."""
    with pytest.raises(
        ConfigError, match="ratio = 0.5 with parallel.deepspeed.offload_param = 'nvme'"
    ):
        _config(
            "parallel.deepspeed.zero_stage=3",
            "parallel.deepspeed.offload_optimizer=cpu",
            "parallel.deepspeed.offload_optimizer_ratio=0.5",
            "parallel.deepspeed.offload_param=nvme",
            f"parallel.deepspeed.nvme_path={tmp_path}",
        )
    nvme = {"device": "nvme", "nvme_path": str(tmp_path)}
    zero = {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5}, "offload_param": nvme}
    user = f"parallel.deepspeed.config={_write(tmp_path, {'zero_optimization': zero})}"
    with pytest.raises(ConfigError, match=r"ds.json: .*ratio = 0.5 with offload_param.device"):
        check_partial_offload(_config(user))
    zero["offload_param"] = {"device": "cpu"}  # parameters in host RAM: the split works
    check_partial_offload(
        _config(f"parallel.deepspeed.config={_write(tmp_path, {'zero_optimization': zero})}")
    )


def test_missing_deepspeed_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # `import deepspeed` now fails
    config = _config()
    cpu = torch.device("cpu")
    with pytest.raises(ConfigError, match=r"uv sync --extra deepspeed.*ats-train\[deepspeed\]"):
        build_backend(config.parallel, cpu, build_precision("fp32", cpu), config=config)


def test_nvme_path_in_the_user_json_is_checked_too(tmp_path: Path) -> None:
    zero = {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/no/such/dir"}}
    path = _write(tmp_path, {"zero_optimization": zero})
    settings = DeepSpeedSettings(config=str(path))
    with pytest.raises(
        ConfigError, match="zero_optimization.offload_optimizer.nvme_path = '/no/such/dir' is not"
    ):
        check_nvme_paths(settings)
    zero["offload_optimizer"]["nvme_path"] = str(tmp_path)
    check_nvme_paths(DeepSpeedSettings(config=str(_write(tmp_path, {"zero_optimization": zero}))))
