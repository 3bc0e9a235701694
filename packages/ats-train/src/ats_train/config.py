"""TrainConfig: every training knob as a typed dataclass tree, loaded from TOML plus dotted overrides.

Architecture lives in ats_model.ModelConfig; the [model] section only names a preset and optional
overrides of that preset's fields. The resolved config is written to the run dir as config.toml, so
`ats-train --config RUN_DIR/config.toml` repeats a run.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ats_train.errors import ConfigError
from ats_train.faults.settings import FaultsSection
from ats_train.orchestrator.settings import RENAMED, OrchestratorSection
from ats_train.planning.settings import PlanSection

PRECISIONS = ("fp32", "bf16", "fp16")
RESIDUAL_STREAMS = ("fp32", "autocast")
SCHEDULES = ("cosine", "wsd")
DEVICES = ("auto", "cpu", "cuda")
SDPA_BACKENDS = ("auto", "default", "cudnn", "flash", "efficient", "math")  # attention_backend.py
LOADER_MODES = ("random", "packed")
# every backend but single runs under torchrun (deepspeed also under the `deepspeed` launcher)
BACKENDS_IMPLEMENTED = ("single", "ddp", "fsdp2", "deepspeed", "colossalai")
OFFLOAD_DEVICES = ("none", "cpu", "nvme")  # deepspeed: where ZeRO keeps optimizer/parameters
# colossalai runs only in the isolated env envs/colossalai (torch 2.5.1), on CUDA; Gemini needs
# HybridAdam's CUDA kernels and has never run here (envs/colossalai/README.md)
COLOSSALAI_PLUGINS = ("low_level_zero",)
COLOSSALAI_PLUGINS_PLANNED = ("gemini",)
KERNELS = ("auto", "reference", "triton", "cuda")
# full: rank 0 writes the gathered optimizer state (resumes anywhere); sharded: every rank writes
# its own shard (safetensors + JSON, or DeepSpeed's own ZeRO files): checkpoint_sharded.py
CHECKPOINT_FORMATS = ("full", "sharded")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    _require(value in choices, f"{key} = {value!r} is not one of {', '.join(choices)}")


@dataclass
class ModelSection:
    preset: str = "tiny-hybrid"
    # Any ats_model.ModelConfig field, e.g. {"n_layer": 4}; checked against ModelConfig on resolve.
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class DataSection:
    # "stdlib" (the Python standard library's own sources), a text file, folder, glob, JSONL or
    # Parquet file, or a directory prepared by `ats-data prepare`.
    source: str = "stdlib"
    tokenizer: str | None = None  # tokenizer.json; None: train one on the source (cached)
    vocab_size: int = 2048  # for the auto-trained tokenizer
    val_fraction: float = 0.05
    # A raw source is cut to its first whole files up to this size (None = all of it); the run
    # prints what it used. The default keeps the no-argument run within minutes on a laptop.
    max_bytes: int | None = 3_000_000
    mode: str = "random"  # TokenLoader mode: random windows or packed sequences
    workers: int = 0  # tokenization processes; 0 = all cores
    cache_dir: str = "~/.cache/ats"  # prepared shards and tokenizers, keyed by source+tokenizer

    def __post_init__(self) -> None:
        _require(self.vocab_size >= 256, f"data.vocab_size = {self.vocab_size} must be >= 256")
        _require(
            0.0 < self.val_fraction < 1.0,
            f"data.val_fraction = {self.val_fraction} must be in (0, 1)",
        )
        if self.max_bytes is not None:
            _require(self.max_bytes > 0, f"data.max_bytes = {self.max_bytes} must be > 0")
        _choice("data.mode", self.mode, LOADER_MODES)
        _require(self.workers >= 0, f"data.workers = {self.workers} must be >= 0")


@dataclass
class TrainSection:
    steps: int = 300
    batch_size: int = 16  # GLOBAL sequences per optimizer step, whatever the number of ranks
    micro_batch_size: int | None = None  # sequences one rank runs at once; None = batch_size
    seq_len: int = 128
    seed: int = 1337
    precision: str = "fp32"
    # the residual stream's dtype under autocast: "fp32" (the embedding's), or "autocast" (bf16 /
    # fp16, as Megatron-Core carries it by default): half the bytes of every residual add and norm
    residual_stream: str = "fp32"
    # the LM head and the cross-entropy as one op (ats_model Transformer.fused_loss): one kernel
    # writes the logits' gradient over them in forward, so no second (tokens, vocab) buffer and
    # one kernel instead of two. None = on, except under fp16: the gradient is formed in forward,
    # before GradScaler scales the loss, where fp16 flushes values of ~1 / tokens to zero.
    fused_loss: bool | None = None
    fused_loss_rows: int = 0  # rows of logits the fused loss holds at once; 0 = the micro-batch
    # q|k|v and gate|up each as one GEMM in training (one input-gradient GEMM instead of 3 or 2
    # and a sum; ats_model Transformer.fuse_projections)
    fused_projections: bool = True
    compile: bool = False
    activation_checkpointing: bool = False
    cuda_graphs: bool = False  # forward + backward replayed from CUDA graphs (cuda_graphs.py)
    # The host reads each step's numbers (loss, statistics, grad norm) one step late, while the
    # device runs the next step, instead of waiting for the device at every step: on the H200 the
    # waits and the bookkeeping after them left the GPU idle ~40% of a small model's step
    # (BENCHMARKS.md, session 12). train_step() then returns the previous step's record. Whatever
    # acts on a step's numbers before the next step must be off (TrainConfig._check_overlap_host).
    overlap_host: bool = False
    sdpa_backend: str = (
        "auto"  # attention kernel: auto | default | cudnn | flash | efficient | math
    )
    eval_every: int = 100  # 0 = only at the end
    # global batches of random val windows per evaluation (seeded by train.seed); 0 = the whole
    # val split, every packed window once: no sample, so no seed in the number
    eval_batches: int = 4
    # sequences one rank evaluates at once (no activations are kept, so this may exceed the
    # training micro-batch: fewer, larger forwards); None = the training micro-batch. With an MoE
    # capacity factor the capacity is per forward, so this size decides which tokens drop.
    eval_micro_batch_size: int | None = None
    log_every: int = 25
    device: str = "auto"
    sample_prompt: str = "def "
    sample_tokens: int = 64

    def __post_init__(self) -> None:
        _require(self.steps > 0, f"train.steps = {self.steps} must be > 0")
        _require(self.batch_size > 0, f"train.batch_size = {self.batch_size} must be > 0")
        micro = self.micro_batch_size
        if micro is not None:
            _require(micro > 0, f"train.micro_batch_size = {micro} must be > 0")
            _require(
                self.batch_size % micro == 0,
                f"train.batch_size = {self.batch_size} is not a multiple of "
                f"train.micro_batch_size = {micro}",
            )
        _require(self.seq_len > 0, f"train.seq_len = {self.seq_len} must be > 0")
        _choice("train.precision", self.precision, PRECISIONS)
        _choice("train.residual_stream", self.residual_stream, RESIDUAL_STREAMS)
        _require(
            self.residual_stream == "fp32" or self.precision != "fp32",
            "train.residual_stream = 'autocast' needs train.precision bf16 or fp16 (fp32 runs "
            "without autocast)",
        )
        if self.fused_loss is None:
            self.fused_loss = self.precision != "fp16"
        _require(
            not (self.fused_loss and self.precision == "fp16"),
            "train.fused_loss = true cannot run with train.precision = 'fp16': the fused loss "
            "computes its gradient in forward, before GradScaler scales the loss, and fp16 "
            "flushes gradients of ~1 / tokens to zero (set train.fused_loss = false)",
        )
        _require(
            self.fused_loss_rows >= 0,
            f"train.fused_loss_rows = {self.fused_loss_rows} must be >= 0 (0 = the micro-batch)",
        )
        _choice("train.device", self.device, DEVICES)
        _choice("train.sdpa_backend", self.sdpa_backend, SDPA_BACKENDS)
        _require(self.eval_every >= 0, f"train.eval_every = {self.eval_every} must be >= 0")
        _require(
            self.eval_batches >= 0,
            f"train.eval_batches = {self.eval_batches} must be >= 0 (0 = the whole val split)",
        )
        eval_micro = self.eval_micro_batch_size
        _require(
            eval_micro is None or eval_micro > 0,
            f"train.eval_micro_batch_size = {eval_micro} must be > 0 (or unset: the training "
            "micro-batch)",
        )
        _require(self.log_every > 0, f"train.log_every = {self.log_every} must be > 0")
        _require(self.sample_tokens >= 0, f"train.sample_tokens = {self.sample_tokens} < 0")


@dataclass
class LossSection:
    # The model returns its aux losses unweighted (model_api.md); the trainer owns the weights.
    moe_lb_weight: float = 0.01  # Switch Transformer load balancing (Fedus et al. 2021)
    moe_z_weight: float = 0.001  # ST-MoE router z-loss (Zoph et al. 2022)
    mod_predictor_weight: float = 0.1  # MoD causal predictor BCE (Raposo et al. 2024)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            _require(value >= 0.0, f"loss.{f.name} = {value} must be >= 0")


@dataclass
class OptimSection:
    lr: float = 2e-3
    min_lr: float = 2e-4
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    grad_clip: float = 1.0  # 0 = no clipping (the norm is still measured)
    schedule: str = "cosine"
    warmup_steps: int = 30
    decay_fraction: float = 0.2  # WSD: share of the steps spent decaying (Hu et al. 2024, MiniCPM)

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)
        _require(self.lr > 0.0, f"optim.lr = {self.lr} must be > 0")
        _require(
            0.0 <= self.min_lr <= self.lr,
            f"optim.min_lr = {self.min_lr} must be in [0, optim.lr = {self.lr}]",
        )
        _require(self.weight_decay >= 0.0, f"optim.weight_decay = {self.weight_decay} < 0")
        _require(
            len(self.betas) == 2 and all(0.0 <= b < 1.0 for b in self.betas),
            f"optim.betas = {list(self.betas)} must be two values in [0, 1)",
        )
        _require(self.eps > 0.0, f"optim.eps = {self.eps} must be > 0")
        _require(self.grad_clip >= 0.0, f"optim.grad_clip = {self.grad_clip} must be >= 0")
        _choice("optim.schedule", self.schedule, SCHEDULES)
        _require(self.warmup_steps >= 0, f"optim.warmup_steps = {self.warmup_steps} < 0")
        _require(
            0.0 < self.decay_fraction <= 1.0,
            f"optim.decay_fraction = {self.decay_fraction} must be in (0, 1]",
        )


@dataclass
class CheckpointSection:
    every: int = 100  # 0 = only the final checkpoint
    keep_last: int = 3
    format: str = "full"  # full | sharded: how the optimizer state is written (README)

    def __post_init__(self) -> None:
        _require(self.every >= 0, f"checkpoint.every = {self.every} must be >= 0")
        _require(self.keep_last >= 1, f"checkpoint.keep_last = {self.keep_last} must be >= 1")
        _choice("checkpoint.format", self.format, CHECKPOINT_FORMATS)


@dataclass
class ParallelSection:
    backend: str = "single"
    cpu_offload: bool = False  # fsdp2 only: parameters, gradients and optimizer state on the CPU
    # fsdp2 only: consecutive blocks per fully_shard unit (one all-gather / reduce-scatter each);
    # 0 = all blocks in one unit (then the root: embeddings, final norm, head). Fewer, larger units cost fewer
    # hooks and collectives per step; smaller ones hold fewer gathered parameters at a time.
    fsdp_unit_blocks: int = 1
    # fsdp2 only: false keeps every unit's parameters gathered from its forward to its backward
    # (no second all-gather in backward; each rank holds the whole bf16 model through the step,
    # torchtitan's reshard_after_forward "never"). The last unit and the root never reshard.
    fsdp_reshard_after_forward: bool = True
    colossalai_plugin: str = "low_level_zero"  # colossalai only: LowLevelZero (ZeRO-2)
    # deepspeed only (backends/deepspeed_config.py turns these into DeepSpeed's JSON)
    zero_stage: int = 1  # 1: optimizer state, 2: + gradients, 3: + parameters sharded
    offload_optimizer: str = "none"  # none | cpu | nvme (ZeRO-Offload / ZeRO-Infinity)
    offload_param: str = "none"  # none | cpu | nvme; zero_stage 3 only
    nvme_path: str = ""  # a writable local directory; required when an offload is "nvme"
    # ZeRO-3 with offload_optimizer = "cpu" only: the fraction of the optimizer's sub-groups
    # (fp32 masters, Adam moments, fp32 gradients) stepped on the host; the rest stays on the GPU
    # (DeepSpeed's partial offload). Below 1 it trades GPU memory for host memory and CPU time.
    offload_optimizer_ratio: float = 1.0
    # pinned host buffers for offload (cuda only): faster copies, but torch rounds every pinned
    # allocation up to a power of two (pytorch#150517), up to 2x the host memory of the buffers
    offload_pin_memory: bool = True
    deepspeed_config: str = ""  # the user's own DeepSpeed JSON, used instead of the generated one

    def __post_init__(self) -> None:
        _choice("parallel.backend", self.backend, BACKENDS_IMPLEMENTED)
        _require(
            not self.cpu_offload or self.backend == "fsdp2",
            f"parallel.cpu_offload = true needs parallel.backend = 'fsdp2', not {self.backend!r}",
        )
        _require(
            self.fsdp_unit_blocks >= 0,
            f"parallel.fsdp_unit_blocks = {self.fsdp_unit_blocks} must be >= 0 "
            "(blocks per FSDP2 unit; 0 = all blocks in one unit)",
        )
        _require(
            self.fsdp_unit_blocks == 1 or self.backend == "fsdp2",
            f"parallel.fsdp_unit_blocks = {self.fsdp_unit_blocks} needs parallel.backend = "
            f"'fsdp2', not {self.backend!r}",
        )
        _require(
            self.fsdp_reshard_after_forward or self.backend == "fsdp2",
            "parallel.fsdp_reshard_after_forward = false needs parallel.backend = 'fsdp2', not "
            f"{self.backend!r}",
        )
        if self.colossalai_plugin in COLOSSALAI_PLUGINS_PLANNED:
            raise ConfigError(
                f"parallel.colossalai_plugin = {self.colossalai_plugin!r} is not implemented yet "
                f"(implemented: {', '.join(COLOSSALAI_PLUGINS)})"
            )
        _choice("parallel.colossalai_plugin", self.colossalai_plugin, COLOSSALAI_PLUGINS)
        _require(
            self.zero_stage in (1, 2, 3),
            f"parallel.zero_stage = {self.zero_stage} is not 1, 2 or 3",
        )
        _choice("parallel.offload_optimizer", self.offload_optimizer, OFFLOAD_DEVICES)
        _choice("parallel.offload_param", self.offload_param, OFFLOAD_DEVICES)
        offloads = {"parallel.offload_optimizer": self.offload_optimizer}
        offloads["parallel.offload_param"] = self.offload_param
        for key, value in offloads.items():
            _require(
                value == "none" or self.backend == "deepspeed",
                f"{key} = {value!r} needs parallel.backend = 'deepspeed', not {self.backend!r}",
            )
            _require(
                value != "nvme" or self.nvme_path != "",
                f"{key} = 'nvme' needs parallel.nvme_path, a writable local directory",
            )
        _require(
            self.offload_param == "none" or self.zero_stage == 3,
            f"parallel.offload_param = {self.offload_param!r} needs parallel.zero_stage = 3 "
            f"(only ZeRO-3 partitions parameters), not {self.zero_stage}",
        )
        _require(
            0.0 < self.offload_optimizer_ratio <= 1.0,
            f"parallel.offload_optimizer_ratio = {self.offload_optimizer_ratio} must be in (0, 1]",
        )
        _require(
            self.offload_optimizer_ratio == 1.0
            or (self.offload_optimizer == "cpu" and self.zero_stage == 3),
            f"parallel.offload_optimizer_ratio = {self.offload_optimizer_ratio} needs "
            "parallel.offload_optimizer = 'cpu' and parallel.zero_stage = 3 (DeepSpeed splits "
            f"the optimizer only there), not {self.offload_optimizer!r} and {self.zero_stage}",
        )
        _require(
            self.offload_optimizer_ratio == 1.0 or self.offload_param != "nvme",
            f"parallel.offload_optimizer_ratio = {self.offload_optimizer_ratio} with "
            "parallel.offload_param = 'nvme': DeepSpeed gives the GPU's sub-groups host fp32 "
            "masters beside GPU gradients when their parameters are on disk; offload the whole "
            "optimizer, or keep parameters in host RAM",
        )
        _require(
            self.deepspeed_config == "" or self.backend == "deepspeed",
            f"parallel.deepspeed_config needs parallel.backend = 'deepspeed', not {self.backend!r}",
        )


@dataclass
class ProfileSection:
    # torch.profiler over `steps` training steps on every rank, after `start` steps (compile and
    # warm-up stay out); RUN_DIR/profile/rank-R/{trace.json.gz, summary.txt} (profiling.py)
    steps: int = 0  # 0 = off
    start: int = 5

    def __post_init__(self) -> None:
        _require(self.steps >= 0, f"profile.steps = {self.steps} must be >= 0 (0 = off)")
        _require(self.start >= 0, f"profile.start = {self.start} must be >= 0")


@dataclass
class TrainConfig:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    train: TrainSection = field(default_factory=TrainSection)
    loss: LossSection = field(default_factory=LossSection)
    optim: OptimSection = field(default_factory=OptimSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    parallel: ParallelSection = field(default_factory=ParallelSection)
    orchestrator: OrchestratorSection = field(default_factory=OrchestratorSection)
    faults: FaultsSection = field(default_factory=FaultsSection)
    plan: PlanSection = field(default_factory=PlanSection)
    profile: ProfileSection = field(default_factory=ProfileSection)
    kernels: str = "auto"  # ats_kernels.select(): chosen once when the model is built

    def __post_init__(self) -> None:
        _choice("kernels", self.kernels, KERNELS)
        if self.train.overlap_host:
            self._check_overlap_host()
        _require(
            self.checkpoint.format == "full" or self.parallel.backend != "colossalai",
            "checkpoint.format = 'sharded' is not implemented for parallel.backend = "
            "'colossalai'; use checkpoint.format = 'full'",
        )

    def _check_overlap_host(self) -> None:
        """train.overlap_host reads a step's numbers after the next step is queued: refuse what
        must act on them before that (skip an update, roll back, rescale, drill a fault) or reads
        them in a collective."""
        faults = [f.name for f in dataclasses.fields(self.faults) if f.name.endswith("_at_step")]
        drills = [name for name in faults if getattr(self.faults, name) is not None]
        problems = [
            (self.parallel.backend == "single", f"parallel.backend = {self.parallel.backend!r}"),
            (self.orchestrator.mode == "off", f"orchestrator.mode = {self.orchestrator.mode!r}"),
            (self.train.precision != "fp16", "train.precision = 'fp16' (its loss scaler)"),
            (not drills, f"faults.{drills[0] if drills else ''} set"),
        ]
        for ok, what in problems:
            _require(
                ok,
                f"train.overlap_host = true cannot run with {what}: needs parallel.backend = "
                "'single', orchestrator.mode = 'off', no fp16 and no faults.*, which act on a "
                "step's numbers before the next step starts",
            )


# ----------------------------------------------------------------------------------------------
# Loading: TOML file -> raw nested dict -> dotted overrides applied -> typed dataclasses.


def _model_fields() -> dict[str, Any]:
    """ModelConfig field name -> type hint; [model] overrides are checked against these."""
    from ats_model import ModelConfig

    return typing.get_type_hints(ModelConfig)


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _section_types() -> dict[str, type]:
    return {
        name: hint for name, hint in _hints(TrainConfig).items() if dataclasses.is_dataclass(hint)
    }


def _dataclass_in(hint: Any) -> type | None:
    """The dataclass inside a hint such as `MoEConfig | None`, else None."""
    if dataclasses.is_dataclass(hint):
        return hint
    for arg in typing.get_args(hint):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def valid_keys() -> list[str]:
    """Every dotted key a config accepts, ModelConfig fields (and their sub-configs') included."""
    keys = []
    for name, hint in _hints(TrainConfig).items():
        if dataclasses.is_dataclass(hint):
            for sub, sub_hint in _hints(hint).items():
                if (name, sub) == ("model", "overrides"):
                    continue
                if dataclasses.is_dataclass(sub_hint):  # e.g. orchestrator.lr_cut.enabled
                    keys.extend(f"{name}.{sub}.{leaf}" for leaf in _hints(sub_hint))
                else:
                    keys.append(f"{name}.{sub}")
        else:
            keys.append(name)
    for name, hint in _model_fields().items():
        sub = _dataclass_in(hint)
        keys.append(f"model.{name}")
        if sub is not None:
            keys.extend(f"model.{name}.{field_name}" for field_name in _hints(sub))
    return keys


# Names other trainers use for a knob (by meaning: edit distance alone sends `learning_rate` to
# `min_lr`). A key's last part is looked up here before the spelling is compared.
ALIASES = {
    "learning_rate": "lr",
    "max_lr": "lr",
    "peak_lr": "lr",
    "final_lr": "min_lr",
    "lr_min": "min_lr",
    "wd": "weight_decay",
    "adam_betas": "betas",
    "adam_eps": "eps",
    "epsilon": "eps",
    "clip_grad": "grad_clip",
    "max_grad_norm": "grad_clip",
    "gradient_clipping": "grad_clip",
    "warmup": "warmup_steps",
    "warmup_iters": "warmup_steps",
    "lr_schedule": "schedule",
    "scheduler": "schedule",
    "max_steps": "steps",
    "max_iters": "steps",
    "iters": "steps",
    "num_steps": "steps",
    "block_size": "seq_len",
    "context_length": "seq_len",
    "seq_length": "seq_len",
    "gradient_accumulation_steps": "micro_batch_size",
    "micro_batch": "micro_batch_size",
    "dtype": "precision",
    "mixed_precision": "precision",
}


def suggest_key(key: str, keys: list[str]) -> str | None:
    """The valid key `key` most likely means: an alias of its last part in the same section
    (or any section), else the closest spelling."""
    *section, last = key.split(".")
    if last in ALIASES:
        wanted = [k for k in keys if k.split(".")[-1] == ALIASES[last]]
        same_section = [k for k in wanted if k.split(".")[:-1] == section]
        if same_section or wanted:
            return (same_section or wanted)[0]
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.5)
    return close[0] if close else None


