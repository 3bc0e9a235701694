"""Step profiling: torch.profiler over a window of training steps, summarized where the time went.

`profile.steps = N` traces steps start+1 .. start+N on every rank and writes, per rank,
RUN_DIR/profile/rank-R/trace.json.gz (open in Perfetto or chrome://tracing) and summary.txt: wall
vs GPU-busy time per step, GPU time by kernel category (matmul, attention, communication, ...),
the top kernels, the top host ops, and what the host was running while the GPU idled (each host
op or annotation by its time inside the gaps between kernels: the ops that keep the GPU waiting).
torchtitan's `profiling.enable_profiling` is the model.
"""

from __future__ import annotations

import bisect
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

# first match wins; a kernel's name says what it computes (cuBLAS/CUTLASS/cuDNN/NCCL/Inductor)
CATEGORIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("communication", re.compile(r"nccl|all_?reduce|all_?gather|reduce_?scatter", re.I)),
    ("attention", re.compile(r"flash|fmha|sdpa|attention|cudnn", re.I)),
    ("matmul", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|wgmma|_grouped_mm", re.I)),
    ("optimizer", re.compile(r"multi_tensor|adam|foreach", re.I)),
    ("copy/fill", re.compile(r"memcpy|memset|copy_kernel|fill_kernel|cat_", re.I)),
    ("triton", re.compile(r"^triton_|_kernel$")),  # Inductor's triton_* and ours (*_kernel)
)


def category(kernel: str) -> str:
    for name, pattern in CATEGORIES:
        if pattern.search(kernel):
            return name
    return "other"


