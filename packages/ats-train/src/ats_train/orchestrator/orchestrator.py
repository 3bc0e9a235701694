"""The Orchestrator: reads each step's metrics record, computes signals every `every` steps, asks
each enabled kind whether its trigger holds, and in mode `act` applies the action (in `advise`
it only logs it; in `off` it is not consulted and the run is exactly the plain trainer's).

Hooks the training loop calls with its RunHandle (handle.py), in step order:
    lr(base)                  lr to use: schedule x lr_scale
    forward_backward(...)     the trainer's forward_backward with OOM recovery around it
    before_update(...)        True = skip this update (loss-spike guard)
    annotate(record)          adds param_norm, update_ratio, memory_gb, MoD predictor stats
    after_step(record)        NaN/inf rollback guard; every-N evaluation of the other kinds
    observe_val(step, loss)   val losses for the divergence signal
Its whole state (history, window, cooldowns, lr_scale, changed settings) is in the checkpoint.
"""

from __future__ import annotations

import math
import resource
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.tensor import DTensor

from ats_train.orchestrator.base import Evidence, Intervention
from ats_train.orchestrator.decisions import DecisionLog
from ats_train.orchestrator.kinds import KINDS
from ats_train.orchestrator.settings import OrchestratorSection

if TYPE_CHECKING:
    from collections.abc import Callable

    from ats_train.orchestrator.handle import Collectives, RunHandle, StepLoss, StepSums


def _local(param: torch.Tensor) -> torch.Tensor:
    """This rank's values: an FSDP2 parameter's shard, any other parameter itself."""
    return param.detach().to_local() if isinstance(param, DTensor) else param.detach()