def _unknown_key(key: str) -> ConfigError:
    if key in RENAMED:  # a kind's knob from before each kind had its own names
        return ConfigError(f"config key {key!r} was renamed; use {RENAMED[key]!r}")
    close = suggest_key(key, valid_keys())
    hint = f"; did you mean {close!r}?" if close else ""
    return ConfigError(f"unknown config key {key!r}{hint}")


def _finite(key: str, value: float) -> float:
    """No float knob means anything at inf or nan (None is how a knob says "no limit")."""
    if not math.isfinite(value):
        raise ConfigError(f"{key} = {value} is not a finite number")
    return value


def _hint_for(key: str) -> Any:
    """Type hint of a dotted key, or raise with the nearest valid key."""
    parts = key.split(".")
    top = _hints(TrainConfig)
    if len(parts) == 1 and parts[0] in top and not dataclasses.is_dataclass(top[parts[0]]):
        return top[parts[0]]
    if len(parts) == 2 and parts[0] in top and dataclasses.is_dataclass(top[parts[0]]):
        section = _hints(top[parts[0]])
        if parts[1] in section and parts[1] != "overrides":
            return section[parts[1]]
    if len(parts) == 3 and parts[0] in top and dataclasses.is_dataclass(top[parts[0]]):
        # a section's sub-table, e.g. orchestrator.lr_cut
        table = _hints(top[parts[0]]).get(parts[1])
        if dataclasses.is_dataclass(table) and parts[2] in _hints(table):
            return _hints(table)[parts[2]]
    if parts[0] == "model" and len(parts) in (2, 3):
        model_fields = _model_fields()
        if parts[1] in model_fields:
            if len(parts) == 2:
                return model_fields[parts[1]]
            sub = _dataclass_in(model_fields[parts[1]])
            if sub is not None and parts[2] in _hints(sub):
                return _hints(sub)[parts[2]]
    raise _unknown_key(key)


