"""The Trainer: train() -> train_step() -> forward_backward(), plus evaluation and checkpoints.

Components are made by build_* functions (build_trainer wires them); the Trainer only runs the
loop. Resume is exact on CPU: model, optimizer, scheduler step, RNG streams, loader position,
backend state (the fp16 loss scaler) and the runtime MoE/MoD knobs all come back from the
checkpoint, and the next batch is the one the interrupted run would have drawn.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ats_data.loader import TokenLoader, split_windows
from ats_model import (
    ModelConfig,
    build_model,
    count_params,
    flops_per_token,
    generate,
)
from ats_model.serialization.model_dir import read_config
from torch import nn

from ats_train.attention_backend import (
    AttentionBackend,
    AttentionShape,
    choose_attention_backend,
)
from ats_train.backends import Backend, build_backend
from ats_train.checkpoint import (
    CheckpointError,
    checkpoint_step,
    checkpoints_dir,
    latest_checkpoint,
    load_tree,
    save_checkpoint,
    save_tree,
    step_dir_name,
)
from ats_train.checkpoint_sharded import (
    TRAINER_STATE,
    check_resumable,
    load_rank_rng,
    read_layout,
    save_sharded_checkpoint,
)
from ats_train.config import ConfigError, TrainConfig, TrainSection, to_toml
from ats_train.cuda_graphs import GraphedLoss, LossParts, check_cuda_graphs
from ats_train.data import TrainData, build_data
from ats_train.faults.inject import Faults
from ats_train.faults.settings import FaultsSection
from ats_train.lr import LRSchedule, build_lr_schedule
from ats_train.metrics import Metrics, stats_record
from ats_train.mfu import mfu, peak_flops
from ats_train.model import build_model_config, check_same_model
from ats_train.model_state import write_model_dir
from ats_train.optim import build_optimizer
from ats_train.orchestrator.orchestrator import Orchestrator
from ats_train.orchestrator.resume import with_saved_settings
from ats_train.parallelize import parallelize
from ats_train.planning.chinchilla import run_steps
from ats_train.precision import Precision, build_precision
from ats_train.profiling import StepProfiler
from ats_train.run_handle import TrainerRunHandle
from ats_train.run_lock import RunLock

STATE_VERSION = 2  # 2: the run's attention backend


@dataclass
class StepOutput:
    """One optimizer step's loss (mean over micro-batches) and per-layer routing statistics."""

    loss: float
    aux: dict[str, float]
    stats: dict[str, torch.Tensor]


def _to_host(
    loss_sum: torch.Tensor,
    aux_sums: dict[str, torch.Tensor],
    stats_sums: dict[str, torch.Tensor],
    n_micro: int,
) -> StepOutput:
    """The step's device sums -> their means on the host in ONE copy (one host sync per step,
    where a float() per aux loss and a .cpu() per statistic waited on the device ~7 times)."""
    means = _pack(loss_sum, aux_sums, stats_sums, n_micro)
    return _unpack(means.cpu(), list(aux_sums), stats_sums)


def _pack(
    loss_sum: torch.Tensor,
    aux_sums: dict[str, torch.Tensor],
    stats_sums: dict[str, torch.Tensor],
    n_micro: int,
) -> torch.Tensor:
    """The step's sums -> [loss, *aux, *flattened stats] means, one float64 vector (_unpack's)."""
    parts = [loss_sum.reshape(1), *(v.reshape(1) for v in aux_sums.values())]
    parts += [v.reshape(-1) for v in stats_sums.values()]
    return torch.cat(parts) / n_micro


def _unpack(
    values: torch.Tensor, aux_names: list[str], stats_like: dict[str, torch.Tensor]
) -> StepOutput:
    """[loss, *aux, *flattened stats] (a CPU float64 vector) -> a StepOutput whose statistics take
    the names and shapes of stats_like."""
    scalars, rest = values[: 1 + len(aux_names)].tolist(), values[1 + len(aux_names) :]
    stats = {}
    for name, like in stats_like.items():
        stats[name], rest = rest[: like.numel()].reshape(like.shape), rest[like.numel() :]
    return StepOutput(
        loss=scalars[0], aux=dict(zip(aux_names, scalars[1:], strict=True)), stats=stats
    )


