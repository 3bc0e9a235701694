"""Offload that matters: a 9.42B model (preset 10b-dense) trained on ONE GPU with DeepSpeed ZeRO-3,
its optimizer state split between the GPU and CPU RAM, parameters and optimizer state in CPU RAM,
the optimizer state on NVMe, or the parameters on NVMe (the optimizer in CPU RAM or on the GPU).

Mixed-precision AdamW keeps about 16 bytes per parameter P (Rajbhandari et al. 2020, ZeRO sec. 3):
bf16 weights 2P + bf16 gradients 2P + fp32 master weights 4P + Adam m 4P + Adam v 4P. For 9.42B
that is 151 GB, more than an H200's 141 GB of HBM before one activation is stored. The script
first prints that arithmetic and, per run, what DeepSpeed 0.19's ZeRO-3 layout keeps where. With
the optimizer offloaded, DeepSpeed holds every gradient in a host buffer of grad_accum_dtype (the
model's bf16: 2P) and each offloaded sub-group's fp32 gradients beside its state (4P), so an
offloaded optimizer costs 16P, not 12P:

    split       params (2P) on the GPU; the optimizer sub-groups (master + m + v + fp32 grads,
                16P) a fraction R in host RAM, 1 - R on the GPU (offload_optimizer.ratio; DeepSpeed
                steps the GPU part with a torch AdamW); the bf16 gradient buffer (2P) in host RAM
                                                         = (2 + 16R)P host, (2 + 16(1 - R))P GPU
    cpu         params (2P), bf16 grads (2P), optimizer (16P) in host RAM    = 20P host
    nvme        params (2P), bf16 grads (2P) in host RAM; optimizer (16P) on NVMe
                                                                        =  4P host, 16P disk
    param_nvme  bf16 grads (2P), optimizer (16P) in host RAM; params (2P) on NVMe
                                                                        = 18P host, 2P disk
    param_nvme_hbm  params (2P) on NVMe; the optimizer not offloaded: fp32 master + m + v (12P)
                and the bf16 gradient partition (2P) on the GPU, the fp32 gradients one
                sub-group at a time                                =  14P GPU, 2P disk

Pinned host buffers are off (offload_*.pin_memory false): torch's caching host allocator rounds
every pinned allocation up to a power of two (pytorch#150517), so the 17.5 GiB gradient buffer
would pin 32 GiB; a pinned `cpu` run peaked at 231.5 GiB of host RSS for 20P = 175
GiB. Unpinned copies are slower; these runs show what fits, not speed.

For 9.42B on the 1-GPU box (128 GiB RAM, 64 GiB disk): `split` and `param_nvme_hbm` (123 GiB of
HBM) fit. `cpu` and `param_nvme` need 175 and 158 GiB of host RAM (the 2-GPU box's 256 GiB holds
them), and `nvme` 140 GiB of disk, more than either box has. DeepSpeed 0.19 cannot split the
optimizer with parameters on NVMe (ats-train refuses it: the GPU's sub-groups get host masters).
A run whose host-RAM estimate exceeds --host-budget-gib (default 110), whose GPU estimate exceeds
--gpu-budget-gib (default 139, an H200's usable HBM), or whose disk estimate exceeds the free
space under --nvme, is skipped with the numbers, not started. Each run: --steps steps (micro
batch 1, seq --seq-len, activation checkpointing; --set KEY=VALUE overrides any of it), under
torchrun with 1 rank, one JSON line with step times, losses, GPU peak memory and host RSS peak.
No checkpoint is written (gathering 9.4B fp32 weights + Adam state on one host is 113 GB).

    PYTHONPATH=$(ls -d packages/*/src | paste -sd:) python3 benchmarks/offload.py \\
        --data tinyshakespeare.txt --out /tmp/offload --runs split --ratio 0.5
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ats_train.backends.deepspeed_config import PARAM_SWAP_BUFFERS, PARAM_SWAP_OFF

sys.path.insert(0, str(Path(__file__).parent))
from distributed import last_error_line, prepare_data, run_launcher  # noqa: E402  (benchmarks/)

GIB = 2**30
H200_HBM_BYTES = 141e9  # NVIDIA's figure (141 GB, decimal)
# bytes per parameter held where, per run (see the docstring); split's depend on --ratio
OPTIMIZER_BYTES = 4 + 4 + 4 + 4  # fp32 master, Adam m, Adam v, fp32 gradients of a sub-group


def host_bytes(run: str, ratio: float) -> float:
    """Bytes per parameter in host RAM (see the docstring)."""
    return {
        "split": 2 + OPTIMIZER_BYTES * ratio,
        "cpu": 2 + 2 + OPTIMIZER_BYTES,
        "nvme": 2 + 2,
        "param_nvme": 2 + OPTIMIZER_BYTES,
        "param_nvme_hbm": 0,
    }[run]


def gpu_bytes(run: str, ratio: float) -> float:
    """Bytes per parameter kept on the GPU besides the working set (gathered blocks, buffers)."""
    if run == "split":
        return 2 + OPTIMIZER_BYTES * (1 - ratio)
    if run == "param_nvme_hbm":  # fp32 master, m, v; bf16 gradients (fp32 ones per sub-group)
        return 4 + 4 + 4 + 2
    return 0.0


DISK_BYTES = {"split": 0, "cpu": 0, "nvme": OPTIMIZER_BYTES, "param_nvme": 2, "param_nvme_hbm": 2}
RUNS = tuple(DISK_BYTES)
# param_nvme swaps whole parameters through host buffers, each at least the largest parameter
# (10b-dense: the 32000 x 4096 embedding and head, 131M elements)
PARAM_SWAP_BUFFER_NUMEL = 150_000_000
VOCAB_SIZE = 32000  # the runs' vocabulary (a preset's own may differ), not the bytes' 257
HOST_OVERHEAD_GIB = 8  # CUDA context, Python, data, pinned swap buffers (a rough allowance)
GPU_WORKING_SET_GIB = 12  # gathered blocks, activations, reduce buckets (a rough allowance)


def arithmetic(params: int, ratio: float) -> dict[str, object]:
    parts = {
        "bf16_weights": 2 * params,
        "bf16_grads": 2 * params,
        "fp32_master": 4 * params,
        "adam_m_fp32": 4 * params,
        "adam_v_fp32": 4 * params,
    }
    total = sum(parts.values())
    return {
        "name": "offload_memory_arithmetic",
        "params": params,
        "bytes": parts,
        "total_bytes": total,
        "total_gb": round(total / 1e9, 1),
        "h200_hbm_gb": H200_HBM_BYTES / 1e9,
        "fits_one_h200": total <= H200_HBM_BYTES,
        "split_ratio": ratio,
        "host_gib_per_run": {r: round(host_bytes(r, ratio) * params / GIB, 1) for r in RUNS},
        "gpu_gib_per_run": {r: round(gpu_bytes(r, ratio) * params / GIB, 1) for r in RUNS},
        "disk_gib_per_run": {r: round(DISK_BYTES[r] * params / GIB, 1) for r in RUNS},
    }


def ds_config(run: str, nvme_path: Path | None, ratio: float) -> dict[str, object]:
    """ZeRO-3 with the optimizer split between the GPU and the CPU (split), parameters and
    optimizer on the CPU (cpu), the optimizer on NVMe (nvme), or parameters on NVMe and the
    optimizer on the CPU (param_nvme) or on the GPU (param_nvme_hbm). Host-resident buffers are
    not pinned (the docstring says why); NVMe swap buffers are, for async I/O. Batch keys stay
    "auto": ats-train fills them."""
    zero: dict[str, object] = {
        "stage": 3,
        "offload_param": {"device": "cpu", "pin_memory": False},
        "offload_optimizer": {"device": "cpu", "pin_memory": False},
    }
    if run == "split":
        del zero["offload_param"]
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False, "ratio": ratio}
        # DeepSpeed splits by sub-group (the first 1 - ratio of them stay on the GPU): 1e8
        # elements makes ~95 of them, so the split lands within 1% of the ratio
        zero["sub_group_size"] = 100_000_000
    if run == "nvme":
        zero["offload_optimizer"] = {
            "device": "nvme",
            "nvme_path": str(nvme_path),
            "pin_memory": True,
        }
        # optimizer sub-groups are swapped whole: 1e8 elements keeps the pinned swap buffers
        # at a few GB instead of DeepSpeed's default 1e9-element groups (16 GB each, fp32 x 4)
        zero["sub_group_size"] = 100_000_000
    if run == "param_nvme_hbm":
        del zero["offload_optimizer"]
        # the fp32 gradients of one sub-group at a time sit on the GPU: 1e8 elements, 0.4 GB
        zero["sub_group_size"] = 100_000_000
    if run.startswith("param_nvme"):
        # what ats-train generates for parallel.deepspeed.offload_param = "nvme"
        # (backends/deepspeed_config.py says why each key): every parameter on disk, reuse and NVMe
        # prefetch off (each crashes DeepSpeed 0.19's swapper), PARAM_SWAP_BUFFERS buffers of the
        # largest parameter
        zero["offload_param"] = {
            "device": "nvme",
            "nvme_path": str(nvme_path),
            "pin_memory": True,
            "max_in_cpu": 0,
            "buffer_count": PARAM_SWAP_BUFFERS,
            "buffer_size": PARAM_SWAP_BUFFER_NUMEL,
        }
        zero.update(dict.fromkeys(PARAM_SWAP_OFF, 0))
    return {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "bf16": {"enabled": True},
        "zero_optimization": zero,
        "steps_per_print": 2**31 - 1,
    }


# ---- one run, under torchrun --nproc-per-node 1 ----------------------------------------------
def worker(run_dir: Path, steps: int, overrides: list[str]) -> int:
    import torch
    from ats_train.build import build_trainer
    from ats_train.config import load_config

    t0 = time.perf_counter()
    with build_trainer(load_config(None, overrides), run_dir) as trainer:
        torch.cuda.synchronize()
        build_s = time.perf_counter() - t0
        step_s, losses = [], []
        for _ in range(steps):
            start = time.perf_counter()
            record = trainer.train_step()
            torch.cuda.synchronize()
            step_s.append(round(time.perf_counter() - start, 2))
            losses.append(record["loss"])
    result = {
        "build_s": round(build_s, 1),
        "step_s": step_s,
        "losses": losses,
        "gpu_peak_gib": round(torch.cuda.max_memory_allocated() / GIB, 2),
        "gpu_peak_reserved_gib": round(torch.cuda.max_memory_reserved() / GIB, 2),
        # ru_maxrss: KiB on Linux, this process's high-water mark (pinned buffers included)
        "host_rss_peak_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "device": torch.cuda.get_device_name(),
    }
    (run_dir / "result.json").write_text(json.dumps(result))
    trainer.backend.close()
    return 0


# ---- the driver -------------------------------------------------------------------------------
def rank_traceback(stderr: str, keep: int = 30) -> list[str]:
    """The last `keep` lines the rank itself wrote (torchrun prefixes them "[rank0]:"): its
    traceback, not torchrun's failure banner; every non-warning line if none is prefixed."""
    lines = [line for line in stderr.splitlines() if "Warning" not in line]
    ranked = [line for line in lines if line.startswith("[rank")]
    return (ranked or lines)[-keep:]