def _parse_text(text: str) -> Any:
    """A CLI value as a TOML value (numbers, booleans, arrays, inline tables)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"cannot parse {text!r}") from e
    except RecursionError as e:
        raise ValueError(f"{text[:40]!r}... nests arrays or tables too deeply") from e


def coerce(key: str, value: Any, hint: Any) -> Any:
    """Convert a TOML value or a CLI string to the field's type; ConfigError naming key otherwise."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in args:
                return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(key, value, arg)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key} = {value!r} is not valid")
    expected = getattr(hint, "__name__", str(hint))
    try:
        if hint is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
                return value.lower() in ("true", "1")
        elif hint is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if isinstance(value, str):
                return int(value.replace("_", ""))
        elif hint is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return _finite(key, float(value))
            if isinstance(value, str):
                return _finite(key, float(value))
        elif hint is str:
            if isinstance(value, str):
                return value
        elif origin in (tuple, list):
            items = _parse_text(value) if isinstance(value, str) else value
            if isinstance(items, (list, tuple)):
                if origin is tuple and args and args[-1] is not Ellipsis:
                    if len(items) != len(args):
                        raise ConfigError(f"{key} = {value!r}: expected {len(args)} values")
                    return tuple(coerce(key, v, a) for v, a in zip(items, args, strict=True))
                item_hint = args[0] if args else Any
                return origin(coerce(key, v, item_hint) for v in items)
        elif origin is dict or hint is dict:
            table = _parse_text(value) if isinstance(value, str) else value
            if isinstance(table, dict):
                return table
        elif hint is Any:
            return _parse_text(value) if isinstance(value, str) else value
        else:
            return _parse_text(value) if isinstance(value, str) else value
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(f"{key} = {_shown(value)} is not a valid {expected}") from e
    raise ConfigError(f"{key} = {_shown(value)} is not a valid {expected}")


