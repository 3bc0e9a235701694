"""build_trainer: every component of a run from its config section, in dependency order, and the
checkpoint's state loaded; nothing in the run dir changes before every check passes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from ats_model import ModelConfig, build_model, count_params, flops_per_token
from ats_model.serialization.model_dir import read_config

from ats_train.adapters.trainable import apply_trainable
from ats_train.attention_backend import AttentionShape, choose_attention_backend
from ats_train.backends import Backend, build_backend
from ats_train.batch_geometry import BatchGeometry
from ats_train.checkpoint import checkpoint_step, latest_checkpoint
from ats_train.checkpoint_sharded import check_resumable
from ats_train.config import ConfigError, TrainConfig, to_toml
from ats_train.config.parallel import check_expert_parallel
from ats_train.cuda_graphs import GraphedLoss, check_cuda_graphs
from ats_train.data import build_data, build_loader
from ats_train.faults.inject import Faults
from ats_train.lr import build_lr_schedule
from ats_train.metrics import Metrics
from ats_train.mfu import peak_flops
from ats_train.model_config import build_model_config, check_same_model
from ats_train.objectives.build import PostSetup
from ats_train.objectives.start import build_start
from ats_train.optim import build_optimizer
from ats_train.orchestrator.orchestrator import Orchestrator
from ats_train.orchestrator.resume import with_saved_settings
from ats_train.overlap import HostOverlap
from ats_train.planning.chinchilla import run_steps
from ats_train.precision import Precision, build_precision
from ats_train.profiling import StepProfiler
from ats_train.run_handle import TrainerRunHandle
from ats_train.run_lock import RunLock
from ats_train.trainer import Trainer
from ats_train.trainer_state import read_trainer_state, seed_everything
from ats_train.training_wrappers import apply_training_wrappers


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device = 'cuda' but torch sees no CUDA device")
    return torch.device(name)


def write_resolved_config(run_dir: Path, config: TrainConfig, resume_step: int | None) -> None:
    """run_dir/config.toml; a different config left by an earlier run is kept beside it."""
    path = run_dir / "config.toml"
    text = to_toml(config)
    if path.is_file() and path.read_text() != text:
        path.rename(run_dir / f"config.before-step-{resume_step or 0:06d}.toml")
    path.write_text(text)


def size_run(config: TrainConfig, model_config: ModelConfig) -> TrainConfig:
    """`config` with train.steps from [plan] (steps_from = tokens_per_param | flops; config: as
    given)."""
    train, plan = config.train, config.plan
    steps = run_steps(
        plan.steps_from,
        train.steps,
        tokens_per_param=plan.tokens_per_param,
        flops=plan.flops,
        active_params=count_params(model_config)[1],
        flops_per_token=flops_per_token(model_config, train.seq_len),
        batch_size=train.batch_size,
        seq_len=train.seq_len,
    )
    return dataclasses.replace(config, train=dataclasses.replace(train, steps=steps))


def build_trainer(config: TrainConfig, run_dir: Path) -> Trainer:
    """Every component, in dependency order, and the checkpoint's state loaded: nothing in run_dir
    changes before every check passes (config.toml and metrics are written last). The main rank
    takes the run dir's lock first and holds it until Trainer.close()."""
    device = resolve_device(config.train.device)
    precision = build_precision(config.train.precision, device)
    backend = build_backend(config.parallel, device, precision, config=config)
    lock = RunLock.acquire(run_dir) if backend.is_main else None
    try:
        trainer, resume_from, config = _build(config, run_dir, backend, precision)
        trainer.run_lock = lock
        # every check passed: from here on the run dir changes
        resume_step = checkpoint_step(resume_from) if resume_from is not None else None
        if backend.is_main:
            write_resolved_config(run_dir, config, resume_step)
            if trainer.objective is not None:
                trainer.data.write_tokenizer()  # the init tokenizer + ChatML tokens, if added
        trainer.metrics.open()
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    if resume_from is not None:
        trainer.metrics.message(f"resumed from {resume_from} at step {trainer.step}")
    return trainer