def idle_gaps(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The [start, end) stretches between the first and the last kernel with none running."""
    gaps, reach = [], None
    for start, end in sorted(intervals):
        if reach is not None and start > reach:
            gaps.append((reach, start))
        reach = end if reach is None else max(reach, end)
    return gaps


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals: time with at least one kernel running
    (kernels on other streams, such as NCCL's, overlap compute and are counted once)."""
    if not intervals:
        return 0.0
    span = max(end for _, end in intervals) - min(start for start, _ in intervals)
    return span - sum(end - start for start, end in idle_gaps(intervals))


def time_in_gaps(start: float, end: float, gaps: list[tuple[float, float]]) -> float:
    """Length of [start, end) inside the (sorted, disjoint) gaps."""
    total = 0.0
    i = max(0, bisect.bisect_right(gaps, (start, float("inf"))) - 1)
    while i < len(gaps) and gaps[i][0] < end:
        total += max(0.0, min(end, gaps[i][1]) - max(start, gaps[i][0]))
        i += 1
    return total


@dataclass
class KernelTime:
    name: str
    total_us: float
    count: int


def summarize(events: list, steps: int, wall_s: float) -> dict:
    """Per-step figures from the profiler's events (FunctionEvent: name, device_type,
    is_user_annotation, time_range in microseconds, self_cpu_time_total)."""
    # device-side ranges of user annotations (record_function names such as "nccl:all_reduce" or
    # "Optimizer.step#AdamW.step") span the kernels they launched, gaps included: not kernels
    kernels = [e for e in events if e.device_type == DeviceType.CUDA and not e.is_user_annotation]
    by_kernel: dict[str, KernelTime] = {}
    for e in kernels:
        k = by_kernel.setdefault(e.name, KernelTime(e.name, 0.0, 0))
        k.total_us += e.time_range.end - e.time_range.start
        k.count += 1
    by_category: dict[str, float] = {}
    for k in by_kernel.values():
        by_category[category(k.name)] = by_category.get(category(k.name), 0.0) + k.total_us
    host: dict[str, float] = {}
    for e in events:
        if e.device_type == DeviceType.CPU:
            host[e.name] = host.get(e.name, 0.0) + e.self_cpu_time_total
    intervals = [(e.time_range.start, e.time_range.end) for e in kernels]
    busy_us = busy_time(intervals)
    gaps = idle_gaps(intervals)
    in_gaps: dict[str, float] = {}  # nested ops each count their own overlap (inclusive)
    for e in events:
        if e.device_type == DeviceType.CPU:
            us = time_in_gaps(e.time_range.start, e.time_range.end, gaps)
            if us > 0:
                in_gaps[e.name] = in_gaps.get(e.name, 0.0) + us
    wall_ms = wall_s * 1e3 / steps
    top = sorted(by_kernel.values(), key=lambda k: -k.total_us)
    return {
        "steps": steps,
        "wall_ms_per_step": round(wall_ms, 3),
        "gpu_busy_ms_per_step": round(busy_us / 1e3 / steps, 3),
        "gpu_idle_fraction": round(1 - busy_us / 1e3 / steps / wall_ms, 4) if kernels else None,
        "kernels_per_step": len(kernels) / steps,
        "gpu_ms_per_step_by_category": {
            c: round(us / 1e3 / steps, 3)
            for c, us in sorted(by_category.items(), key=lambda i: -i[1])
        },
        "top_kernels": [
            {
                "name": k.name[:120],
                "category": category(k.name),
                "ms_per_step": round(k.total_us / 1e3 / steps, 3),
                "calls_per_step": k.count / steps,
            }
            for k in top[:30]
        ],
        "top_host_ops": [
            {"name": name[:120], "self_ms_per_step": round(us / 1e3 / steps, 3)}
            for name, us in sorted(host.items(), key=lambda i: -i[1])[:20]
        ],
        "gpu_idle_ms_per_step": round(sum(b - a for a, b in gaps) / 1e3 / steps, 3),
        "host_during_gpu_idle": [
            {"name": name[:120], "ms_per_step": round(us / 1e3 / steps, 3)}
            for name, us in sorted(in_gaps.items(), key=lambda i: -i[1])[:25]
        ],
    }


def format_summary(summary: dict) -> str:
    lines = [
        f"steps profiled: {summary['steps']}",
        f"wall per step: {summary['wall_ms_per_step']} ms; GPU busy per step: "
        f"{summary['gpu_busy_ms_per_step']} ms (idle fraction {summary['gpu_idle_fraction']}); "
        f"kernels per step: {summary['kernels_per_step']}",
        "",
        "GPU ms per step by category (kernels on overlapping streams each count in full):",
        *(f"  {c:<14} {ms:10.3f}" for c, ms in summary["gpu_ms_per_step_by_category"].items()),
        "",
        "top kernels: ms/step  calls/step  category  name",
        *(
            f"  {k['ms_per_step']:9.3f} {k['calls_per_step']:8.1f}  {k['category']:<13} {k['name']}"
            for k in summary["top_kernels"]
        ),
        "",
        "top host ops by self time: ms/step  name",
        *(f"  {h['self_ms_per_step']:9.3f}  {h['name']}" for h in summary["top_host_ops"]),
        "",
        f"GPU idle between kernels: {summary['gpu_idle_ms_per_step']} ms per step; host ops and "
        "annotations running then (inclusive): ms/step  name",
        *(f"  {h['ms_per_step']:9.3f}  {h['name']}" for h in summary["host_during_gpu_idle"]),
    ]
    return "\n".join(lines) + "\n"


class StepProfiler:
    """Traces steps start+1 .. start+steps: call before_step(step) and after_step(step) with the
    number of steps done so far. The device is synchronized at both ends of the window so the
    wall time and the kernels inside it belong to the same steps."""

    def __init__(self, start: int, steps: int, out_dir: Path, device: torch.device) -> None:
        self.start, self.steps, self.out_dir, self.device = start, steps, out_dir, device
        self.prof: profile | None = None
        self.t0 = 0.0
        self.summary: dict | None = None

    @classmethod
    def disabled(cls) -> StepProfiler:
        return cls(0, 0, Path(), torch.device("cpu"))

    def before_step(self, done: int) -> None:
        if self.steps and done == self.start and self.prof is None and self.summary is None:
            activities = [ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(ProfilerActivity.CUDA)
                torch.cuda.synchronize(self.device)
            self.prof = profile(activities=activities)
            self.prof.start()
            self.t0 = time.perf_counter()

    def after_step(self, done: int) -> None:
        if self.prof is None or done < self.start + self.steps:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        wall_s = time.perf_counter() - self.t0
        self.prof.stop()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.prof.export_chrome_trace(str(self.out_dir / "trace.json.gz"))
        self.summary = summarize(list(self.prof.events()), self.steps, wall_s)
        (self.out_dir / "summary.json").write_text(json.dumps(self.summary, indent=1))
        (self.out_dir / "summary.txt").write_text(format_summary(self.summary))
        self.prof = None