def _shown(value: Any, limit: int = 80) -> str:
    """A value as the error line shows it: repr, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _is_table_field(key: str) -> bool:
    """True when `key` is itself a dict-typed field (its TOML table is one value, not a section)."""
    try:
        hint = _hint_for(key)
    except ConfigError:
        return False
    return hint is dict or typing.get_origin(hint) is dict


def _flatten(raw: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train": {"steps": 3}} -> {"train.steps": 3}; a misspelt table is caught per key later."""
    flat = {}
    for name, value in raw.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict) and not _is_table_field(key):
            flat.update(_flatten(value, f"{key}."))
        else:
            flat[key] = value
    return flat


def parse_override(text: str) -> tuple[str, str]:
    """'train.steps=10' -> ('train.steps', '10')."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"override {text!r} is not of the form key=value")
    return key, value.strip()


def build_config(flat: dict[str, Any]) -> TrainConfig:
    """Typed TrainConfig from {dotted key: value}; values are coerced by each field's type."""
    sections: dict[str, dict[str, Any]] = {name: {} for name in _section_types()}
    top: dict[str, Any] = {}
    model_overrides: dict[str, Any] = {}
    for key, value in flat.items():
        hint = _hint_for(key)
        typed = coerce(key, value, hint)
        if "." not in key:
            top[key] = typed
            continue
        section, name = key.split(".", 1)
        if section == "model" and name != "preset":
            model_overrides[name] = typed
        else:
            sections[section][name] = typed
    hints = _hints(TrainConfig)
    built = {}
    for name, values in sections.items():
        # sub-table fields (orchestrator.<kind>.*) start from the section's own default table
        nested: dict[str, dict[str, Any]] = {}
        for key in [k for k in values if "." in k]:
            table, leaf = key.split(".", 1)
            nested.setdefault(table, {})[leaf] = values.pop(key)
        try:
            section = hints[name](**values)
        except ConfigError:
            raise
        except ValueError as e:  # sections defined in their own settings modules
            raise ConfigError(str(e)) from e
        for table, leaves in nested.items():
            try:
                setattr(section, table, dataclasses.replace(getattr(section, table), **leaves))
            except ValueError as e:
                raise ConfigError(f"{name}.{table}: {e}") from e
        built[name] = section
    built["model"].overrides = model_overrides
    return TrainConfig(**built, **top)


