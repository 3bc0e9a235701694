"""`ats-train drill`: every fault of TrainConfig [faults] injected into a tiny run with the
orchestrator in its default mode, and for each what it detected, what it did and whether the run
recovered. The user's proof, on their own machine, that the orchestrator saves runs.

A one-off fault (a NaN gradient, a loss spike, an OOM, a collapse, dead experts) is recovered when
the run finishes within RECOVERED (2%) of the fault-free run's final val loss. A fault that persists
for the whole run (an lr far too low or too high, sharpened routers, runaway weights) cannot be
undone, only answered: it is recovered when the run ends better than the same fault with the
orchestrator off.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ats_train.build import build_trainer
from ats_train.config import load_config
from ats_train.errors import DivergedError
from ats_train.orchestrator.decisions import read_decisions

RECOVERED = 0.02  # a one-off fault's run ends within this (relative) of the fault-free val loss

# the tiny run every drill trains: an MoE + MoD model, a few seconds of CPU per run
TINY: dict[str, object] = {
    "data.max_bytes": 400_000,
    "data.vocab_size": 512,
    "data.workers": 1,
    "model.preset": "tiny-hybrid",
    "train.steps": 40,
    "train.batch_size": 4,
    "train.micro_batch_size": 2,
    "train.seq_len": 32,
    "train.eval_every": 10,
    "train.eval_batches": 2,
    "train.log_every": 1000,
    "train.sample_tokens": 0,
    "optim.warmup_steps": 4,
    "checkpoint.every": 5,
    "checkpoint.keep_last": 2,
    "orchestrator.every": 5,
}


@dataclass(frozen=True)
class Drill:
    name: str
    faults: dict[str, object]  # the overrides that inject it ([faults], and the setting it needs)
    answers: tuple[str, ...]  # the kinds that exist for it: one of them must fire
    persistent: bool = False  # True: judged against the same fault with the orchestrator off


DRILLS = (
    Drill("nan_grad", {"faults.nan_grad_at_step": 13}, ("rollback",)),
    Drill("loss_spike", {"faults.loss_spike_at_step": 15}, ("skip_batch",)),
    # no clip: a clip near the grad norm already bounds a spike, and grad_clip leaves it alone
    Drill("grad_spike", {"faults.grad_spike_at_step": 12, "optim.grad_clip": 0.0}, ("grad_clip",)),
    Drill("oom", {"faults.oom_at_step": 5, "faults.oom_max_micro_batch": 1}, ("oom",)),
    Drill(
        "routing_collapse",
        {"faults.routing_collapse_at_step": 2},
        ("prune_experts", "split_expert", "router_temperature", "aux_loss_weights", "bias_rate"),
    ),
    # prune_experts asks for 4 evaluations in a row by default, more than a 40-step drill holds
    # once another kind's change (aux_loss_weights, at step 10) restarts the evidence: 2 here
    Drill(
        "dead_experts",
        {"faults.dead_experts_at_step": 2, "orchestrator.prune_experts.evaluations": 2},
        ("prune_experts",),
    ),
    Drill("mod_collapse", {"faults.mod_collapse_at_step": 5}, ("mod_collapse",)),
    Drill(
        "router_sharpen",
        {"faults.router_sharpen_at_step": 5, "faults.router_sharpen_factor": 100},
        ("router_temperature",),
        persistent=True,
    ),
    Drill(
        "weight_growth",
        {"faults.weight_growth_at_step": 8, "faults.weight_growth_factor": 2},
        ("weight_decay",),
        persistent=True,
    ),
    Drill(
        "diverge",
        {"faults.diverge_at_step": 12, "faults.diverge_lr_factor": 50},
        ("lr_cut",),
        persistent=True,
    ),
)
BY_NAME = {d.name: d for d in DRILLS}


@dataclass
class DrillResult:
    drill: Drill
    detected: list[str]  # "kind@step" of every decision
    done: list[str]  # the changes applied, "kind: what before -> after"
    val_loss: float | None  # None: the run died
    reference: float  # the fault-free run's val loss, or the same fault's with the orchestrator off
    error: str | None = None

    @property
    def recovered(self) -> bool:
        if self.val_loss is None or not math.isfinite(self.val_loss):
            return False
        answered = any(d.split("@")[0] in self.drill.answers for d in self.detected)
        if self.drill.persistent:
            return answered and self.val_loss < self.reference
        return answered and self.val_loss <= self.reference * (1.0 + RECOVERED)


def train_once(overrides: dict[str, object], run_dir: Path) -> float:
    """Train a run to its end; its final val loss."""
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer = build_trainer(load_config(None, [f"{k}={v}" for k, v in overrides.items()]), run_dir)
    with trainer:
        trainer.train()
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [r for r in records if r["kind"] == "val"][-1]["val_loss"]


def _changes(decision: dict) -> str:
    what = ", ".join(f"{k} {v[0]} -> {v[1]}" for k, v in decision["change"].items())
    return f"{decision['kind']}: {what or decision['action']}"


def run_drills(
    names: Sequence[str],
    base: dict[str, object],
    out: Path,
    show: Callable[[str], None] = print,
) -> list[DrillResult]:
    """The drills `names` on the tiny run `base` (TINY + the user's overrides), in run dirs under
    `out`: one fault-free run first, then each fault (and each persistent one again with the
    orchestrator off)."""
    clean = train_once(base, out / "clean")
    show(f"fault-free run: final val loss {clean:.4f}")
    results = []
    for name in names:
        drill = BY_NAME[name]
        run_dir = out / name
        error, val_loss = None, None
        try:
            val_loss = train_once({**base, **drill.faults}, run_dir)
        except (torch.OutOfMemoryError, DivergedError) as e:  # a fault not answered
            error = str(e).splitlines()[0]
        reference = clean
        if drill.persistent:
            reference = train_once(
                {**base, **drill.faults, "orchestrator.mode": "off"}, out / f"{name}-off"
            )
        decisions = read_decisions(run_dir)
        result = DrillResult(
            drill,
            detected=[f"{d['kind']}@{d['step']}" for d in decisions],
            done=[_changes(d) for d in decisions if d["applied"]],
            val_loss=val_loss,
            reference=reference,
            error=error,
        )
        show(describe(result))
        results.append(result)
    return results


def describe(result: DrillResult) -> str:
    r = result
    against = "off" if r.drill.persistent else "fault-free"
    if r.val_loss is None:
        outcome = f"run died: {r.error}"
    else:
        outcome = f"val {r.val_loss:.4f} vs {against} {r.reference:.4f}"
    return (
        f"{r.drill.name:<17} detected: {', '.join(r.detected) or 'nothing'}\n"
        f"{'':<17} done: {'; '.join(r.done) or 'nothing'}\n"
        f"{'':<17} {'RECOVERED' if r.recovered else 'NOT RECOVERED'} ({outcome})"
    )
