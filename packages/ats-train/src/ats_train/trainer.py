"""The Trainer: train() -> train_step() -> forward_backward(), plus evaluation and checkpoints.

build.py makes the components and wires them (build_trainer); the Trainer only runs the loop. One
step path: forward and backward leave their numbers on the device, the update follows, and the host
records the step `overlap.depth` steps late (0: at once; 1 with train.overlap_host, overlap.py).
Resume is exact on CPU: model, optimizer, scheduler step, RNG streams, loader position, backend
state (the fp16 loss scaler) and the runtime MoE/MoD knobs all come back from the checkpoint, and
the next batch is the one the interrupted run would have drawn.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from ats_data.loader import TokenLoader, split_windows
from ats_model import generate
from torch import nn

from ats_train.adapters.export import export_adapter
from ats_train.attention_backend import AttentionBackend
from ats_train.backends import Backend
from ats_train.batch_geometry import BatchGeometry
from ats_train.checkpoint import (
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
    load_rank_rng,
    read_layout,
    save_sharded_checkpoint,
)
from ats_train.config import TrainConfig
from ats_train.cuda_graphs import GraphedLoss, LossParts
from ats_train.data import TrainData, build_loader
from ats_train.faults.inject import Faults
from ats_train.faults.settings import FaultsSection
from ats_train.lr import LRSchedule
from ats_train.metrics import Metrics, stats_record
from ats_train.mfu import mfu
from ats_train.model_state import write_model_dir
from ats_train.objectives import Objective
from ats_train.orchestrator.handle import RunHandle
from ats_train.orchestrator.orchestrator import Orchestrator
from ats_train.overlap import DeviceSums, HostOverlap, InFlight, StepOutput, unpack
from ats_train.precision import Precision
from ats_train.profiling import StepProfiler
from ats_train.run_lock import RunLock
from ats_train.trainer_state import (
    STATE_VERSION,
    read_trainer_state,
    rng_state,
    runtime_knobs,
    set_rng_state,
    set_runtime_knobs,
)


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
    batch: BatchGeometry  # global batch, per-rank batch, micro-batch, accumulation
    overlap: HostOverlap = field(default_factory=lambda: HostOverlap(0))  # train.overlap_host
    step: int = 0
    # issue 8: decides between steps (its state is saved with every checkpoint); faults: drills
    orchestrator: Orchestrator = field(default_factory=Orchestrator.disabled)
    # what the orchestrator sees and changes of this run: build_trainer sets a TrainerRunHandle
    run: RunHandle = field(init=False)
    faults: Faults = field(default_factory=lambda: Faults(FaultsSection()))
    graphed: GraphedLoss | None = None  # train.cuda_graphs: forward + backward from CUDA graphs
    attention: AttentionBackend = field(default_factory=lambda: AttentionBackend(None, {}))
    profiler: StepProfiler = field(default_factory=StepProfiler.disabled)  # profile.steps
    run_lock: RunLock | None = None  # the main rank's hold on run_dir (run_lock.py)
    # train.objective sft | dpo | grpo: the loss of each micro-batch (objectives/); None: the LM
    # loss of pretraining
    objective: Objective | None = None

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
        values = {"loss": self.evaluate()} if self.objective is None else self.evaluate_objective()
        self.metrics.val(self.step, values["loss"], values)
        self.orchestrator.observe_val(self.step, values["loss"])

    def train_step(self) -> dict[str, Any]:
        """One optimizer step. Returns the metrics record of the step that is `overlap.depth` steps
        old: this one's at depth 0, the previous one's with train.overlap_host ({} at first)."""
        lr = self.orchestrator.lr(self.schedule(self.step) * self.faults.lr_factor(self.step + 1))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        t0 = time.perf_counter()
        self.faults.before_step(self.step + 1, self.raw_model)
        x, y = self.faults.batch(self.step + 1, *next(self.train_loader))  # (B_rank, T) each
        sums = self.orchestrator.forward_backward(self.run, x, y)  # OOM recovery around it
        done = self.overlap.push(self.update(sums, lr, t0))
        if done is None:
            return {}
        return self._record(done, t0 if self.overlap.depth else None)

    def update(self, sums: DeviceSums, lr: float, t0: float) -> InFlight:
        """The optimizer update after forward_backward; the step counts from here.

        At depth 0 the host reads the step's numbers first (averaged over ranks), so faults and the
        orchestrator act on them before the update (a loss-spike guard skips it). At depth 1 the
        update is queued behind the backward and nothing waits for the device: the orchestrator
        judges the step one step later, and config refuses what would act on the numbers first
        (TrainConfig._check_overlap_host)."""
        grad_clip = self.config.optim.grad_clip
        if self.overlap.depth:
            self.orchestrator.before_update(self.run)
            norm = self.backend.queue_step(self.optimizer, grad_clip)
            measured = self.orchestrator.measure(self.run)
            self.step += 1
            return InFlight.queued(self.step, lr, t0, sums, norm, measured)
        out = self.mean_over_ranks(sums.to_host())
        self.faults.after_backward(self.step + 1, self.raw_model)
        skipped = self.orchestrator.skip_update(self.run, out)
        self.orchestrator.before_update(self.run)
        grad_norm, stepped = (
            (None, False) if skipped else self.backend.step(self.optimizer, grad_clip)
        )
        measured = self.orchestrator.measure(self.run)
        self.step += 1
        return InFlight.read(self.step, lr, t0, out, grad_norm, stepped, skipped, measured)

    def flush(self) -> dict[str, Any] | None:
        """Record every step still waiting (train.overlap_host; waits for the device); returns
        the last record, None if none waited. validate(), save() and the end of train() call it."""
        record = None
        while (done := self.overlap.pop()) is not None:
            record = self._record(done, None)
        return record

    def _record(self, done: InFlight, next_t0: float | None) -> dict[str, Any]:
        """The metrics record of a finished step, written and shown to the orchestrator."""
        out, grad_norm, stepped, measured = done.wait()
        # a step's time: from its launch to the next launch (to now at depth 0 and for the last)
        dt = (time.perf_counter() if next_t0 is None else next_t0) - done.t0
        train = self.config.train
        tokens_per_s = self.batch.global_batch * train.seq_len / dt
        record = {
            "step": done.step,
            "loss": out.loss,
            **{f"aux/{k}": v for k, v in out.aux.items()},
            "lr": done.lr,
            "grad_norm": grad_norm,
            "stepped": stepped,
            "tokens": done.step * self.batch.global_batch * train.seq_len,
            "tokens_per_s": tokens_per_s,
            "mfu": mfu(tokens_per_s, self.flops_per_token, self.peak_flops),
            **stats_record(out.stats),
        }
        if self.precision.scaler is not None:
            record["loss_scale"] = self.precision.scaler.get_scale()
        if done.skipped:
            record["skipped"] = True
        self.orchestrator.annotate(self.run, record, measured)
        self.metrics.train(record)
        self.orchestrator.after_step(self.run, record)
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
        return unpack(mean, list(out.aux), out.stats)

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> DeviceSums:
        """Backpropagate one rank's batch in micro-batches; gradients sum to the batch mean.

        Each micro-batch loss is divided by n_micro, so the accumulated gradient equals that of the
        mean loss over the whole batch (all micro-batches hold the same number of tokens). The
        loss, aux loss and statistic sums stay on the device (overlap.py reads them).
        """
        micro, n_micro = self.batch.micro_batch, self.batch.accumulation
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
        return DeviceSums(loss_sum, aux_sums, stats_sums, n_micro)

    def losses(self, x: torch.Tensor, y: torch.Tensor) -> LossParts:
        """One micro-batch's forward: (LM loss, unweighted aux losses, detached stats); with an
        objective, its loss and its metrics among the stats."""
        if self.objective is not None:
            with self.forward_context():
                return self.objective.losses(self.model, x, y, self.step)
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
        micro = train.eval_micro_batch_size or self.batch.micro_batch
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

    def evaluate_objective(self) -> dict[str, float]:
        """The objective's validation numbers (eval mode: no dropout)."""
        self.model.eval()
        try:
            return self.objective.evaluate(self)
        finally:
            self.model.train()

    def _eval_batches(self, micro: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's val windows as (x, y) CPU batches of at most `micro` rows."""
        train, backend = self.config.train, self.backend
        if train.eval_batches == 0:
            val = self.data.dataset
            yield from split_windows(
                val, "val", train.seq_len, micro, rank=backend.rank, world_size=backend.world_size
            )
            return
        loader = build_loader(self.config, self.data, "val", self.batch, backend.rank)
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
            # with train.trainable = lora | routers, run_dir/adapter too; LoRA merged into model
            state = export_adapter(self.config, self.raw_model, model_state, self.run_dir)
            write_model_dir(self.raw_model, state, path, self.data.tokenizer_path)
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
