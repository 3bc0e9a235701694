"""The DeepSpeed JSON config of a run: generated from TrainConfig, or the user's own file
(parallel.deepspeed.config) checked against it, plus the NVMe-path checks made before any rank
joins the process group.

Batch keys: train.batch_size is global, so DeepSpeed's train_batch_size = train.batch_size,
train_micro_batch_size_per_gpu = the trainer's micro-batch, gradient_accumulation_steps = per-rank
batch / micro-batch (DeepSpeed asserts the product; a user file that disagrees is refused here, naming
the key and both values).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from torch import nn

from ats_train.batch_geometry import BatchGeometry
from ats_train.config import ConfigError, DeepSpeedSettings, TrainConfig

# ATS logs its own metrics; DeepSpeed's progress line every N steps would only repeat them.
NEVER_PRINT = 2**31 - 1


def batch_keys(config: TrainConfig, world_size: int) -> dict[str, int]:
    train = config.train
    batch = BatchGeometry.of(train.batch_size, world_size, train.micro_batch_size)
    return {
        "train_batch_size": batch.global_batch,
        "train_micro_batch_size_per_gpu": batch.micro_batch,
        "gradient_accumulation_steps": batch.accumulation,
    }


# NVMe parameter offload. DeepSpeed 0.19's parameter swapper reads a parameter's partition from disk
# into one of a fixed pool of pinned buffers (offload_param.buffer_count, buffer_size elements
# each) when a module needs it, and frees the buffer when the parameter is released. Two stage-3
# features hold buffers past that, and both crash the run:
# - reuse: a parameter the recorded trace shows reused within stage3_max_reuse_distance elements
#   (default 1e9) stays gathered and keeps its buffer, so from the first step that follows a
#   recorded trace the pool runs dry ("Not enough buffers 0 for swapping 3": a 1.1B model on the
#   H200, and a 4-layer model on the CPU);
# - prefetch: the NVMe prefetch (stage3_prefetch_bucket_size > 0) reads a parameter that appears
#   twice in its window into two buffers ("param 36 already assigned swap buffer id 0").
# With both off, at most 6 buffers were in use at once (dense, MoE and hybrid models; activation
# checkpointing, fused projections and the fused loss).
PARAM_SWAP_BUFFERS = 10
PARAM_SWAP_OFF = ("stage3_max_reuse_distance", "stage3_prefetch_bucket_size")
# DeepSpeed's defaults where a user's JSON leaves the key out
DEEPSPEED_DEFAULTS = {"stage3_max_reuse_distance": 10**9, "stage3_prefetch_bucket_size": 5 * 10**7}
DEEPSPEED_MAX_IN_CPU = 10**9  # offload_param.max_in_cpu: elements per rank kept in host RAM


def _offload(device: str, nvme_path: str, pin_memory: bool) -> dict[str, Any]:
    if device == "nvme":
        return {"device": "nvme", "nvme_path": nvme_path, "pin_memory": pin_memory}
    return {"device": device, "pin_memory": pin_memory}


def generate(config: TrainConfig, world_size: int, device_type: str) -> dict[str, Any]:
    """DeepSpeed's config from parallel.deepspeed.* (ZeRO stage, offload), train.* (batch,
    precision) and optim.grad_clip; the optimizer itself is ATS's (optim.*), passed to
    deepspeed.initialize."""
    settings, precision = config.parallel.deepspeed, config.train.precision
    # pinned host memory speeds up GPU<->CPU copies; moot on a CPU run
    pin = device_type == "cuda" and settings.offload_pin_memory
    zero: dict[str, Any] = {"stage": settings.zero_stage}
    if settings.offload_optimizer != "none":
        zero["offload_optimizer"] = _offload(settings.offload_optimizer, settings.nvme_path, pin)
        if settings.offload_optimizer_ratio < 1.0:
            zero["offload_optimizer"]["ratio"] = settings.offload_optimizer_ratio
    if settings.offload_param != "none":
        zero["offload_param"] = _offload(settings.offload_param, settings.nvme_path, pin)
    if settings.offload_param == "nvme":
        # every parameter on disk, as the key says (DeepSpeed keeps the first max_in_cpu = 1e9
        # elements per rank in host RAM, so a smaller model would never touch the disk);
        # buffer_size is the model's to set (fit_param_swap_buffers, once the model exists)
        zero["offload_param"].update(max_in_cpu=0, buffer_count=PARAM_SWAP_BUFFERS)
        zero.update(dict.fromkeys(PARAM_SWAP_OFF, 0))
    ds: dict[str, Any] = {
        **batch_keys(config, world_size),
        # 0 = no clipping, as optim.grad_clip; DeepSpeed still measures the norm
        "gradient_clipping": config.optim.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": precision == "bf16"},
        "steps_per_print": NEVER_PRINT,
    }
    if precision == "fp16":
        # Dynamic loss scaling with torch.amp.GradScaler's constants (the single backend's):
        # start at 2**16, halve on overflow at once (hysteresis 1), double after 2000 clean steps.
        ds["fp16"] = {
            "enabled": True,
            "loss_scale": 0,
            "initial_scale_power": 16,
            "loss_scale_window": 2000,
            "hysteresis": 1,
            "min_loss_scale": 1,
        }
    return ds


def _precision_of(ds: dict[str, Any]) -> str:
    enabled = [name for name in ("bf16", "fp16") if ds.get(name, {}).get("enabled") is True]
    if len(enabled) > 1:
        raise ConfigError("DeepSpeed config enables both bf16 and fp16")
    return enabled[0] if enabled else "fp32"


def load_user(path: Path, config: TrainConfig, world_size: int) -> dict[str, Any]:
    """The user's DeepSpeed JSON; its batch keys and precision must agree with train.* ("auto"
    takes ATS's value), and it may not define an optimizer or scheduler: ATS builds AdamW from
    optim.* (no weight decay on norms and embeddings) and sets the LR itself every step."""
    ds = _read_json(path)
    for key in ("optimizer", "scheduler"):
        if key in ds:
            raise ConfigError(
                f"{path}: remove {key!r}; ATS builds the optimizer from optim.* and sets the "
                "learning rate every step (optim.schedule)"
            )
    stage = ds.get("zero_optimization", {}).get("stage", 0)
    if stage not in (1, 2, 3):
        raise ConfigError(
            f"{path}: zero_optimization.stage = {stage!r}; parallel.backend = 'deepspeed' runs "
            "ZeRO stage 1, 2 or 3 (for plain data parallelism use parallel.backend = 'ddp')"
        )
    for key, ours in batch_keys(config, world_size).items():
        theirs = ds.get(key, "auto")
        if theirs == "auto":
            ds[key] = ours
        elif theirs != ours:
            raise ConfigError(
                f"{path}: {key} = {theirs!r} but train.batch_size = {config.train.batch_size}, "
                f"train.micro_batch_size = {config.train.micro_batch_size} on {world_size} "
                f"rank(s) give {key} = {ours}"
            )
    theirs = _precision_of(ds)
    if theirs != config.train.precision:
        raise ConfigError(
            f"{path}: enables {theirs} but train.precision = {config.train.precision!r}; "
            "set the same precision in both"
        )
    ds.setdefault("steps_per_print", NEVER_PRINT)
    return ds


def build_ds_config(config: TrainConfig, world_size: int, device_type: str) -> dict[str, Any]:
    path = config.parallel.deepspeed.config
    if path:
        return load_user(Path(path).expanduser(), config, world_size)
    return generate(config, world_size, device_type)


def offload_device(ds: dict[str, Any], what: str) -> str:
    """Where ds's ZeRO section puts `what` (optimizer or param): none, cpu or nvme."""
    section = ds.get("zero_optimization", {}).get(f"offload_{what}")
    return "none" if section is None else section.get("device", "none")