def _global_norm(local: list[torch.Tensor], shards_of: Collectives | None) -> float:
    """The 2-norm of the whole tensors from this rank's parts (_local): one fused launch and one
    host sync; for FSDP2's disjoint shards (shards_of = the backend) one all-reduce of the sum of
    squares, instead of a DTensor dispatch and a collective per parameter."""
    squares = torch.stack(torch._foreach_norm(local, dtype=torch.float32)).square().sum()
    if shards_of is None:
        return math.sqrt(float(squares))
    mean = shards_of.all_reduce_mean_tensor(squares.double().cpu().reshape(1))
    return math.sqrt(float(mean[0]) * shards_of.world_size)


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
        self.log = DecisionLog(run_dir, show)
        self.flops_per_token = flops_per_token
        self.history: list[dict[str, Any]] = []
        self.window: list[dict[str, Any]] = []
        self.val: list[dict[str, Any]] = []
        self.last_fired: dict[str, int] = {}
        self.lr_scale = 1.0
        self.settings: dict[str, Any] = {}  # dotted config key -> value it was changed to
        self.stop_requested = False
        self.eval_means: list[float] = []  # window-mean train loss at each evaluation
        self._snapshot: list[torch.Tensor] | None = None
        self._predictor_selected: dict[int, list[float]] = {}

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
                kept = float((output.detach() > 0).float().mean())
                self._predictor_selected.setdefault(i, []).append(kept)

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
            self._predictor_selected.clear()

    def _recover_oom(self, run: RunHandle) -> bool:
        kind = self.kinds.get("oom")
        if not self.active or kind is None:
            return False
        record = {"step": run.step + 1, "loss": None, "grad_norm": None}
        return self._decide(kind, run, self._evidence([*self.window, record]))

    def before_update(self, run: RunHandle, out: StepLoss) -> bool:
        """Called between backward and the optimizer step; True = skip this update."""
        if not self.active:
            return False
        if (run.step + 1) % self.config.every == 0:
            self._snapshot = [_local(p).clone() for p in run.model.parameters()]
        kind = self.kinds.get("skip_batch")
        if kind is None or not math.isfinite(out.loss):
            return False
        recent = self._since(kind.name)[-self.config.window :]
        if len(recent) < self.config.min_records:
            return False
        record = {"step": run.step + 1, "loss": out.loss, "grad_norm": None}
        return self._decide(kind, run, self._evidence([*recent, record]))

    @torch.no_grad()
    def annotate(self, run: RunHandle, record: dict[str, Any]) -> None:
        if not self.active:
            return
        params = list(run.model.parameters())
        # matrices only: what weight decay acts on (norm gains at 1.0 would dominate a tiny model)
        matrices = [p.detach() for p in params if p.ndim >= 2]
        shards_of = run.collectives if any(isinstance(p, DTensor) for p in params) else None
        if not matrices:
            # DeepSpeed ZeRO-3 leaves each rank empty 1-D placeholders (the values live in its
            # partitions): no parameter norm or update ratio is measured there.
            record["param_norm"] = record["update_ratio"] = None
            self._snapshot = None
        else:
            record["param_norm"] = _global_norm([_local(p) for p in matrices], shards_of)
        if self._snapshot is not None and len(self._snapshot) == len(params):
            now = [_local(p) for p in params]
            delta = _global_norm(torch._foreach_sub(now, self._snapshot), shards_of)
            before = _global_norm(self._snapshot, shards_of)
            record["update_ratio"] = delta / before if before > 0 else None
        self._snapshot = None
        device = run.collectives.device
        if device.type == "cuda":
            # max_memory_allocated's value without its flattening of every allocator statistic
            # into a sorted dict (~0.5 ms of host time per step, while the GPU waits)
            stats = torch.cuda.memory_stats_as_nested_dict(device)
            record["memory_gb"] = stats["allocated_bytes"]["all"]["peak"] / 1e9
        else:  # Linux reports ru_maxrss in KiB
            record["memory_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
        if self._predictor_selected:
            layers = sorted(self._predictor_selected)
            record["mod/predictor_selected"] = [
                statistics.fmean(self._predictor_selected[i]) for i in layers
            ]
            self._predictor_selected.clear()

    def after_step(self, run: RunHandle, record: dict[str, Any]) -> None:
        if not self.active:
            return
        self.window = [*self.window, record][-max(self.config.window, 4 * self.config.every) :]
        rollback = self.kinds.get("rollback")
        if rollback is not None and self._decide(rollback, run, self._evidence([record])):
            return
        if run.step % self.config.every:
            return
        losses = [r["loss"] for r in self.window[-self.config.every :]]
        finite = [v for v in losses if v is not None and math.isfinite(v)]
        if finite:
            self.eval_means.append(statistics.fmean(finite))
        # kinds that judge the same records share one Evidence, so its signals (the window's
        # per-layer means, medians, slopes) are computed once, not once per kind
        shared: dict[tuple[int, int, int], Evidence] = {}
        for kind in self.kinds.values():
            if kind.guard:
                continue
            records = self._since(kind.name)[-self.config.window :]
            if len(records) >= self.config.min_records:
                key = (records[0]["step"], records[-1]["step"], len(records))
                if key not in shared:
                    shared[key] = self._evidence(records)
                self._decide(kind, run, shared[key])

    def observe_val(self, step: int, val_loss: float) -> None:
        if self.active:
            self.val.append({"step": step, "val_loss": val_loss})

    # ---- deciding ------------------------------------------------------------------------------
    def _since(self, name: str) -> list[dict[str, Any]]:
        """The window's records after this kind's last decision (its fresh evidence)."""
        last = self.last_fired.get(name, 0)
        return [r for r in self.window if r["step"] > last]

    def _evidence(self, records: list[dict[str, Any]]) -> Evidence:
        return Evidence(records, self.val, self.flops_per_token)

    def _decide(self, kind: Intervention, run: RunHandle, evidence: Evidence) -> bool:
        """Check one kind; log a decision when it fires; True when the action was applied."""
        step = evidence.records[-1]["step"]
        last = self.last_fired.get(kind.name)
        if last is not None and step - last < kind.settings.cooldown:
            return False
        trigger = kind.check(evidence, run, self)
        if trigger is None or trigger.confidence < kind.settings.min_confidence:
            return False
        act = self.config.mode == "act"
        change = kind.apply(evidence, run, self) if act else {}
        decision = {
            "step": step,
            "kind": kind.name,
            "mode": self.config.mode,
            "applied": act,
            "confidence": round(trigger.confidence, 4),
            "reason": trigger.reason,
            "action": kind.action,
            "change": change,
            "signals": {k: v for k, v in evidence.signals.as_dict().items() if v is not None},
        }
        self.last_fired[kind.name] = step
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
        if rewrite_log:
            self.log.rewrite(self.history)