def load_config(
    path: Path | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> TrainConfig:
    """TOML file (optional) + `key=value` overrides -> validated TrainConfig."""
    flat: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if path.is_dir():
            raise ConfigError(
                f"config file {path} is a directory; pass a TOML file (a run dir's config.toml)"
            )
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            raw = tomllib.loads(path.read_bytes().decode("utf-8"))
            flat.update(_flatten(raw))
        except UnicodeDecodeError as e:
            raise ConfigError(f"config file {path} is not UTF-8 text: {e}") from e
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path} is not valid TOML: {e}") from e
        except RecursionError as e:
            raise ConfigError(f"config file {path} nests tables or arrays too deeply") from e
    for text in overrides:
        key, value = parse_override(text)
        _hint_for(key)
        flat[key] = value
    return build_config(flat)


# ----------------------------------------------------------------------------------------------
# Writing: the resolved config as TOML (None values are omitted: TOML has no null).


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = ", ".join(
            f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None
        )
        return "{" + items + "}"
    raise ConfigError(f"cannot write {value!r} ({type(value).__name__}) to TOML")


def to_dict(config: TrainConfig) -> dict[str, Any]:
    """Nested plain dict; [model] overrides are merged into the model section."""
    out = dataclasses.asdict(config)
    model = out["model"]
    model.update(model.pop("overrides"))
    return out


def to_toml(config: TrainConfig) -> str:
    raw = to_dict(config)
    lines = ["# Resolved ats-train config (ats-train --config this_file repeats the run)."]
    for name, value in raw.items():
        if not isinstance(value, dict) and value is not None:
            lines.append(f"{name} = {_toml_value(value)}")
    for name, value in raw.items():
        if isinstance(value, dict):
            lines.append(f"\n[{name}]")
            for sub, sub_value in value.items():
                if sub_value is not None:
                    lines.append(f"{sub} = {_toml_value(sub_value)}")
    return "\n".join(lines) + "\n"