def offload_ratio(ds: dict[str, Any]) -> float:
    """The fraction of the ZeRO-3 optimizer state ds offloads (1.0 when it offloads it whole, or
    does not offload it: then the ratio is moot)."""
    section = ds.get("zero_optimization", {}).get("offload_optimizer") or {}
    return float(section.get("ratio", 1.0))


def _partition_numels(model: nn.Module, world_size: int) -> list[int]:
    """Each parameter's ZeRO-3 partition on one rank: ceil(numel / world_size) elements."""
    return [-(-p.numel() // world_size) for p in model.parameters()]


def fit_param_swap_buffers(ds: dict[str, Any], model: nn.Module, world_size: int) -> None:
    """The generated NVMe parameter offload's buffer_size: the largest partition, which every
    partition read from disk must fit (DeepSpeed's default, 1e8 elements, is smaller than a 1B
    model's embedding)."""
    ds["zero_optimization"]["offload_param"]["buffer_size"] = max(
        _partition_numels(model, world_size)
    )


def check_param_swap(ds: dict[str, Any], path: Path, model: nn.Module, world_size: int) -> None:
    """A user's JSON whose NVMe parameter offload puts parameters on disk (more elements per rank
    than offload_param.max_in_cpu) must turn off the two stage-3 features that crash DeepSpeed
    0.19's parameter swapper (PARAM_SWAP_OFF, above), as DeepSpeed's defaults and its published
    NVMe examples leave them on."""
    zero = ds.get("zero_optimization", {})
    section = zero.get("offload_param") or {}
    if section.get("device") != "nvme":
        return
    per_rank = sum(_partition_numels(model, world_size))
    max_in_cpu = section.get("max_in_cpu", DEEPSPEED_MAX_IN_CPU)
    if per_rank <= max_in_cpu:
        return  # every partition stays in host RAM: the swapper never reads
    for key in PARAM_SWAP_OFF:
        value = zero.get(key, DEEPSPEED_DEFAULTS[key])
        if value != 0:
            raise ConfigError(
                f"{path}: zero_optimization.{key} = {value!r} with parameters on NVMe "
                f"({per_rank:,} elements per rank, offload_param.max_in_cpu = {max_in_cpu:,}): "
                "DeepSpeed's parameter swapper runs out of buffers (reuse) or reads a parameter "
                f"into two buffers (prefetch); set {' and '.join(PARAM_SWAP_OFF)} to 0"
            )


def check_param_swap_ranks(ds: dict[str, Any], device_type: str, world_size: int) -> None:
    """Parameters on NVMe need a GPU or 2+ CPU ranks. On one CPU rank DeepSpeed's CPU accelerator
    hands the swap buffer itself to the forward as the gathered parameter (nothing is copied to
    a device or gathered into a new tensor), so a weight that autograd saved for the backward
    (the MoE experts' grouped GEMMs save theirs) is overwritten by the next parameter read into
    that buffer: wrong gradients, no error (the loss left the in-RAM run's at step 2)."""
    if device_type == "cpu" and world_size == 1 and offload_device(ds, "param") == "nvme":
        raise ConfigError(
            "parameter offload to NVMe on one CPU rank: DeepSpeed would compute the backward "
            "from swap buffers already reused by other parameters; run 2 or more ranks, on a "
            "GPU, or offload parameters to the cpu"
        )


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"parallel.deepspeed.config = {str(path)!r} does not exist")
    try:
        ds = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"parallel.deepspeed.config {path} is not valid JSON: {e}") from e
    if not isinstance(ds, dict):
        raise ConfigError(f"parallel.deepspeed.config {path} must hold a JSON object")
    return ds


