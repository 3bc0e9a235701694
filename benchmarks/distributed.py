"""Distributed training on one host: single GPU, DDP, FSDP2 and DeepSpeed ZeRO-1/2/3 (+ offload).

Each configuration trains --steps of the same model (124m-dense by default; bf16, seq 1024, the
same global batch and seed, tinyshakespeare as bytes) through the real CLI under torchrun, and one
JSON line per run reports: final loss, max |loss - single-GPU loss| over all steps, steady-state
tokens/s, per-GPU peak memory (torch.cuda.max_memory_allocated from every rank) and, on several
GPUs, two scaling efficiencies, tokens/s / (n_gpus x one GPU's tokens/s):
- "ratio" / scaling_efficiency (weak scaling, the usual data-parallel measure): against
  `single_per_gpu`, one GPU running one rank's share (--micro-batch-size sequences per step, no
  accumulation), so both sides run the same work per GPU and one optimizer step per micro-batch;
- same_global_batch_efficiency (strong scaling): against `single`, one GPU running the whole global
  batch with accumulation, so it pays one optimizer step per --batch-size sequences where each rank
  pays one per its share. `single` is also the loss reference (same global batch and seed).
--compile adds train.compile (torch.compile per block) to every configuration; --set KEY=VALUE any
other ats-train override (`--set profile.steps=3 --set profile.start=15` writes a torch.profiler
summary per rank to --out/<name>/profile/rank-R/summary.txt; tokens/s then stops at profile.start).

    PYTHONPATH=$(ls -d packages/*/src | paste -sd:) \\
        python3 benchmarks/distributed.py --data tinyshakespeare.txt --out /tmp/dist --gpus 2

The scaling rows of BENCHMARKS.md: `--compile --batch-size 64 --micro-batch-size 32 --only
single,single_per_gpu,ddp,fsdp2_one_unit`, 32 sequences per GPU as in the single-GPU MFU benchmark.
Expert parallelism (issue 31): `--preset 124m-moe --compile --batch-size 64 --micro-batch-size 32
--only single,single_per_gpu,ddp,ddp_ep,fsdp2_ep`; ddp_ep is ddp with parallel.expert_parallel =
--gpus (each GPU holds E / gpus experts of every MoE layer), fsdp2_ep the same with FSDP2 sharding
the rest of the model (one unit per block), and their "ratio" is their tokens/s per GPU over one
GPU's (single_per_gpu) running the same model (goal: >= 0.85). Expert surgery (orchestrator
prune_experts / split_expert, which expert parallelism refuses) is off in every run, so every row
trains the same model.

A run that fails is reported with its error line and the others go on. Results stay in
--out/<name>/ (metrics.jsonl, peak-memory/rank-R.json, stderr.log), so `--only a,b` reruns some
configurations and still compares against an earlier `single` run there. CPU smoke run (gloo):
`--device cpu --preset tiny-dense --steps 5 --seq-len 64 --only single,ddp,fsdp2`; of the EP row:
`--device cpu --preset tiny-moe --steps 5 --seq-len 64 --vocab-size 0 --precision fp32 --kernels
reference --only single,single_per_gpu,ddp_ep,fsdp2_ep`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXPERT_PARALLEL_ROWS = ("ddp_ep", "fsdp2_ep")  # parallel.expert_parallel = --gpus (overrides_for)

# name -> (ranks: "gpus" = --gpus, 1 = one process without torchrun; overrides)
CONFIGS: dict[str, tuple[str | int, dict[str, object]]] = {
    "single": (1, {"parallel.backend": "single"}),
    "single_per_gpu": (1, {"parallel.backend": "single"}),  # train.batch_size = one rank's share
    "ddp": ("gpus", {"parallel.backend": "ddp"}),
    # an MoE --preset: every MoE layer's experts split over the --gpus ranks (EXPERT_PARALLEL_ROWS)
    "ddp_ep": ("gpus", {"parallel.backend": "ddp"}),
    "fsdp2_ep": ("gpus", {"parallel.backend": "fsdp2"}),
    "fsdp2": ("gpus", {"parallel.backend": "fsdp2"}),
    "fsdp2_one_unit": ("gpus", {"parallel.backend": "fsdp2", "parallel.fsdp2.unit_blocks": 0}),
    # between one unit (no overlap of the all-gather / reduce-scatter) and one per block (the
    # most overlap, the most host time per step): units of 6 and of 3 blocks
    "fsdp2_6blocks": ("gpus", {"parallel.backend": "fsdp2", "parallel.fsdp2.unit_blocks": 6}),
    "fsdp2_3blocks": ("gpus", {"parallel.backend": "fsdp2", "parallel.fsdp2.unit_blocks": 3}),
    # one unit per block, none resharded after forward: no second all-gather in backward
    "fsdp2_no_reshard": (
        "gpus",
        {"parallel.backend": "fsdp2", "parallel.fsdp2.reshard_after_forward": False},
    ),
    "zero1": ("gpus", {"parallel.backend": "deepspeed", "parallel.deepspeed.zero_stage": 1}),
    "zero2": ("gpus", {"parallel.backend": "deepspeed", "parallel.deepspeed.zero_stage": 2}),
    "zero3": ("gpus", {"parallel.backend": "deepspeed", "parallel.deepspeed.zero_stage": 3}),
    "zero3_offload_cpu": (
        "gpus",
        {
            "parallel.backend": "deepspeed",
            "parallel.deepspeed.zero_stage": 3,
            "parallel.deepspeed.offload_optimizer": "cpu",
        },
    ),
    "zero3_offload_nvme": (
        "gpus",
        {
            "parallel.backend": "deepspeed",
            "parallel.deepspeed.zero_stage": 3,
            "parallel.deepspeed.offload_optimizer": "nvme",
            "parallel.deepspeed.offload_param": "nvme",
        },
    ),
}
PEAK_DIR = "peak-memory"


# ---- one rank (run under torchrun, or alone for `single`) ----------------------------------------
def worker(run_dir: Path, overrides: list[str]) -> int:
    """The real ats-train CLI, then this rank's peak memory to run_dir/peak-memory/rank-R.json."""
    import torch
    from ats_train.cli import main as ats_train

    code = ats_train(["--run-dir", str(run_dir), *overrides])
    rank = int(os.environ.get("RANK", "0"))
    peak: dict[str, object] = {"rank": rank, "exit_code": code}
    # ru_maxrss is in KiB on Linux: this process's host RAM high-water mark
    peak["host_rss_peak_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        peak["device"] = torch.cuda.get_device_name()
        peak["max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated()
        peak["max_memory_reserved_bytes"] = torch.cuda.max_memory_reserved()
    (run_dir / PEAK_DIR).mkdir(exist_ok=True)
    (run_dir / PEAK_DIR / f"rank-{rank}.json").write_text(json.dumps(peak))
    return code


# ---- the driver -------------------------------------------------------------------------------
def overrides_for(
    name: str, args: argparse.Namespace, data_dir: Path, nvme: Path | None
) -> list[str]:
    values: dict[str, object] = {
        "data.source": data_dir,
        "model.preset": args.preset,
        "train.steps": args.steps,
        "train.batch_size": args.batch_size,
        "train.micro_batch_size": args.micro_batch_size,
        "train.seq_len": args.seq_len,
        "train.precision": args.precision,
        "train.device": args.device,
        "train.seed": 1337,
        "train.eval_every": 0,  # one evaluation, after the last step (outside the timing)
        "train.eval_batches": 2,
        "train.log_every": 10,
        "train.sample_tokens": 0,
        "checkpoint.every": 0,
        "kernels": args.kernels,
        # expert surgery would change the model mid-run, and expert parallelism refuses it
        "orchestrator.prune_experts.enabled": False,
        "orchestrator.split_expert.enabled": False,
        **CONFIGS[name][1],
    }
    if name in EXPERT_PARALLEL_ROWS:
        values["parallel.expert_parallel"] = args.gpus
    if name == "single_per_gpu":
        values["train.batch_size"] = args.batch_size // args.gpus
    if args.compile:
        values["train.compile"] = True
    if args.vocab_size:
        values["model.vocab_size"] = args.vocab_size
    if "nvme" in name:
        values["parallel.deepspeed.nvme_path"] = nvme
    return [f"{k}={v}" for k, v in values.items()] + args.set


def launch(name: str, args: argparse.Namespace, data_dir: Path, run_dir: Path) -> tuple[int, str]:
    """Run one configuration; returns (exit code, the last meaningful stderr line)."""
    ranks = args.gpus if CONFIGS[name][0] == "gpus" else 1
    launcher = [sys.executable]
    if CONFIGS[name][0] == "gpus":
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    nvme = (
        Path(tempfile.mkdtemp(prefix=f"ats-{name}-", dir=args.nvme_dir)) if "nvme" in name else None
    )
    cmd = [
        *launcher,
        str(Path(__file__).resolve()),
        "worker",
        str(run_dir),
        *overrides_for(name, args, data_dir, nvme),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if args.device == "cpu":
        env["OMP_NUM_THREADS"] = "1"
    try:
        code, stderr = run_launcher(cmd, env, args.timeout, run_dir / "stderr.log")
    finally:
        if nvme is not None:
            shutil.rmtree(nvme, ignore_errors=True)
    return code, last_error_line(stderr)


def run_launcher(cmd: list[str], env: dict[str, str], timeout: float, log: Path) -> tuple[int, str]:
    """Run torchrun (or one process) to the end or `timeout`; returns (exit code, its output).
    stdout and stderr go to `log` as they are written, so a driver killed from outside (a device
    call's own time limit) still leaves the run's log behind."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # SIGTERM first: torchrun forwards it to its ranks (a SIGKILL would orphan them on
            # the GPUs)
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            out.write(f"\ntimed out after {timeout} s\n")
            code = 124
    return code, log.read_text()


def last_error_line(stderr: str) -> str:
    """The rank's own exception (not torchrun's ChildFailedError wrapper), a CLI error line, the
    signal or exit code from torchrun's root-cause block (a rank killed by the OOM killer leaves
    no exception), or the timeout; else the last line that is not a rule of '=' or '-'."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip(" =-\t")]
    for line in reversed(lines):
        if "ChildFailedError" in line:
            continue
        if "Error:" in line or "error:" in line or "timed out" in line or "Signal " in line:
            return line[:500]
    for line in reversed(lines):
        if line.startswith("exitcode"):  # torchrun: "exitcode  : 1 (pid: ...)"
            return line[:500]
    return lines[-1][:500] if lines else ""


def train_records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if r["kind"] == "train"]