@dataclass
class _Queued:
    """A step whose work is queued on the device (train.overlap_host) and whose numbers
    [loss, *aux, *flattened stats, grad norm] are being copied into `values` (pinned host memory;
    read after `copied`, None on CPU where the copy is done on return)."""

    step: int
    lr: float
    t0: float
    aux_names: list[str]
    stats_like: dict[str, torch.Tensor]
    values: torch.Tensor
    copied: torch.cuda.Event | None = None


@dataclass
class Trainer:
    config: TrainConfig
    run_dir: Path
    model: nn.Module  # what runs forward (possibly compiled / wrapped by the backend)
    raw_model: nn.Module  # the plain ats_model module whose state is saved
    optimizer: torch.optim.Optimizer
    backend: Backend
    precision: Precision
    schedule: LRSchedule
    data: TrainData
    train_loader: TokenLoader
    metrics: Metrics
    flops_per_token: float
    peak_flops: float | None
    step: int = 0
    # issue 8: decides between steps (its state is saved with every checkpoint); faults: drills
    orchestrator: Orchestrator = field(default_factory=Orchestrator.disabled)
    faults: Faults = field(default_factory=lambda: Faults(FaultsSection()))
    graphed: GraphedLoss | None = None  # train.cuda_graphs: forward + backward from CUDA graphs
    attention: AttentionBackend = field(default_factory=lambda: AttentionBackend(None, {}))
    profiler: StepProfiler = field(default_factory=StepProfiler.disabled)  # profile.steps
    run_lock: RunLock | None = None  # the main rank's hold on run_dir (run_lock.py)
    _queued: _Queued | None = None  # train.overlap_host: the step recorded at the next one

    # ---- the end of a process's use: every exit path -----------------------------------------
    def close(self) -> None:
        """Close every metrics sink and release the run dir; idempotent. `with trainer:` calls
        it however the block ends."""
        try:
            self.metrics.close()
        finally:
            if self.run_lock is not None:
                self.run_lock.release()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the loop ------------------------------------------------------------------------------
    def train(self) -> None:
        while self.step < self.config.train.steps and not self.orchestrator.stop_requested:
            self.profiler.before_step(self.step)
            record = self.train_step()
            self.profiler.after_step(self.step)
            if record.get("rolled_back"):  # back at a checkpointed step
                continue
            # read every step: the orchestrator may change the cadence (a new config) or stop
            train = self.config.train
            running = self.step < train.steps and not self.orchestrator.stop_requested
            if train.eval_every and self.step % train.eval_every == 0 and running:
                self.validate()
            every = self.config.checkpoint.every
            if every and self.step % every == 0 and running:
                self.save()
        self.flush()
        final = latest_checkpoint(self.run_dir)
        if final is None or checkpoint_step(final) != self.step:
            self.validate()
            self.save()

    def validate(self) -> None:
        self.flush()  # the step's train record before its val record
        val_loss = self.evaluate()
        self.metrics.val(self.step, val_loss)
        self.orchestrator.observe_val(self.step, val_loss)

    def train_step(self) -> dict[str, Any]:
        """One optimizer step; returns its metrics record. With train.overlap_host, the step is
        queued and the record returned is the previous step's ({} at the first step)."""
        if self.config.train.overlap_host:
            return self._queue_step()
        lr = self.orchestrator.lr(self.schedule(self.step) * self.faults.lr_factor(self.step + 1))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        t0 = time.perf_counter()
        self.faults.before_step(self)
        x, y = self.faults.batch(self.step + 1, *next(self.train_loader))  # (B_rank, T) each
        run = TrainerRunHandle(self)  # what the orchestrator sees and changes of this run
        out = self.orchestrator.forward_backward(run, x, y)  # OOM recovery around forward_backward
        out = self.mean_over_ranks(out)
        self.faults.after_backward(self)
        skipped = self.orchestrator.before_update(run, out)
        if skipped:
            grad_norm, stepped = None, False
        else:
            grad_norm, stepped = self.backend.step(self.optimizer, self.config.optim.grad_clip)
        self.step += 1
        record = self._record(self.step, out, lr, grad_norm, stepped, time.perf_counter() - t0)
        if self.precision.scaler is not None:
            record["loss_scale"] = self.precision.scaler.get_scale()
        if skipped:
            record["skipped"] = True
        self.orchestrator.annotate(run, record)
        self.metrics.train(record)
        self.orchestrator.after_step(run, record)
        return record

    def _record(
        self,
        step: int,
        out: StepOutput,
        lr: float,
        grad_norm: float | None,
        stepped: bool,
        dt: float,
    ) -> dict[str, Any]:
        train = self.config.train
        tokens_per_s = train.batch_size * train.seq_len / dt
        return {
            "step": step,
            "loss": out.loss,
            **{f"aux/{k}": v for k, v in out.aux.items()},
            "lr": lr,
            "grad_norm": grad_norm,
            "stepped": stepped,
            "tokens": step * train.batch_size * train.seq_len,
            "tokens_per_s": tokens_per_s,
            "mfu": mfu(tokens_per_s, self.flops_per_token, self.peak_flops),
            **stats_record(out.stats),
        }

    def _queue_step(self) -> dict[str, Any]:
        """train.overlap_host: queue this step's forward, backward and update, start the copy of
        its numbers to the host, then record the previous step (whose copy is done: the device
        runs in order) while the device works on this one. Config refuses what would act on a
        step's numbers first (TrainConfig._check_overlap_host)."""
        lr = self.schedule(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        t0 = time.perf_counter()
        x, y = next(self.train_loader)  # (B, T) each
        loss_sum, aux_sums, stats_sums, n_micro = self._device_sums(x, y)
        norm = self.backend.queue_step(self.optimizer, self.config.optim.grad_clip)
        means = _pack(loss_sum, aux_sums, stats_sums, n_micro)
        values = torch.cat([means, norm.double().reshape(1)])
        self.step += 1
        queued = _Queued(
            self.step, lr, t0, list(aux_sums), stats_sums, values.to("cpu", non_blocking=True)
        )
        if values.is_cuda:
            queued.copied = torch.cuda.Event()
            queued.copied.record()
        previous, self._queued = self._queued, queued
        return {} if previous is None else self._record_queued(previous, t0)

    def flush(self) -> dict[str, Any] | None:
        """train.overlap_host: record the last queued step now (waits for it); None if none is
        waiting. validate(), save() and the end of train() call it."""
        queued, self._queued = self._queued, None
        return None if queued is None else self._record_queued(queued, None)

    def _record_queued(self, queued: _Queued, next_t0: float | None) -> dict[str, Any]:
        if queued.copied is not None:
            queued.copied.synchronize()
        grad_norm = float(queued.values[-1])
        out = _unpack(queued.values[:-1], queued.aux_names, queued.stats_like)
        # a step's time: from its launch to the next launch (to now for the last one)
        dt = (time.perf_counter() if next_t0 is None else next_t0) - queued.t0
        stepped = math.isfinite(grad_norm)  # a fused optimizer skipped it on the device if not
        record = self._record(queued.step, out, queued.lr, grad_norm, stepped, dt)
        self.metrics.train(record)
        return record

    def mean_over_ranks(self, out: StepOutput) -> StepOutput:
        """Loss, aux losses and MoE/MoD statistics averaged over ranks (each saw its own tokens),
        in one collective: every rank records, and its orchestrator decides on, the same numbers,
        so a decision such as skipping an update is taken by all ranks or by none."""
        if self.backend.world_size == 1:
            return out
        parts = [torch.tensor([out.loss, *out.aux.values()], dtype=torch.float64)]
        parts += [v.to(torch.float64).reshape(-1) for v in out.stats.values()]
        mean = self.backend.all_reduce_mean_tensor(torch.cat(parts))
        return _unpack(mean, list(out.aux), out.stats)

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> StepOutput:
        """Backpropagate one rank's batch in micro-batches; gradients sum to the batch mean.

        Each micro-batch loss is divided by n_micro, so the accumulated gradient equals that of the
        mean loss over the whole batch (all micro-batches hold the same number of tokens).
        """
        return _to_host(*self._device_sums(x, y))

    def _device_sums(
        self, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor], int]:
        """forward_backward's work: (LM loss sum, aux loss sums, statistic sums) on the device,
        and the number of micro-batches they sum over."""
        micro = self.micro_batch_size
        n_micro = x.shape[0] // micro
        weights = self.aux_weights()
        # Detached running sums stay on the device: one host sync per step, not per micro-batch.
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.backend.device)
        aux_sums: dict[str, torch.Tensor] = {}
        stats_sums: dict[str, torch.Tensor] = {}
        for i, (xm, ym) in enumerate(zip(x.split(micro), y.split(micro), strict=True)):
            xm = xm.to(self.backend.device, non_blocking=True)  # (micro, T)
            ym = ym.to(self.backend.device, non_blocking=True)  # (micro, T)
            lm_loss, aux, stats = self.losses(xm, ym)
            loss = lm_loss
            for name, value in aux.items():
                if name not in weights:
                    raise KeyError(f"model returned aux loss {name!r}; TrainConfig has no weight")
                loss = loss + weights[name] * value
            self.backend.backward(loss / n_micro, last_micro_batch=i == n_micro - 1)
            loss_sum += lm_loss.detach()
            for name, value in aux.items():
                aux_sums[name] = aux_sums.get(name, 0.0) + value.detach().double()
            for name, value in stats.items():
                stats_sums[name] = stats_sums.get(name, 0.0) + value.detach().double()
        return loss_sum, aux_sums, stats_sums, n_micro

    def losses(self, x: torch.Tensor, y: torch.Tensor) -> LossParts:
        """One micro-batch's forward: (LM loss, unweighted aux losses, detached stats)."""
        if self.graphed is not None:
            return self.graphed(x, y)
        with self.forward_context():
            output = self.model(x, targets=y)
        return output.loss, output.aux, output.stats

    @contextlib.contextmanager
    def forward_context(self, cache: bool = True) -> Iterator[None]:
        """Around every training and evaluation forward: autocast and the SDPA backend order."""
        with self.precision.autocast(cache=cache), self.attention.context():
            yield

    @property
    def micro_batch_size(self) -> int:
        return micro_batch_size(self.config.train, self.backend.world_size)

    def aux_weights(self) -> dict[str, float]:
        loss = self.config.loss
        return {
            "moe_lb": loss.moe_lb_weight,
            "moe_z": loss.moe_z_weight,
            "mod_predictor": loss.mod_predictor_weight,
        }

    @torch.no_grad()
    def evaluate(self) -> float:
        """Token-weighted mean validation loss over the first train.eval_batches GLOBAL batches
        (train.batch_size windows each) of a fresh val loader, whatever the world size; with
        train.eval_batches = 0, over every packed window of the val split once (split_windows).

        The loader's global batch is split over ranks (each takes its slice, run in micro-batches),
        and sum(loss * tokens) / sum(tokens) is reduced over ranks, so 1 and N ranks see the same
        windows and give the same loss (up to float summation order; MoE capacity, which is per
        forward, must see equal forwards: set train.eval_micro_batch_size or run dropless).
        This rank's windows of all eval_batches run in forwards of train.eval_micro_batch_size.
        """
        train = self.config.train
        micro = train.eval_micro_batch_size or self.micro_batch_size
        self.model.eval()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.backend.device)
        tokens = 0
        for xm, ym in self._eval_batches(micro):
            n = int((ym != -100).sum())  # the loss is a mean over targets != -100 (host count)
            with self.forward_context():
                output = self.model(xm.to(self.backend.device), targets=ym.to(self.backend.device))
            loss_sum += output.loss.double() * n
            tokens += n
        self.model.train()
        # mean over ranks of both sums: their ratio is the ratio of the global sums
        return self.backend.all_reduce_mean(float(loss_sum)) / self.backend.all_reduce_mean(tokens)

    def _eval_batches(self, micro: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's val windows as (x, y) CPU batches of at most `micro` rows."""
        train, backend = self.config.train, self.backend
        if train.eval_batches == 0:
            val = self.data.dataset
            yield from split_windows(
                val, "val", train.seq_len, micro, rank=backend.rank, world_size=backend.world_size
            )
            return
        per_rank = train.batch_size // backend.world_size
        loader = build_loader(self.config, self.data, "val", per_rank, backend)
        batches = [next(loader) for _ in range(train.eval_batches)]  # (per_rank, T) pairs
        x = torch.cat([b[0] for b in batches])  # (eval_batches * per_rank, T)
        y = torch.cat([b[1] for b in batches])
        yield from zip(x.split(micro), y.split(micro), strict=True)

    # ---- checkpoints ---------------------------------------------------------------------------
    def save(self) -> Path:
        self.flush()  # metrics.jsonl holds every step up to the checkpoint's
        # Every rank gathers the model (for fsdp2 a collective); the main rank writes it and the
        # state. "full": the optimizer state is gathered too; "sharded": each rank writes its own.
        model_state = self.backend.model_state(self.raw_model)
        sharded = self.config.checkpoint.format == "sharded"
        optimizer_state = None if sharded else self.backend.optimizer_state(self.optimizer)

        def write(directory: Path) -> None:
            write_model_dir(self.raw_model, model_state, directory, self.data.tokenizer_path)
            state_dir = directory / TRAINER_STATE
            state_dir.mkdir(exist_ok=True)  # sharded: the ranks' shards are already in it
            if optimizer_state is not None:
                save_tree(state_dir, "optimizer", optimizer_state)
            save_tree(state_dir, "state", self.trainer_state())

        keep_last = self.config.checkpoint.keep_last
        path = checkpoints_dir(self.run_dir) / step_dir_name(self.step)
        if sharded:
            args = (self.backend, self.optimizer, write, rng_state(), keep_last)
            path = save_sharded_checkpoint(self.run_dir, self.step, *args)
        elif self.backend.is_main:
            path = save_checkpoint(self.run_dir, self.step, write, keep_last)
        if self.backend.is_main:
            self.metrics.message(f"saved checkpoint {path}")
        self.backend.barrier()
        return path

    def trainer_state(self) -> dict[str, Any]:
        return {
            "format_version": STATE_VERSION,
            "step": self.step,
            "scheduler": {"name": self.schedule.name, "step": self.step},
            "loader": self.train_loader.state_dict(),
            "backend": self.backend.state(),
            "rng": rng_state(),
            "knobs": runtime_knobs(self.raw_model),
            "orchestrator": self.orchestrator.state_dict(),
            "attention": self.attention.name,
        }

    def load(self, directory: Path) -> None:
        """Restore everything a checkpoint holds; the model shape was checked before building."""
        self.backend.load_model(self.raw_model, directory)
        state_dir = directory / TRAINER_STATE
        layout = read_layout(directory)  # the format the checkpoint holds, not the configured one
        if layout is None:
            self.backend.load_optimizer_state(self.optimizer, load_tree(state_dir, "optimizer"))
        else:
            self.backend.load_optimizer_shards(self.optimizer, state_dir)
        state = read_trainer_state(directory)
        self.step = state["step"]
        self.train_loader.load_state_dict(state["loader"])
        self.backend.load_state(state["backend"])
        set_runtime_knobs(self.raw_model, state["knobs"])
        if layout is None:
            set_rng_state(state["rng"])  # rank 0's streams, on every rank
        else:
            backend = self.backend
            set_rng_state(load_rank_rng(directory, layout, backend.rank, backend.world_size))
        self.orchestrator.load_state_dict(state["orchestrator"])

    # ---- the end of a run ----------------------------------------------------------------------
    def export(self) -> Path:
        """The final model directory, run_dir/model (what ats-infer and HF export read)."""
        model_state = self.backend.model_state(self.raw_model)
        path = self.run_dir / "model"
        if self.backend.is_main:
            write_model_dir(self.raw_model, model_state, path, self.data.tokenizer_path)
        self.backend.barrier()
        return path

    @torch.no_grad()
    def sample(self) -> str:
        train = self.config.train
        tokenizer = self.data.tokenizer
        ids = tokenizer.encode_ordinary(train.sample_prompt) or [tokenizer.eos_id]
        idx = torch.tensor([ids], dtype=torch.long, device=self.backend.device)  # (1, T0)
        self.raw_model.eval()
        out = generate(
            self.raw_model,
            idx,
            train.sample_tokens,
            temperature=0.8,
            top_k=40,
            seed=train.seed,
            stop_tokens=(tokenizer.eos_id,),
        )
        self.raw_model.train()
        return tokenizer.decode(out[0].tolist())


# ------------------------------------------------------------------------------------------------
# State that is not a module's: RNG streams and the runtime knobs of MoE / MoD layers.


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


_MOE_KNOBS = ("capacity_factor", "temperature", "top_k", "bias_update_rate")
_MOD_KNOBS = ("capacity",)


def runtime_knobs(model: nn.Module) -> dict[str, list[dict[str, Any]]]:
    """The plain attributes an orchestrator may change between steps (model_api.md)."""
    return {
        "moe": [{k: getattr(layer, k) for k in _MOE_KNOBS} for layer in model.moe_layers()],
        "mod": [{k: getattr(layer, k) for k in _MOD_KNOBS} for layer in model.mod_layers()],
    }


def set_runtime_knobs(model: nn.Module, knobs: dict[str, list[dict[str, Any]]]) -> None:
    for kind, layers in (("moe", model.moe_layers()), ("mod", model.mod_layers())):
        if len(knobs[kind]) != len(layers):
            raise CheckpointError(
                f"checkpoint has knobs for {len(knobs[kind])} {kind} layers, model has {len(layers)}"
            )
        for layer, values in zip(layers, knobs[kind], strict=True):
            for name, value in values.items():
                setattr(layer, name, value)


# ------------------------------------------------------------------------------------------------
# build_*: each component from its config section.


def micro_batch_size(train: TrainSection, world_size: int) -> int:
    """Sequences one rank runs at once; defaults to the whole per-rank batch (no accumulation)."""
    per_rank = train.batch_size // world_size
    micro = per_rank if train.micro_batch_size is None else train.micro_batch_size
    if per_rank % micro:
        raise ConfigError(
            f"train.batch_size = {train.batch_size} over {world_size} rank(s) gives {per_rank} "
            f"sequences per rank, not a multiple of train.micro_batch_size = {micro}"
        )
    return micro


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device = 'cuda' but torch sees no CUDA device")
    return torch.device(name)


def build_loader(
    config: TrainConfig, data: TrainData, split: str, batch_size: int, backend: Backend
) -> TokenLoader:
    return TokenLoader(
        data.dataset,
        split,
        batch_size,
        config.train.seq_len,
        seed=config.train.seed,
        rank=backend.rank,
        world_size=backend.world_size,
        mode=config.data.mode,
    )


def write_resolved_config(run_dir: Path, config: TrainConfig, resume_step: int | None) -> None:
    """run_dir/config.toml; a different config left by an earlier run is kept beside it."""
    path = run_dir / "config.toml"
    text = to_toml(config)
    if path.is_file() and path.read_text() != text:
        path.rename(run_dir / f"config.before-step-{resume_step or 0:06d}.toml")
    path.write_text(text)


def read_trainer_state(checkpoint: Path) -> dict[str, Any]:
    """A checkpoint's trainer state (step, loader, RNG, ...), in the format this ats-train writes."""
    state_dir = checkpoint / TRAINER_STATE
    state = load_tree(state_dir, "state")
    if state["format_version"] != STATE_VERSION:
        raise CheckpointError(
            f"{state_dir}: trainer state format_version {state['format_version']!r}, "
            f"this ats-train reads {STATE_VERSION}"
        )
    return state


def size_run(config: TrainConfig, model_config: ModelConfig) -> None:
    """train.steps from [plan] (steps_from = tokens_per_param | flops); config: unchanged."""
    train, plan = config.train, config.plan
    train.steps = run_steps(
        plan.steps_from,
        train.steps,
        tokens_per_param=plan.tokens_per_param,
        flops=plan.flops,
        active_params=count_params(model_config)[1],
        flops_per_token=flops_per_token(model_config, train.seq_len),
        batch_size=train.batch_size,
        seq_len=train.seq_len,
    )


def build_trainer(config: TrainConfig, run_dir: Path) -> Trainer:
    """Every component, in dependency order, and the checkpoint's state loaded: nothing in run_dir
    changes before every check passes (config.toml and metrics are written last). The main rank
    takes the run dir's lock first and holds it until Trainer.close()."""
    device = resolve_device(config.train.device)
    precision = build_precision(config.train.precision, device)
    backend = build_backend(config.parallel, device, precision, config=config)
    lock = RunLock.acquire(run_dir) if backend.is_main else None
    try:
        trainer, resume_from = _build(config, run_dir, backend, precision)
        trainer.run_lock = lock
        # every check passed: from here on the run dir changes
        resume_step = checkpoint_step(resume_from) if resume_from is not None else None
        if backend.is_main:
            write_resolved_config(run_dir, config, resume_step)
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
) -> tuple[Trainer, Path | None]:
    """build_trainer's components and resume, with nothing written: (trainer, checkpoint)."""
    train = config.train
    if train.batch_size % backend.world_size:
        raise ConfigError(
            f"train.batch_size = {train.batch_size} is not divisible by the world size "
            f"{backend.world_size}"
        )
    data = build_data(config.data)
    size_run(config, build_model_config(config.model, data.vocab_size, train.seq_len))
    resume_from = latest_checkpoint(run_dir)
    # config.toml keeps what the user asked for; the run continues with the orchestrator's changes
    run_config = with_saved_settings(config, resume_from)
    model_config: ModelConfig = build_model_config(run_config.model, data.vocab_size, train.seq_len)
    if resume_from is not None:
        check_same_model(read_config(resume_from), model_config, resume_from)
        check_resumable(resume_from, backend)
    check_cuda_graphs(run_config, model_config, backend.device, backend.world_size)
    resume_step = checkpoint_step(resume_from) if resume_from is not None else None
    config, train = run_config, run_config.train

    device = backend.device  # this rank's: cuda:LOCAL_RANK under torchrun
    shape = AttentionShape.of_run(
        model_config,
        micro_batch_size(train, backend.world_size),
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
    )
    seed_everything(train.seed)
    raw_model = build_model(model_config, device=device, kernels=config.kernels)
    model = parallelize(raw_model, train)
    optimizer = build_optimizer(raw_model, config.optim, device)
    model, optimizer = backend.wrap(model, optimizer)  # then sharding (fsdp2), after parallelize
    per_rank = train.batch_size // backend.world_size
    train_loader = build_loader(config, data, "train", per_rank, backend)
    # Built once here so a val split too small for one batch fails now, not at the first eval.
    build_loader(config, data, "val", per_rank, backend)
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
    )
    trainer.attention = attention
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
    trainer.metrics.message(attention.describe())
    total, active = count_params(model_config)
    trainer.metrics.message(
        f"model: {config.model.preset} ({model_config.family}), {total:,} parameters, "
        f"{active:,} active per token; device {device}, precision {train.precision}"
    )
    if resume_from is not None:
        trainer.load(resume_from)
    return trainer, resume_from
