"""Training metrics: one record per step, sent to metrics.jsonl, TensorBoard and a rich display.

metrics.jsonl is the stream the orchestrator and `ats-train plot` read: one JSON object per line,
{"kind": "train" | "val", "step": N, ...}, flushed as written. On resume the records of steps after
the checkpoint are dropped (they are recomputed), so the stream always describes one history.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

METRICS_FILE = "metrics.jsonl"
TB_DIR = "tb"


def stats_record(stats: dict[str, torch.Tensor]) -> dict[str, Any]:
    """ModelOutput.stats (per-layer tensors) -> JSON-ready per-layer lists.

    "moe/tokens_per_expert" (n_moe_layers, E) becomes "moe/expert_fraction": each layer's share of
    routed token copies per expert (1/E everywhere = perfect balance).
    """
    out: dict[str, Any] = {}
    for key, value in stats.items():
        value = value.detach().float().cpu()
        if key == "moe/tokens_per_expert":
            total = value.sum(dim=-1, keepdim=True).clamp_min(1.0)
            out["moe/expert_fraction"] = (value / total).tolist()  # (n_moe_layers, E)
        else:
            out[key] = value.tolist()
    return out


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def truncate_metrics(run_dir: Path, last_step: int) -> None:
    """Keep only records of steps <= last_step (the checkpoint a resumed run starts from)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return
    lines = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # the torn last line of a killed run
            continue
        if record["step"] <= last_step:
            lines.append(line)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in lines))
    os.replace(tmp, path)


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


class Metrics:
    """Sinks for one run. `enabled` is False on non-zero ranks: they compute, rank 0 reports.
    Nothing touches the run dir before open() (build_trainer calls it once every check passed);
    message() prints before it too. close() closes every sink, also after a failure."""

    def __init__(
        self, run_dir: Path, total_steps: int, start_step: int, log_every: int, enabled: bool
    ):
        self.enabled = enabled
        self.log_every = log_every
        self.console = Console(highlight=False)
        self._run_dir, self._total_steps, self._start_step = Path(run_dir), total_steps, start_step
        self._file = None
        self._tb = None
        self._progress = None

    def open(self) -> None:
        """Drop the records of steps after the start step, then open metrics.jsonl, TensorBoard
        and the progress display (main rank)."""
        if not self.enabled:
            return
        from torch.utils.tensorboard import SummaryWriter

        truncate_metrics(self._run_dir, self._start_step)
        self._file = open(self._run_dir / METRICS_FILE, "a")
        # purge_step hides events of steps that a resumed run recomputes. The default queue of 10
        # events made add_scalar block on the writer thread every step (tens of scalars per step
        # with per-expert utilization): measured 3 ms of a 38 ms CPU step.
        self._tb = SummaryWriter(
            str(self._run_dir / TB_DIR), purge_step=self._start_step + 1, max_queue=4096
        )
        self._progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self._task = self._progress.add_task(
            "train", total=self._total_steps, completed=self._start_step, status=""
        )
        self._progress.start()

    def _write(self, record: dict[str, Any]) -> None:
        assert self._file is not None
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def _scalars(self, prefix: str, value: Any, step: int) -> None:
        """Scalars as is; per-layer lists as prefix/layer{i}; (layer, expert) as .../expert{e}."""
        assert self._tb is not None
        if isinstance(value, list):
            for i, row in enumerate(value):
                if isinstance(row, list):
                    for e, item in enumerate(row):
                        self._tb.add_scalar(f"{prefix}/layer{i}/expert{e}", item, step)
                else:
                    self._tb.add_scalar(f"{prefix}/layer{i}", row, step)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            self._tb.add_scalar(prefix, value, step)

    def train(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"kind": "train", "time": time.time(), **record}
        self._write(record)
        step = record["step"]
        # Per-layer / per-expert lists go to TensorBoard at the log cadence (metrics.jsonl has them
        # every step): tens of scalars per step cost an MoE run milliseconds of CPU per step.
        detail = step % self.log_every == 0 or step == 1
        for key, value in record.items():
            if key in ("kind", "step", "time") or value is None:
                continue
            if detail or not isinstance(value, list):
                self._scalars(f"train/{key}", value, step)
        status = f"loss {record['loss']:.4f}  {_fmt(record['tokens_per_s'], '.0f')} tok/s"
        assert self._progress is not None
        self._progress.update(self._task, completed=step, status=status)
        if step % self.log_every == 0 or step == 1:
            self.console.print(
                f"step {step:>6} | loss {record['loss']:.4f} | lr {record['lr']:.2e} | "
                f"grad norm {_fmt(record['grad_norm'], '.3f')} | "
                f"{_fmt(record['tokens_per_s'], ',.0f')} tok/s | mfu {_fmt(record['mfu'], '.1%')}"
            )

    def val(self, step: int, val_loss: float, extra: dict[str, float] | None = None) -> None:
        """A val record; `extra` (a post-training objective's numbers) as val/<name> keys."""
        if not self.enabled:
            return
        record = {"kind": "val", "time": time.time(), "step": step, "val_loss": val_loss}
        record.update({f"val/{k}": v for k, v in (extra or {}).items() if k != "loss"})
        self._write(record)
        assert self._tb is not None
        self._tb.add_scalar("val/loss", val_loss, step)
        numbers = {k: v for k, v in (extra or {}).items() if k != "loss"}
        if numbers:  # an objective whose loss is no token NLL (DPO, GRPO): its own numbers
            shown = " | ".join(f"val {k} {v:.4f}" for k, v in numbers.items())
        else:
            shown = f"val ppl {math.exp(val_loss) if val_loss < 50 else float('inf'):.1f}"
        self.console.print(f"step {step:>6} | val loss {val_loss:.4f} | {shown}")

    def message(self, text: str) -> None:
        if self.enabled:
            self.console.print(text)

    def close(self) -> None:
        """Close every open sink (each one even if closing another raised); idempotent."""
        self.enabled = False
        progress, tb, file = self._progress, self._tb, self._file
        self._progress = self._tb = self._file = None
        with contextlib.ExitStack() as stack:
            for sink in (file, tb):
                if sink is not None:
                    stack.callback(sink.close)
            if progress is not None:
                stack.callback(progress.stop)