def mem_available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


def refuse_reason(run: str, params: int, args: argparse.Namespace) -> str | None:
    per_param = host_bytes(run, args.ratio)
    host = per_param * params / GIB + HOST_OVERHEAD_GIB
    if host > args.host_budget_gib:
        return (
            f"needs ~{host:.0f} GiB host RAM ({per_param:g}P + {HOST_OVERHEAD_GIB} GiB), over "
            f"--host-budget-gib {args.host_budget_gib:g}"
            + ("; run `split` (part of the optimizer on the GPU) instead" if run == "cpu" else "")
        )
    gpu = gpu_bytes(run, args.ratio) * params / GIB + GPU_WORKING_SET_GIB
    if gpu > args.gpu_budget_gib:
        return (
            f"needs ~{gpu:.0f} GiB on the GPU ({gpu_bytes(run, args.ratio):g}P + "
            f"{GPU_WORKING_SET_GIB} GiB), over --gpu-budget-gib {args.gpu_budget_gib:g}; "
            "raise --ratio"
        )
    if host > mem_available_gib():
        return f"needs ~{host:.0f} GiB host RAM, MemAvailable is {mem_available_gib():.0f} GiB"
    if DISK_BYTES[run]:
        if args.nvme is None:
            return "needs --nvme DIR (a directory on local NVMe)"
        disk = DISK_BYTES[run] * params / GIB
        free = shutil.disk_usage(args.nvme).free / GIB
        if disk * 1.05 > free:
            return f"needs ~{disk:.0f} GiB under --nvme {args.nvme}, {free:.0f} GiB free"
    return None


