"""The Orchestrator: reads each step's metrics record, computes signals every `every` steps, asks
each enabled kind whether its trigger holds, and in mode `act` (the default) applies the action
(in `advise` it logs it and applies only the recovery kinds; in `off` it is not consulted and the
run is exactly the plain trainer's).

Hooks the training loop calls with its RunHandle (handle.py), in step order:
    lr(base)                  lr to use: schedule x lr_scale
    forward_backward(...)     the trainer's forward_backward with OOM recovery around it
    skip_update(out)          True = skip this update (loss-spike guard; not with overlap_host)
    before_update()           weights copied for the update ratio (every-N steps, on the device)
    measure()                 after the update: weight norms (every-N steps) and MoD predictor
                              stats as a device vector, read later; None on other steps
    annotate(record, m)       adds memory_gb, and param_norm, update_ratio (every-N steps), MoD
                              predictor stats
    after_step(record)        NaN/inf rollback guard; every-N evaluation of the other kinds
    observe_val(step, loss)   val losses for the divergence signal
With train.overlap_host a step's record reaches annotate / after_step while the device runs the
next step (deferred by one step): nothing here waits for the device, and a change lands one step
later than without it.
Its whole state (history, window, cooldowns, lr_scale, changed settings) is in the checkpoint.
"""

from __future__ import annotations

import math
import resource
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from ats_train.orchestrator.base import (
    AFTER_EVALUATIONS,
    AFTER_WARMUP,
    ANY_TIME,
    Evidence,
    Intervention,
)
from ats_train.orchestrator.decisions import DecisionLog
from ats_train.orchestrator.kinds import KINDS
from ats_train.orchestrator.settings import OrchestratorSection

if TYPE_CHECKING:
    from collections.abc import Callable

    from ats_train.orchestrator.handle import RunHandle, StepLoss, StepSums


def _local(param: torch.Tensor) -> torch.Tensor:
    """This rank's values: an FSDP2 parameter's shard, any other parameter itself."""
    return param.detach().to_local() if isinstance(param, DTensor) else param.detach()


def _expert_shards(model: nn.Module) -> tuple[set[int], int]:
    """Expert parallelism: the ids of the sharded expert weights and how many ranks split each
    (parallel.expert_parallel); (empty, 1) without. measure() counts a shard that many times, so
    annotate's mean over the ranks counts every expert once and every replicated weight once."""
    sharded = [layer for layer in model.moe_layers() if layer.experts.exchange is not None]
    if not sharded:
        return set(), 1
    experts = sharded[0].experts
    ids = {id(getattr(layer.experts, w)) for layer in sharded for w in ("w1", "w3", "w2")}
    return ids, sharded[0].n_experts // experts.w1.shape[0]


class _Layout:
    """What measure() and annotate() need to know of the model's parameters each step, found once
    per set of parameters: walking the modules for it (the expert shards, whether FSDP2 holds
    DTensors) cost about 1.5 ms of host time per step on a 12-layer model, more than a short
    GPU step leaves the host. It keeps the parameters themselves, so a model whose parameters were
    replaced (expert surgery, a rebuilt model) is told apart by identity, never by a reused id."""

    def __init__(self, model: nn.Module, params: list[nn.Parameter], world_size: int) -> None:
        self.params = params
        self.shards, n_ranks = _expert_shards(model)
        self.fsdp2 = any(isinstance(p, DTensor) for p in params)
        # FSDP2: annotate sums over the ranks, and world / n_ranks of them hold each shard
        self.n_ranks = n_ranks / world_size if self.fsdp2 else n_ranks
        # matrices only: what weight decay acts on (norm gains at 1.0 would dominate a tiny model)
        self.weights = [p for p in params if p.ndim >= 2]
        self._selector: torch.Tensor | None = None

    def selector(self, device: torch.device) -> torch.Tensor:
        """(3, norms), made once: measure()'s three sums of squares are selector @ (squared norms
        of the weight matrices, of every parameter's update, of every parameter before it), an
        expert shard's counted n_ranks times (annotate's mean over the ranks then counts every
        expert once)."""
        if self._selector is None:
            groups = [self.weights, self.params, self.params]
            selector = torch.zeros(3, sum(map(len, groups)), dtype=torch.float64)
            column = 0
            for row, group in enumerate(groups):
                for p in group:
                    selector[row, column] = self.n_ranks if id(p) in self.shards else 1.0
                    column += 1
            self._selector = selector.to(device)
        return self._selector

    def holds(self, params: list[nn.Parameter]) -> bool:
        return len(params) == len(self.params) and all(
            a is b for a, b in zip(params, self.params, strict=True)
        )


