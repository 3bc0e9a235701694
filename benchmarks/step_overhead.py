"""The trainer's own cost per step: Trainer.train_step against a bare PyTorch loop on the same model.

A step of a small model on a GPU is short, and what the host does around it (reading the loss,
metrics.jsonl, TensorBoard, the orchestrator's signals, the loader) decides whether the device
waits. This measures that host time where it can be isolated: on the CPU, with a model small
enough that its forward and backward are a fraction of the step. The baseline is the loop a user
would write by hand on the same model, batch and optimizer: set the lr, forward, weighted aux
losses, backward, clip, step, zero_grad, read the loss.

    uv run python benchmarks/step_overhead.py [--runs act,off,overlap,act_overlap] [--steps 200]
    uv run python benchmarks/step_overhead.py --device cuda --shape shakespeare   # on a GPU
    uv run python benchmarks/step_overhead.py --device cuda --shape 124m --model dense

Runs: `act` is the default trainer (orchestrator.mode = act: it reads every step and judges every
10); `off` turns the orchestrator off; `overlap` is off with train.overlap_host; `act_overlap` is the
orchestrator on with train.overlap_host (each step judged one step late, while the device runs the
next). The goal of issue 25: act_overlap's step within 2% of overlap's. Each run alternates blocks
of trainer and bare steps on one model (after a warm-up) and reports the median over blocks of the
mean step (the orchestrator's window work runs every 10 steps: a median step would hide it);
"ratio" = trainer / bare. One JSON line per run.

`--interleave` measures the goal directly, on one trainer: act_overlap's trainer is built once and
timed in alternating blocks with its orchestrator and with `Orchestrator.disabled()` swapped in
(what `orchestrator.mode = off` builds: the mode changes nothing else in the trainer), in the order
on off, off on, on off, ..., each block ending with the steps it launched recorded and the device
idle. Same model, same memory, same compiled graphs: a block's ratio differs from 1 only by the
orchestrator's work and the noise, and `--interleave-control` (the disabled orchestrator in both
blocks of every round) measures that noise in the same call. It prints the median, the geometric
mean with its standard error and the range over rounds of (on block time / off block time).
(Two trainers built side by side and timed alternately, the method before this one, read 1.036
on an A/A control: the second copy of the model ran slower, so the bias was as large as the goal.)
`--profile STEPS` then profiles one block each way (profile_blocks): the device's busy time per
step against the wall time, and the host operators that take the time.

Shapes: `small` (default) is shakespeare.py's model scaled down so the host's work is a visible
share of a CPU step; `shakespeare` is its full model (batch 64 x 256 bytes); `124m` is mfu.py's
124m-dense run (batch 32 x 1024 tokens, `train.residual_stream = autocast`; byte-level data). On
a GPU both run as their benchmarks do, forward and backward replayed from CUDA graphs
(train.cuda_graphs), the goal's setting; `--eager` launches every kernel from Python instead,
where the step is host-bound and any host work of the orchestrator adds to it.
"""

import argparse
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # shakespeare.py's byte-level data and runs
import shakespeare  # noqa: E402
from ats_train.build import build_trainer  # noqa: E402
from ats_train.config import build_config  # noqa: E402
from ats_train.orchestrator.orchestrator import Orchestrator  # noqa: E402
from ats_train.trainer import Trainer  # noqa: E402

MODEL = {  # shakespeare.py's shape, scaled down so the host's work is a visible share
    "model.dim": 64,
    "model.n_layer": 2,
    "model.n_head": 2,
    "model.n_kv_head": 2,
    "model.head_dim": 32,
    "model.max_seq_len": 64,
    "model.tie_embeddings": True,
}
RUNS = {
    "act": {},
    "off": {"orchestrator.mode": "off"},
    "overlap": {"orchestrator.mode": "off", "train.overlap_host": True},
    "act_overlap": {"train.overlap_host": True},
}
SHAPES = {
    "small": {
        **MODEL,
        "train.batch_size": 4,
        "train.seq_len": 64,
    },
    "shakespeare": {
        **{f"model.{k}": v for k, v in shakespeare.MODEL.items()},
        "train.batch_size": 64,
        "train.seq_len": 256,
    },
    "124m": {
        "model.preset": "124m-dense",
        "model.max_seq_len": 1024,
        "train.batch_size": 32,
        "train.seq_len": 1024,
        "train.residual_stream": "autocast",
    },
}