def launch(run: str, args: argparse.Namespace, data_dir: Path) -> dict[str, object]:
    run_dir = args.out / run
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    nvme = Path(tempfile.mkdtemp(prefix="ats-offload-", dir=args.nvme)) if DISK_BYTES[run] else None
    config_path = run_dir / "deepspeed.json"
    config_path.write_text(json.dumps(ds_config(run, nvme, args.ratio), indent=1))
    overrides = {
        "data.source": data_dir,
        "model.preset": args.preset,
        "model.vocab_size": VOCAB_SIZE,
        "parallel.backend": "deepspeed",
        "parallel.deepspeed.config": config_path,
        "train.steps": args.steps,
        "train.batch_size": 1,
        "train.micro_batch_size": 1,
        "train.seq_len": args.seq_len,
        "train.precision": "bf16",
        "train.activation_checkpointing": True,
        "train.device": "cuda",
        "train.sample_tokens": 0,
        "train.eval_every": 0,
        "optim.warmup_steps": 1,
        "kernels": args.kernels,
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=1",
        str(Path(__file__).resolve()),
        "worker",
        str(run_dir),
        str(args.steps),
        *[f"{k}={v}" for k, v in overrides.items()],
        *args.set,
    ]
    start = time.perf_counter()
    try:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        code, stderr = run_launcher(cmd, env, args.timeout, run_dir / "stderr.log")
    finally:
        if nvme is not None:
            shutil.rmtree(nvme, ignore_errors=True)
    result: dict[str, object] = {
        "name": f"offload_10b_zero3_{run}",
        "wall_s": round(time.perf_counter() - start, 1),
        "deepspeed_zero": ds_config(run, nvme, args.ratio)["zero_optimization"],
    }
    result_file = run_dir / "result.json"
    if code == 0 and result_file.is_file():
        result.update(json.loads(result_file.read_text()))
        result["hardware"] = f"1 x {result.pop('device')}"
    else:
        result["error"] = last_error_line(stderr) or f"exit code {code}"
        result["exit_code"] = code
        result["stderr_tail"] = rank_traceback(stderr)
    return result