class Orchestrator:
    def __init__(
        self,
        settings: OrchestratorSection,
        run_dir: Path | None = None,
        show: Callable[[str], None] | None = None,
        flops_per_token: float = 0.0,
    ) -> None:
        self.config = settings
        self.kinds: dict[str, Intervention] = {
            name: KINDS[name](kind) for name, kind in settings.kinds().items() if kind.enabled
        }
        self.log = DecisionLog(run_dir, show, settings.advice_every)
        self.flops_per_token = flops_per_token
        self.history: list[dict[str, Any]] = []
        self.window: list[dict[str, Any]] = []
        self.val: list[dict[str, Any]] = []
        self.last_fired: dict[str, int] = {}
        self.lr_scale = 1.0
        self.settings: dict[str, Any] = {}  # dotted config key -> value it was changed to
        self.stop_requested = False
        self.eval_means: list[float] = []  # window-mean train loss at each evaluation
        # run.step when the last change by an every-N kind was applied (None: none yet)
        self.last_change: int | None = None
        self._snapshot: list[torch.Tensor] | None = None
        self._weighed: set[int] = set()  # steps whose measure() holds weight norms
        # per MoD layer, each micro-batch's share its causal predictor keeps (device scalars)
        self._predictor_kept: dict[int, list[torch.Tensor]] = {}
        self._layout: _Layout | None = None

    @classmethod
    def disabled(cls) -> Orchestrator:
        return cls(OrchestratorSection(mode="off"))

    @property
    def active(self) -> bool:
        return self.config.mode != "off"

    def attach(self, model: torch.nn.Module) -> None:
        """Measure what the causal MoD predictors would keep (the share inference routes)."""
        if not self.active:
            return
        for i, layer in enumerate(model.mod_layers()):
            if layer.routing == "learned":
                layer.mod_predictor.register_forward_hook(self._predictor_hook(i))

    def _predictor_hook(self, i: int) -> Callable[..., None]:
        def hook(module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> None:
            if module.training:
                kept = (output.detach() > 0).float().mean()  # stays on the device
                self._predictor_kept.setdefault(i, []).append(kept)

        return hook

    # ---- hooks ---------------------------------------------------------------------------------
    def lr(self, base: float) -> float:
        return base * self.lr_scale

    def forward_backward(self, run: RunHandle, x: torch.Tensor, y: torch.Tensor) -> StepSums:
        while True:
            try:
                return run.forward_backward(x, y)
            except torch.OutOfMemoryError:
                if not self._recover_oom(run):
                    raise
            # out of the except block: the failed step's frames and activations are released
            run.release_failed_step()
            self._predictor_kept.clear()

    def _recover_oom(self, run: RunHandle) -> bool:
        kind = self.kinds.get("oom")
        if not self.active or kind is None:
            return False
        record = {"step": run.step + 1, "loss": None, "grad_norm": None}
        return self._decide(kind, run, self._evidence([*self.window, record]))

    def before_update(self, run: RunHandle) -> None:
        """Between backward and the optimizer step (queued or not): on the steps the every-N kinds
        judge, a copy of the weights for the update ratio (a device copy, no host wait)."""
        if self.active and (run.step + 1) % self.config.every == 0:
            local = [_local(p) for p in run.model.parameters()]
            self._snapshot = [torch.empty_like(t) for t in local]
            torch._foreach_copy_(self._snapshot, local)  # one launch, not one copy per tensor

    def skip_update(self, run: RunHandle, out: StepLoss) -> bool:
        """The loss-spike guard, on a loss the host has read before the update: True = skip it."""
        kind = self.kinds.get("skip_batch")
        if not self.active or kind is None or not math.isfinite(out.loss):
            return False
        recent = self._since(kind.name)[-self.config.window :]
        if len(recent) < self.config.min_records:
            return False
        record = {"step": run.step + 1, "loss": out.loss, "grad_norm": None}
        return self._decide(kind, run, self._evidence([*recent, record]))

    @torch.no_grad()
    def measure(self, run: RunHandle) -> torch.Tensor | None:
        """After the update is queued: this step's measurements as one float64 vector on the
        device, read with the step's numbers (annotate), so nothing here waits for the device.
        [sum of squares of the weight matrices (NaN without any), of the update, of the weights
        before it, *kept share of each MoD predictor]. The weights are measured on the steps the
        every-N kinds judge (before_update's snapshot), the only ones whose norms they read; on
        the others the three sums are NaN, and without MoD predictor stats there is nothing to
        measure (None): no device work outside the step's own."""
        if not self.active:
            return None
        snapshot, self._snapshot = self._snapshot, None
        layers = self._layers()
        if snapshot is None and not layers:
            return None
        params = list(run.model.parameters())
        if self._layout is None or not self._layout.holds(params):
            self._layout = _Layout(run.model, params, run.collectives.world_size)
        matrices = [_local(p) for p in self._layout.weights]
        device = run.collectives.device
        # DeepSpeed ZeRO-3 leaves each rank empty 1-D placeholders (the values live in its
        # partitions): no parameter norm or update ratio is measured there.
        if snapshot is None or not matrices or len(snapshot) != len(params):
            parts = [torch.full((3,), math.nan, dtype=torch.float64, device=device)]
        else:
            # every norm in one fused launch, the three sums in one product: each launch outside
            # the step's CUDA graph costs device time
            delta = torch._foreach_sub([_local(p) for p in params], snapshot)
            selector = self._layout.selector(matrices[0].device)
            norms = torch._foreach_norm([*matrices, *delta, *snapshot], dtype=torch.float32)
            parts = [torch.mv(selector, torch.stack(norms).double().square())]
        if snapshot is not None:
            self._weighed.add(run.step + 1)
        parts += [torch.stack(self._predictor_kept[i]).double().mean().reshape(1) for i in layers]
        self._predictor_kept.clear()
        return torch.cat([p.to(device) for p in parts])

    def _layers(self) -> list[int]:
        return sorted(self._predictor_kept)

    def annotate(
        self, run: RunHandle, record: dict[str, Any], measured: torch.Tensor | None
    ) -> None:
        """Adds memory_gb to a step's record, param_norm and update_ratio on the steps measure()
        weighed, mod/predictor_selected with MoD predictors: from measure()'s vector for that
        step, read on the host."""
        if not self.active:
            return
        device = run.collectives.device
        if device.type == "cuda":
            # max_memory_allocated's value without its flattening of every allocator statistic
            # into a sorted dict (~0.5 ms of host time per step, while the GPU waits)
            stats = torch.cuda.memory_stats_as_nested_dict(device)
            record["memory_gb"] = stats["allocated_bytes"]["all"]["peak"] / 1e9
        else:  # Linux reports ru_maxrss in KiB
            record["memory_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
        if measured is None:
            return
        if record["step"] in self._weighed:
            self._weighed.discard(record["step"])
            squares = measured[:3].tolist()
            layout = self._layout  # measure() set it for this step's parameters
            if layout.fsdp2:
                # FSDP2's disjoint shards: one all-reduce of the three sums of squares
                world = run.collectives.world_size
                mean = run.collectives.all_reduce_mean_tensor(measured[:3].reshape(3))
                squares = [float(v) * world for v in mean]
            elif layout.shards:
                # expert parallelism: measure() weighted the shards, the mean counts each once
                squares = run.collectives.all_reduce_mean_tensor(measured[:3].reshape(3)).tolist()
            param_sq, delta_sq, before_sq = squares
            record["param_norm"] = None if math.isnan(param_sq) else math.sqrt(param_sq)
            record["update_ratio"] = (
                math.sqrt(delta_sq / before_sq)
                if not math.isnan(delta_sq) and before_sq > 0
                else None
            )
        if len(measured) > 3:
            record["mod/predictor_selected"] = measured[3:].tolist()

    def after_step(self, run: RunHandle, record: dict[str, Any]) -> None:
        """A finished step's record: the NaN/inf guard, then every `every` steps the other kinds.
        With train.overlap_host this runs while the device computes the next step, so what it
        changes lands one step later than at depth 0."""
        if not self.active:
            return
        self.window = [*self.window, record][-max(self.config.window, 4 * self.config.every) :]
        rollback = self.kinds.get("rollback")
        if rollback is not None and self._decide(rollback, run, self._evidence([record])):
            return
        step = record["step"]
        if step % self.config.every:
            return
        losses = [r["loss"] for r in self.window[-self.config.every :]]
        finite = [v for v in losses if v is not None and math.isfinite(v)]
        if finite and step > run.setting("optim.warmup_steps"):
            self.eval_means.append(statistics.fmean(finite))
        if self.last_change is not None and step - self.last_change < self.config.cooldown:
            return  # the run changed: its new behaviour needs records before anything is judged
        # kinds that judge the same records share one Evidence, so its signals (the window's
        # per-layer means, medians, slopes) are computed once, not once per kind
        shared: dict[tuple[int, int, int], Evidence] = {}
        for kind in self.kinds.values():
            if kind.guard or not self._in_phase(kind, run, step):
                continue
            records = self._since(kind.name)[-self.config.window :]
            if len(records) >= self.config.min_records:
                key = (records[0]["step"], records[-1]["step"], len(records))
                if key not in shared:
                    shared[key] = self._evidence(records)
                self._decide(kind, run, shared[key])

    def _in_phase(self, kind: Intervention, run: RunHandle, step: int) -> bool:
        """Whether the run is far enough along for `kind` (its phase, base.py): trend kinds judge
        neither the LR warmup (the loss falls fast, then flattens as the lr peaks) nor before
        min_evaluations window means exist after it; nor a loss that does not track progress
        (GRPO's, an advantage-weighted log-prob around 0: its rewards say how the run goes)."""
        if kind.phase == ANY_TIME:
            return True
        if kind.phase == AFTER_EVALUATIONS and not run.loss_tracks_progress:
            return False
        if step <= run.setting("optim.warmup_steps"):
            return False
        return kind.phase == AFTER_WARMUP or len(self.eval_means) >= self.config.min_evaluations

    def observe_val(self, step: int, val_loss: float) -> None:
        if self.active:
            self.val.append({"step": step, "val_loss": val_loss})

    # ---- deciding ------------------------------------------------------------------------------
    def _since(self, name: str) -> list[dict[str, Any]]:
        """The window's records after this kind's last decision and, for an every-N kind, after
        the last change anyone made (its fresh evidence). A guard judges one step against the
        steps before it, whatever changed."""
        last = self.last_fired.get(name, 0)
        if not self.kinds[name].guard:
            last = max(last, self.last_change or 0)
        return [r for r in self.window if r["step"] > last]

    def _evidence(self, records: list[dict[str, Any]]) -> Evidence:
        return Evidence(records, self.val, self.flops_per_token)

    def _decide(self, kind: Intervention, run: RunHandle, evidence: Evidence) -> bool:
        """Check one kind; log a decision when it fires; True when the action was applied.
        Recovery kinds act in mode advise too; the others only in mode act."""
        step = evidence.records[-1]["step"]
        last = self.last_fired.get(kind.name)
        if last is not None and step - last < kind.settings.cooldown:
            return False
        trigger = kind.check(evidence, run, self)
        if trigger is None or trigger.confidence < kind.settings.min_confidence:
            return False
        act = self.config.mode == "act" or kind.recovery
        change = kind.apply(evidence, run, self) if act else {}
        signals = evidence.signals
        decision = {
            "step": step,
            "kind": kind.name,
            "mode": self.config.mode,
            "applied": act,
            "confidence": round(trigger.confidence, 4),
            "reason": trigger.reason,
            "action": kind.action,
            "change": change,
            # what the judgement rested on: records, evaluations after warmup, the loss noise
            "evidence": {
                "records": len(evidence.records),
                "evaluations": len(self.eval_means),
                "loss_noise": signals.loss_noise,
            },
            "signals": {k: v for k, v in signals.as_dict().items() if v is not None},
        }
        self.last_fired[kind.name] = step
        if act and not kind.guard:
            # the first step that runs with the change is run.step + 1: with train.overlap_host
            # the step in flight (run.step) still ran without it
            self.last_change = run.step
        self.history.append(decision)
        self.log.write(decision)
        return act

    def reset_window(self) -> None:
        """Forget the records (after a rollback or a change of expert count)."""
        self.window = []
        self.val = []

    # ---- checkpoint ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "history": list(self.history),
            "window": list(self.window),
            "val": list(self.val),
            "last_fired": dict(self.last_fired),
            "lr_scale": self.lr_scale,
            "settings": dict(self.settings),
            "stop_requested": self.stop_requested,
            "eval_means": list(self.eval_means),
            "last_change": self.last_change,
            "kinds": {name: kind.state_dict() for name, kind in self.kinds.items()},
        }

    def load_state_dict(self, state: dict[str, Any], rewrite_log: bool = True) -> None:
        self.history = list(state["history"])
        self.window = list(state["window"])
        self.val = list(state["val"])
        self.last_fired = dict(state["last_fired"])
        self.lr_scale = float(state["lr_scale"])
        self.settings = dict(state["settings"])
        self.stop_requested = bool(state["stop_requested"])
        self.eval_means = list(state["eval_means"])
        self.last_change = state["last_change"]
        # a checkpoint written before kinds kept state has none: their memory starts empty
        for name, kind_state in state.get("kinds", {}).items():
            if name in self.kinds:
                self.kinds[name].load_state_dict(kind_state)
        if rewrite_log:
            self.log.rewrite(self.history)
