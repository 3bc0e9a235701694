"""The config sections of a run but [parallel] (parallel.py) and those defined in their own
settings modules (orchestrator, faults, planning): one dataclass each, checked when built."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ats_train.config.choices import (
    CheckpointFormat,
    DeviceName,
    Fp8Recipe,
    LoaderMode,
    Objective,
    PrecisionName,
    ResidualStream,
    ScheduleName,
    SdpaBackendName,
    TrainableName,
    check_choices,
    require,
)


@dataclass(frozen=True)
class ModelSection:
    preset: str = "tiny-hybrid"
    # Any ats_model.ModelConfig field, e.g. {"n_layer": 4}; checked against ModelConfig on resolve.
    overrides: dict[str, Any] = field(default_factory=dict)
    # a model directory (ours, or one from `ats-model import-hf`) whose weights and tokenizer a
    # run starts from; its config is the architecture (preset and overrides are not used)
    init_from: str | None = None
    # with init_from: add the ChatML tokens the chat template needs to a tokenizer that lacks
    # them, growing the embeddings (and an untied head) by as many rows
    add_chat_tokens: bool = False


@dataclass(frozen=True)
class DataSection:
    # "stdlib" (the Python standard library's own sources), "pyenv" (stdlib + site-packages .py,
    # .md, .rst files: ats_data.pyenv), a text file, folder, glob, JSONL or Parquet file, or a
    # directory prepared by `ats-data prepare`.
    source: str = "stdlib"
    tokenizer: str | None = None  # tokenizer.json; None: train one on the source (cached)
    vocab_size: int = 2048  # for the auto-trained tokenizer
    val_fraction: float = 0.05
    # A raw source is cut to its first whole files up to this size (None = all of it); the run
    # prints what it used. The default keeps the no-argument run within minutes on a laptop.
    max_bytes: int | None = 3_000_000
    mode: LoaderMode = "random"  # TokenLoader mode: random windows or packed sequences
    workers: int = 0  # tokenization processes; 0 = all cores
    cache_dir: str = "~/.cache/ats"  # prepared shards and tokenizers, keyed by source+tokenizer

    def __post_init__(self) -> None:
        check_choices(self, "data")
        require(self.vocab_size >= 256, f"data.vocab_size = {self.vocab_size} must be >= 256")
        require(
            0.0 < self.val_fraction < 1.0,
            f"data.val_fraction = {self.val_fraction} must be in (0, 1)",
        )
        if self.max_bytes is not None:
            require(self.max_bytes > 0, f"data.max_bytes = {self.max_bytes} must be > 0")
        require(self.workers >= 0, f"data.workers = {self.workers} must be >= 0")


@dataclass(frozen=True)
class TrainSection:
    steps: int = 300
    batch_size: int = 16  # GLOBAL sequences per optimizer step, whatever the number of ranks
    micro_batch_size: int | None = None  # sequences one rank runs at once; None = batch_size
    seq_len: int = 128
    seed: int = 1337
    precision: PrecisionName = "fp32"
    # train.precision = "fp8": torchao's scaling recipe, one scale per tensor or per row (fp8.py)
    fp8_recipe: Fp8Recipe = "tensorwise"
    # the residual stream's dtype under autocast: "fp32" (the embedding's), or "autocast" (bf16 /
    # fp16, as Megatron-Core carries it by default): half the bytes of every residual add and norm
    residual_stream: ResidualStream = "fp32"
    # the LM head and the cross-entropy as one op (ats_model Transformer.fused_loss): one kernel
    # writes the logits' gradient over them in forward, so no second (tokens, vocab) buffer and
    # one kernel instead of two. None = on, except under fp16: the gradient is formed in forward,
    # before GradScaler scales the loss, where fp16 flushes values of ~1 / tokens to zero.
    fused_loss: bool | None = None
    fused_loss_rows: int = 0  # rows of logits the fused loss holds at once; 0 = the micro-batch
    # q|k|v and gate|up each as one GEMM in training (one input-gradient GEMM instead of 3 or 2
    # and a sum; ats_model Transformer.fuse_projections). None = on, except under fp8: the fused
    # GEMMs read the weights directly and would bypass the float8 Linear layers.
    fused_projections: bool | None = None
    compile: bool = False
    activation_checkpointing: bool = False
    cuda_graphs: bool = False  # forward + backward replayed from CUDA graphs (cuda_graphs.py)
    # The host reads each step's numbers (loss, statistics, grad norm) one step late, while the
    # device runs the next step, instead of waiting for the device at every step: on the H200 the
    # waits and the bookkeeping after them left the GPU idle ~40% of a small model's step
    # (BENCHMARKS.md). train_step() then returns the previous step's record (overlap.py) and the
    # orchestrator judges it then: its changes land one step later. Whatever must act on a step's
    # numbers before the next step must be off (TrainConfig._check_overlap_host).
    overlap_host: bool = False
    sdpa_backend: SdpaBackendName = "auto"  # the attention kernel (attention_backend.py)
    eval_every: int = 100  # 0 = only at the end
    # global batches of random val windows per evaluation (seeded by train.seed); 0 = the whole
    # val split, every packed window once: no sample, so no seed in the number
    eval_batches: int = 4
    # sequences one rank evaluates at once (no activations are kept, so this may exceed the
    # training micro-batch: fewer, larger forwards); None = the training micro-batch. With an MoE
    # capacity factor the capacity is per forward, so this size decides which tokens drop.
    eval_micro_batch_size: int | None = None
    log_every: int = 25
    device: DeviceName = "auto"
    # pretrain: next-token loss on the token stream; sft | dpo | grpo read TRL-format rows from
    # data.source and need model.init_from (objectives/)
    objective: Objective = "pretrain"
    # which parameters train: all; lora (adapters from [lora] on frozen weights); routers (the
    # MoE routers only). Both of the latter also write run_dir/adapter (adapters/export.py).
    trainable: TrainableName = "all"
    sample_prompt: str = "def "
    sample_tokens: int = 64

    def __post_init__(self) -> None:
        check_choices(self, "train")
        require(self.steps > 0, f"train.steps = {self.steps} must be > 0")
        require(self.batch_size > 0, f"train.batch_size = {self.batch_size} must be > 0")
        micro = self.micro_batch_size
        if micro is not None:
            require(micro > 0, f"train.micro_batch_size = {micro} must be > 0")
            require(
                self.batch_size % micro == 0,
                f"train.batch_size = {self.batch_size} is not a multiple of "
                f"train.micro_batch_size = {micro}",
            )
        require(self.seq_len > 0, f"train.seq_len = {self.seq_len} must be > 0")
        require(
            self.residual_stream == "fp32" or self.precision != "fp32",
            "train.residual_stream = 'autocast' needs train.precision bf16 or fp16 (fp32 runs "
            "without autocast)",
        )
        if self.fused_projections is None:
            object.__setattr__(self, "fused_projections", self.precision != "fp8")
        require(
            not (self.fused_projections and self.precision == "fp8"),
            "train.fused_projections = true cannot run with train.precision = 'fp8': the fused "
            "q|k|v and gate|up GEMMs read the weights directly, outside torchao's float8 Linear "
            "layers (set train.fused_projections = false)",
        )
        if self.fused_loss is None:
            object.__setattr__(
                self, "fused_loss", self.precision != "fp16"
            )  # frozen: resolved here
        require(
            not (self.fused_loss and self.precision == "fp16"),
            "train.fused_loss = true cannot run with train.precision = 'fp16': the fused loss "
            "computes its gradient in forward, before GradScaler scales the loss, and fp16 "
            "flushes gradients of ~1 / tokens to zero (set train.fused_loss = false)",
        )
        require(
            self.fused_loss_rows >= 0,
            f"train.fused_loss_rows = {self.fused_loss_rows} must be >= 0 (0 = the micro-batch)",
        )
        require(self.eval_every >= 0, f"train.eval_every = {self.eval_every} must be >= 0")
        require(
            self.eval_batches >= 0,
            f"train.eval_batches = {self.eval_batches} must be >= 0 (0 = the whole val split)",
        )
        eval_micro = self.eval_micro_batch_size
        require(
            eval_micro is None or eval_micro > 0,
            f"train.eval_micro_batch_size = {eval_micro} must be > 0 (or unset: the training "
            "micro-batch)",
        )
        require(self.log_every > 0, f"train.log_every = {self.log_every} must be > 0")
        require(self.sample_tokens >= 0, f"train.sample_tokens = {self.sample_tokens} < 0")


@dataclass(frozen=True)
class LossSection:
    # The model returns its aux losses unweighted (model_api.md); the trainer owns the weights.
    moe_lb_weight: float = 0.01  # Switch Transformer load balancing (Fedus et al. 2021)
    moe_z_weight: float = 0.001  # ST-MoE router z-loss (Zoph et al. 2022)
    mod_predictor_weight: float = 0.1  # MoD causal predictor BCE (Raposo et al. 2024)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            require(value >= 0.0, f"loss.{f.name} = {value} must be >= 0")


@dataclass(frozen=True)
class OptimSection:
    lr: float = 2e-3
    min_lr: float = 2e-4
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    grad_clip: float = 1.0  # 0 = no clipping (the norm is still measured)
    schedule: ScheduleName = "cosine"
    warmup_steps: int = 30
    decay_fraction: float = 0.2  # WSD: share of the steps spent decaying (Hu et al. 2024, MiniCPM)

    def __post_init__(self) -> None:
        check_choices(self, "optim")
        object.__setattr__(self, "betas", tuple(self.betas))  # a TOML array arrives as a list
        require(self.lr > 0.0, f"optim.lr = {self.lr} must be > 0")
        require(
            0.0 <= self.min_lr <= self.lr,
            f"optim.min_lr = {self.min_lr} must be in [0, optim.lr = {self.lr}]",
        )
        require(self.weight_decay >= 0.0, f"optim.weight_decay = {self.weight_decay} < 0")
        require(
            len(self.betas) == 2 and all(0.0 <= b < 1.0 for b in self.betas),
            f"optim.betas = {list(self.betas)} must be two values in [0, 1)",
        )
        require(self.eps > 0.0, f"optim.eps = {self.eps} must be > 0")
        require(self.grad_clip >= 0.0, f"optim.grad_clip = {self.grad_clip} must be >= 0")
        require(self.warmup_steps >= 0, f"optim.warmup_steps = {self.warmup_steps} < 0")
        require(
            0.0 < self.decay_fraction <= 1.0,
            f"optim.decay_fraction = {self.decay_fraction} must be in (0, 1]",
        )


@dataclass(frozen=True)
class CheckpointSection:
    every: int = 100  # 0 = only the final checkpoint
    keep_last: int = 3
    format: CheckpointFormat = "full"  # full | sharded: how the optimizer state is written (README)

    def __post_init__(self) -> None:
        check_choices(self, "checkpoint")
        require(self.every >= 0, f"checkpoint.every = {self.every} must be >= 0")
        require(self.keep_last >= 1, f"checkpoint.keep_last = {self.keep_last} must be >= 1")


@dataclass(frozen=True)
class ProfileSection:
    # torch.profiler over `steps` training steps on every rank, after `start` steps (compile and
    # warm-up stay out); RUN_DIR/profile/rank-R/{trace.json.gz, summary.txt} (profiling.py)
    steps: int = 0  # 0 = off
    start: int = 5

    def __post_init__(self) -> None:
        require(self.steps >= 0, f"profile.steps = {self.steps} must be >= 0 (0 = off)")
        require(self.start >= 0, f"profile.start = {self.start} must be >= 0")