def _check_writable_dir(key: str, value: str) -> None:
    path = Path(value).expanduser()
    if not value or not path.is_dir():
        raise ConfigError(f"{key} = {value!r} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{key} = {value!r} is not writable")
    try:  # also catches what permission bits do not tell (read-only mounts, root)
        with tempfile.NamedTemporaryFile(dir=path):
            pass
    except OSError as e:
        raise ConfigError(f"{key} = {value!r} is not writable: {e.strerror or e}") from e


def check_nvme_paths(settings: DeepSpeedSettings) -> None:
    """Every NVMe offload directory (parallel.deepspeed.nvme_path, or the user JSON's nvme_path)
    must exist and take a new file: checked before any rank joins the process group or allocates
    a model."""
    if "nvme" in (settings.offload_optimizer, settings.offload_param):
        _check_writable_dir("parallel.deepspeed.nvme_path", settings.nvme_path)
    if not settings.config:
        return
    path = Path(settings.config).expanduser()
    zero = _read_json(path).get("zero_optimization", {})
    for what in ("optimizer", "param"):
        section = zero.get(f"offload_{what}") or {}
        if section.get("device") == "nvme":
            key = f"{path}: zero_optimization.offload_{what}.nvme_path"
            _check_writable_dir(key, str(section.get("nvme_path", "")))


def check_partial_offload(config: TrainConfig) -> None:
    """A partial optimizer offload (ratio < 1, from parallel.deepspeed.* or the user's JSON) is
    DeepSpeed's ZeRO-3 CPU offload only: stage 1/2 ignore the ratio, NVMe swaps sub-groups by
    size, not by the split, and with parameters on NVMe DeepSpeed gives the GPU's sub-groups host
    fp32 masters beside GPU gradients. It keeps part of the state in a second optimizer that
    DeepSpeed's own checkpoint does not save, so only checkpoint.format = "full" (ATS's gather,
    which sees both) may go with it. DeepSpeedSettings already checks the generated config's stage
    and devices."""
    settings = config.parallel.deepspeed
    ratio = settings.offload_optimizer_ratio
    if settings.config:
        path = Path(settings.config).expanduser()
        ds = _read_json(path)
        ratio = offload_ratio(ds)
        stage = ds.get("zero_optimization", {}).get("stage", 0)
        device = offload_device(ds, "optimizer")
        if ratio < 1.0 and (stage != 3 or device != "cpu"):
            raise ConfigError(
                f"{path}: zero_optimization.offload_optimizer.ratio = {ratio} needs "
                f"zero_optimization.stage = 3 and offload_optimizer.device = 'cpu', not "
                f"{stage!r} and {device!r}"
            )
        if ratio < 1.0 and offload_device(ds, "param") == "nvme":
            raise ConfigError(
                f"{path}: zero_optimization.offload_optimizer.ratio = {ratio} with "
                "offload_param.device = 'nvme': DeepSpeed gives the GPU's sub-groups host fp32 "
                "masters beside GPU gradients when their parameters are on disk (stage3.py "
                "_create_fp32_partitions); offload the whole optimizer, or keep parameters in "
                "host RAM"
            )
    if ratio < 1.0 and config.checkpoint.format == "sharded":
        raise ConfigError(
            f"checkpoint.format = 'sharded' with an optimizer offload ratio of {ratio}: "
            "DeepSpeed's own checkpoint leaves out the state its partial offload keeps on the "
            "GPU; use checkpoint.format = 'full'"
        )