def main(argv: list[str]) -> int:
    if argv[:1] == ["worker"]:
        return worker(Path(argv[1]), int(argv[2]), argv[3:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="a text file (tinyshakespeare), bytes as tokens")
    parser.add_argument("--out", type=Path, help="run dirs and prepared data")
    parser.add_argument("--runs", default="split", help=f"comma list of {', '.join(RUNS)}")
    parser.add_argument(
        "--ratio", type=float, default=0.5,
        help="split: the fraction of the optimizer's sub-groups offloaded to host RAM",
    )  # fmt: skip
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--preset", default="10b-dense")
    parser.add_argument(
        "--nvme", type=Path, default=None, help="local NVMe dir (nvme and param_nvme runs)"
    )
    parser.add_argument("--host-budget-gib", type=float, default=110.0)
    parser.add_argument("--gpu-budget-gib", type=float, default=139.0)
    parser.add_argument("--kernels", default="auto")
    parser.add_argument("--timeout", type=int, default=570, help="seconds per run")
    parser.add_argument(
        "--arithmetic-only", action="store_true", help="print the memory arithmetic and stop"
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="another ats-train override, after the run's own (repeatable)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    from ats_model import count_params, presets

    params = count_params(dataclasses.replace(presets.get(args.preset), vocab_size=VOCAB_SIZE))[0]
    if not 0.0 < args.ratio <= 1.0:
        parser.error(f"--ratio {args.ratio} must be in (0, 1]")
    print(json.dumps(arithmetic(params, args.ratio)), flush=True)
    if args.arithmetic_only:
        return 0
    if args.data is None or args.out is None or not args.data.is_file():
        parser.error("--data FILE and --out DIR are needed to train (or --arithmetic-only)")
    runs = args.runs.split(",")
    if any(r not in RUNS for r in runs):
        parser.error(f"--runs {args.runs!r}: each must be one of {', '.join(RUNS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    data_dir = prepare_data(args.data, args.out)
    for run in runs:
        reason = refuse_reason(run, params, args)
        if reason is not None:
            print(json.dumps({"name": f"offload_10b_zero3_{run}", "skipped": reason}), flush=True)
            continue
        print(json.dumps(launch(run, args, data_dir)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