def bare_step(trainer: Trainer, x: torch.Tensor, y: torch.Tensor, lr: float) -> float:
    """What a hand-written loop does per step, on the trainer's own model and optimizer."""
    for group in trainer.optimizer.param_groups:
        group["lr"] = lr
    with trainer.forward_context():  # the same autocast and attention backend as the trainer's
        out = trainer.raw_model(x, targets=y)
    weights = trainer.aux_weights()
    loss = out.loss + sum(weights[name] * value for name, value in out.aux.items())
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trainer.raw_model.parameters(), 1.0)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    return float(out.loss)


def measure(trainer: Trainer, steps: int, rounds: int) -> tuple[float, float]:
    """Seconds per step of (trainer, bare): each a block of steps // rounds, alternating; the
    median over blocks of each block's mean (a mean, so work done every N steps counts)."""
    x, y = (t.to(trainer.backend.device) for t in next(trainer.train_loader))
    lr = trainer.schedule(trainer.step)
    block = max(1, steps // rounds)
    ours, bare = [], []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(block):
            trainer.train_step()
        if trainer.backend.device.type == "cuda":
            torch.cuda.synchronize()  # train.overlap_host leaves the last step running
        ours.append((time.perf_counter() - t) / block)
        t = time.perf_counter()
        for _ in range(block):
            bare_step(trainer, x, y, lr)
        bare.append((time.perf_counter() - t) / block)
    trainer.flush()
    return statistics.median(ours), statistics.median(bare)


def timed_block(trainer: Trainer, orchestrator: Orchestrator, steps: int) -> float:
    """Seconds for `steps` steps with `orchestrator` in the trainer, ending with the block's steps
    recorded by it (train.overlap_host leaves the last one waiting) and the device idle."""
    trainer.orchestrator = orchestrator
    t = time.perf_counter()
    for _ in range(steps):
        trainer.train_step()
    trainer.flush()
    if trainer.backend.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t


def interleave(trainer: Trainer, steps: int, rounds: int, control: bool) -> list[float]:
    """Per round, (orchestrator on block) / (orchestrator off block), mean step times, one block
    of each, their order flipped every round so that what a block leaves the next one (a warmer
    device, the allocator's state) falls on both alike. `control`: the disabled orchestrator in
    both blocks (the method's own bias and spread)."""
    block = max(1, steps // rounds)
    built = trainer.orchestrator
    orchestrators = {"on": Orchestrator.disabled() if control else built,
                     "off": Orchestrator.disabled()}  # fmt: skip
    ratios = []
    for r in range(rounds):
        times = {}
        for kind in ("on", "off") if r % 2 == 0 else ("off", "on"):
            times[kind] = timed_block(trainer, orchestrators[kind], block)
        ratios.append(times["on"] / times["off"])
    trainer.orchestrator = built
    return ratios


def profile_blocks(trainer: Trainer, steps: int, top: int) -> list[dict]:
    """One block of `steps` steps with the orchestrator on and one with it off, each under
    torch.profiler: per block the wall time per step, the device's busy time per step (the sum of
    its kernels' times: below the wall time, the device waited for the host) and the `top`
    operators by host (self CPU) time, so that an on/off gap shows as host or device work."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if trainer.backend.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    built, out = trainer.orchestrator, []
    for kind, orchestrator in (("on", built), ("off", Orchestrator.disabled())):
        with profile(activities=activities) as prof:
            wall = timed_block(trainer, orchestrator, steps)
        events = prof.key_averages()
        device_us = sum(e.self_device_time_total for e in events)
        ops = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
        out.append(
            {
                "block": kind,
                "wall_ms_per_step": round(1e3 * wall / steps, 3),
                "device_busy_ms_per_step": round(device_us / 1e3 / steps, 3),
                "top_host_ops_ms_per_step": {
                    e.key: round(e.self_cpu_time_total / 1e3 / steps, 3) for e in ops
                },
            }
        )
    trainer.orchestrator = built
    return out


def summary(ratios: list[float]) -> dict:
    logs = [math.log(r) for r in ratios]
    se = statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else float("nan")
    return {
        "median_ratio": round(statistics.median(ratios), 4),
        "geomean_ratio": round(math.exp(statistics.fmean(logs)), 4),
        "geomean_se": round(math.exp(statistics.fmean(logs)) * se, 4),
        "range": [round(min(ratios), 4), round(max(ratios), 4)],
        "rounds": len(ratios),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs", default="act,off,overlap,act_overlap", help=f"comma list of {list(RUNS)}"
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--shape", default="small", choices=sorted(SHAPES))
    parser.add_argument("--model", default="moe_fine8", choices=sorted(shakespeare.RUNS))
    parser.add_argument("--steps", type=int, default=600, help="measured steps of each kind")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="one act_overlap trainer, orchestrator on and off in alternating blocks",
    )
    parser.add_argument(
        "--interleave-control",
        action="store_true",
        help="with --interleave: first the same rounds with it off in both blocks",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="STEPS",
        help="with --interleave: then one profiled block of STEPS steps each way (profile_blocks)",
    )
    parser.add_argument(
        "--eager",
        action="store_true",
        help="on a GPU: without train.cuda_graphs (the benchmarks' setting), a host-bound step",
    )
    args = parser.parse_args()
    if (args.interleave_control or args.profile) and not args.interleave:
        parser.error("--interleave-control and --profile go with --interleave")
    names = ["act_overlap"] if args.interleave else args.runs.split(",")
    if args.device == "cpu":
        torch.set_num_threads(1)  # one core for the model, the other to the OS and writer threads
    with tempfile.TemporaryDirectory() as tmp:
        data = shakespeare.prepare(shakespeare.stdlib_text(Path(tmp)), Path(tmp) / "data")
        configs = []
        for name in names:
            configs.append(
                (
                    name,
                    {
                        **shakespeare.RUNS[args.model],
                        "data.source": str(data),
                        "train.steps": 100_000,  # the schedule's length, not how many run
                        "train.precision": "fp32" if args.device == "cpu" else "bf16",
                        "train.device": args.device,
                        "train.cuda_graphs": args.device == "cuda" and not args.eager,
                        "train.log_every": 25,
                        "checkpoint.every": 0,
                        **({"kernels": "reference"} if args.device == "cpu" else {}),
                        **SHAPES[args.shape],
                        **(
                            {"model.ffn_dim": 32 if args.model != "dense" else 128}
                            if args.shape == "small"
                            else {}
                        ),
                        **RUNS[name],
                    },
                )
            )
        if args.interleave:
            run_dir = Path(tmp) / "run-act_overlap"
            run_dir.mkdir()
            with build_trainer(build_config(configs[0][1]), run_dir) as trainer:
                for _ in range(args.warmup):
                    trainer.train_step()
                tests = (["control"] if args.interleave_control else []) + ["on_over_off"]
                for test in tests:
                    ratios = interleave(trainer, args.steps, args.rounds, test == "control")
                    result = {
                        "name": f"step_overhead_{args.shape}_{args.model}_interleaved_{test}",
                        **summary(ratios),
                        "ratios": [round(r, 4) for r in ratios],
                        "unit": "mean step time, orchestrator on / off (control: off / off), "
                        "per round of two blocks on one act_overlap trainer",
                        "hardware": f"{platform.processor() or 'cpu'}; torch {torch.__version__}",
                    }
                    print(json.dumps(result), flush=True)
                if args.profile:
                    for block in profile_blocks(trainer, args.profile, top=15):
                        print(json.dumps({"name": f"step_overhead_{args.shape}_{args.model}_"
                                          f"profile_{block['block']}", **block}), flush=True)  # fmt: skip
            return
        for name, flat in configs:
            run_dir = Path(tmp) / f"run-{name}"
            run_dir.mkdir()
            with build_trainer(build_config(flat), run_dir) as trainer:
                for _ in range(args.warmup):
                    trainer.train_step()
                ours, bare = measure(trainer, args.steps, args.rounds)
            result = {
                "name": f"step_overhead_{args.shape}_{args.model}_{name}",
                "ours": round(1e3 * ours, 3),
                "baseline": round(1e3 * bare, 3),
                "ratio": round(ours / bare, 3),
                "unit": "ms per step: Trainer.train_step vs a bare loop",
                "overhead_ms": round(1e3 * (ours - bare), 3),
                "hardware": f"{platform.processor() or 'cpu'}; torch {torch.__version__}",
                "host": platform.node(),
            }
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