def _build(
    config: TrainConfig, run_dir: Path, backend: Backend, precision: Precision
) -> tuple[Trainer, Path | None, TrainConfig]:
    """build_trainer's components and resume, with nothing written: (trainer, checkpoint, the
    config with the run's length resolved, as config.toml records it)."""
    train = config.train
    # sft | dpo | grpo start from model.init_from and read rows (objectives/), not shards
    start = build_start(config, run_dir) if train.objective != "pretrain" else None
    data = build_data(config.data) if start is None else start.data
    model_config: ModelConfig = (
        build_model_config(config.model, data.vocab_size, train.seq_len)
        if start is None
        else start.model_config
    )
    config = size_run(config, model_config)
    resume_from = latest_checkpoint(run_dir)
    # config.toml keeps what the user asked for; the run continues with the orchestrator's changes
    run_config = with_saved_settings(config, resume_from)
    if start is None:
        model_config = build_model_config(run_config.model, data.vocab_size, train.seq_len)
    if resume_from is not None:
        check_same_model(read_config(resume_from), model_config, resume_from)
        check_resumable(resume_from, backend)
    sized, config, train = config, run_config, run_config.train
    batch = BatchGeometry.of(train.batch_size, backend.world_size, train.micro_batch_size)
    check_cuda_graphs(config, model_config, backend.device, batch)
    check_expert_parallel(config.parallel.expert_parallel, model_config, backend.world_size)
    resume_step = checkpoint_step(resume_from) if resume_from is not None else None

    device = backend.device  # this rank's: cuda:LOCAL_RANK under torchrun
    shape = AttentionShape.of_run(
        model_config,
        batch.micro_batch,
        train.seq_len,
        precision.autocast_dtype or torch.float32,
    )
    # before seeding: the measurement draws from its own generator, but dropout from the global one
    attention = choose_attention_backend(
        train.sdpa_backend,
        shape,
        device,
        backend.all_reduce_mean_tensor,
        saved=read_trainer_state(resume_from)["attention"] if resume_from is not None else None,
        masked=train.objective != "pretrain",  # padding / document masks on every forward
    )
    seed_everything(train.seed)
    raw_model = build_model(model_config, device=device, kernels=config.kernels)
    post = None
    if start is not None:
        raw_model.load_state_dict(start.initial_state())  # a checkpoint, if any, replaces it
        post = PostSetup(config, start)  # every row read and checked
    backend.shard_experts(raw_model)  # expert parallelism: before the optimizer
    trainable = apply_trainable(raw_model, config)  # LoRA / frozen weights: before the optimizer
    model = apply_training_wrappers(raw_model, train)
    optimizer = build_optimizer(raw_model, config.optim, device)
    model, optimizer = backend.wrap(model, optimizer)  # then sharding (fsdp2), after the wrappers
    objective = None
    if post is None:
        train_loader = build_loader(config, data, "train", batch, backend.rank)
        # Built once here so a val split too small for one batch fails now, not at the first eval.
        build_loader(config, data, "val", batch, backend.rank)
    else:
        train_loader, objective = post.build(raw_model, batch, backend.rank, device)
    trainer = Trainer(
        config=config,
        run_dir=run_dir,
        model=model,
        raw_model=raw_model,
        optimizer=optimizer,
        backend=backend,
        precision=precision,
        schedule=build_lr_schedule(config.optim, train.steps),
        data=data,
        train_loader=train_loader,
        metrics=Metrics(run_dir, train.steps, resume_step or 0, train.log_every, backend.is_main),
        flops_per_token=flops_per_token(model_config, train.seq_len),
        peak_flops=peak_flops(device, train.precision),
        batch=batch,
        overlap=HostOverlap(1 if train.overlap_host else 0),
    )
    trainer.attention = attention
    trainer.objective = objective
    trainer.run = TrainerRunHandle(trainer)
    trainer.profiler = StepProfiler(
        config.profile.start,
        config.profile.steps,
        run_dir / "profile" / f"rank-{backend.rank}",
        device,
    )
    trainer.orchestrator = Orchestrator(
        config.orchestrator,
        run_dir if backend.is_main else None,
        trainer.metrics.message,
        trainer.flops_per_token,
    )
    trainer.orchestrator.attach(raw_model)
    trainer.faults = Faults(config.faults)
    trainer.faults.attach(raw_model)
    if train.cuda_graphs:
        trainer.graphed = GraphedLoss(model, lambda: trainer.forward_context(cache=False))
    trainer.metrics.message(data.note)
    if start is not None and start.message:
        trainer.metrics.message(start.message)
    trainer.metrics.message(trainable)
    trainer.metrics.message(attention.describe())
    total, active = count_params(model_config)
    trainer.metrics.message(
        f"model: {config.model.init_from or config.model.preset} ({model_config.family}), "
        f"{total:,} parameters, "
        f"{active:,} active per token; device {device}, precision {train.precision}"
    )
    if resume_from is not None:
        trainer.load(resume_from)
    return trainer, resume_from, sized