def last_unprofiled_step(args: argparse.Namespace) -> int | None:
    """With --set profile.steps=N, the step before the traced ones, so the profiler's overhead stays
    out of tokens/s (a traced compiled 124M step took ~20% longer); None without profiling."""
    from ats_train.config import ProfileSection

    settings = dict(item.split("=", 1) for item in args.set if item.startswith("profile."))
    if int(settings.get("profile.steps", 0)) == 0:
        return None
    return int(settings.get("profile.start", ProfileSection().start))


def steady_tokens_per_s(
    records: list[dict], warmup: int, last_step: int | None = None
) -> float | None:
    """Tokens between the end of step `warmup` and `last_step` (default: the last one) over the
    wall time between them (metrics.jsonl time stamps): compile, allocator and NCCL warm-up stay
    out."""
    records = [r for r in records if last_step is None or r["step"] <= last_step]
    if len(records) <= warmup:
        return None
    first, last = records[warmup - 1], records[-1]
    return (last["tokens"] - first["tokens"]) / (last["time"] - first["time"])


def summarize(name: str, args: argparse.Namespace, out: Path, wall_s: float, error: str) -> dict:
    run_dir, ref_dir = out / name, out / "single"
    records = train_records(run_dir)
    ranks = args.gpus if CONFIGS[name][0] == "gpus" else 1
    warmup = max(1, min(10, args.steps // 5))
    last_step = last_unprofiled_step(args)
    peaks = [json.loads(p.read_text()) for p in sorted((run_dir / PEAK_DIR).glob("rank-*.json"))]
    result: dict[str, object] = {
        "name": f"distributed_{name}",
        "gpus": ranks,
        "steps": len(records),
        "final_loss": records[-1]["loss"] if records else None,
        "tokens_per_s": steady_tokens_per_s(records, warmup, last_step),
        "peak_memory_gib": [
            round(p["max_memory_allocated_bytes"] / 2**30, 3)
            for p in peaks
            if "max_memory_allocated_bytes" in p
        ],
        "host_rss_peak_gib": [round(p["host_rss_peak_bytes"] / 2**30, 3) for p in peaks],
        "wall_s": round(wall_s, 1),
    }
    single = train_records(ref_dir)
    if records and single:
        ref = {r["step"]: r["loss"] for r in single}
        diffs = [abs(r["loss"] - ref[r["step"]]) for r in records if r["step"] in ref]
        result["max_abs_loss_diff_vs_single"] = max(diffs) if diffs else None
        result["steps_compared"] = len(diffs)
    single_tps = steady_tokens_per_s(single, warmup, last_step)
    per_gpu_tps = steady_tokens_per_s(train_records(out / "single_per_gpu"), warmup, last_step)
    result["ours"] = result["tokens_per_s"]
    result["baseline"], result["ratio"] = None, None
    if ranks > 1 and result["tokens_per_s"]:
        if per_gpu_tps:
            result["baseline"] = ranks * per_gpu_tps  # perfect linear scaling of one GPU
            result["ratio"] = result["tokens_per_s"] / result["baseline"]
            result["scaling_efficiency"] = result["ratio"]
        if single_tps:
            result["same_global_batch_efficiency"] = result["tokens_per_s"] / (ranks * single_tps)
    devices = {p["device"] for p in peaks if "device" in p}
    result["hardware"] = f"{ranks} x {', '.join(sorted(devices)) or args.device}"
    if error:
        result["error"] = error
    return result


def prepare_data(text: Path, out: Path) -> Path:
    """tinyshakespeare-style text as byte tokens (benchmarks/shakespeare.py's split), once per
    --out directory."""
    data_dir = out / "data"
    if not (data_dir / "index.json").is_file():
        sys.path.insert(0, str(Path(__file__).parent))
        from shakespeare import prepare

        shutil.rmtree(data_dir, ignore_errors=True)
        prepare(text, data_dir)
    return data_dir


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a text file (tinyshakespeare)")
    parser.add_argument("--out", type=Path, required=True, help="run dirs and prepared data")
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--only", default=",".join(CONFIGS), help=f"comma list of {list(CONFIGS)}")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--preset", default="124m-dense")
    parser.add_argument(
        "--vocab-size", type=int, default=50304, help="model.vocab_size (0: the tokenizer's, 257)"
    )
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=32, help="GLOBAL sequences per step")
    parser.add_argument("--micro-batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--kernels", default="auto")
    parser.add_argument("--compile", action="store_true", help="train.compile for every run")
    parser.add_argument("--device", default="cuda", help="cpu: a gloo smoke run of the plumbing")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra ats-train override for every run, e.g. profile.steps=3 (repeatable)",
    )
    parser.add_argument(
        "--nvme-dir", default=None, help="local disk for NVMe offload (default: TMP)"
    )
    parser.add_argument("--timeout", type=int, default=420, help="seconds per configuration")
    args = parser.parse_args(argv)
    unknown = [n for n in args.only.split(",") if n not in CONFIGS]
    if unknown:
        parser.error(f"--only: unknown configuration(s) {unknown}; known: {list(CONFIGS)}")
    if not args.data.is_file():
        parser.error(f"--data {args.data}: no such file")
    if args.batch_size % args.gpus or (args.batch_size // args.gpus) % args.micro_batch_size:
        parser.error(
            f"--batch-size {args.batch_size} must split into --gpus {args.gpus} ranks of whole "
            f"--micro-batch-size {args.micro_batch_size} micro-batches"
        )
    return args


def main(argv: list[str]) -> int:
    if argv[:1] == ["worker"]:
        return worker(Path(argv[1]), argv[2:])
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    data_dir = prepare_data(args.data, args.out)
    names = [n for n in CONFIGS if n in args.only.split(",")]  # single first when asked for
    for name in names:
        run_dir = args.out / name
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir()
        start = time.perf_counter()
        code, error = launch(name, args, data_dir, run_dir)
        wall = time.perf_counter() - start
        print(json.dumps(summarize(name, args, args.out, wall, error if code else "")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
