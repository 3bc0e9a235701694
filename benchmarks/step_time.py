"""Steady step time and evaluation time of shakespeare.py's runs on one GPU, warm.

shakespeare.py measures time to quality, where compilation, evaluation and the schedule all
count; this isolates the step. Per run: build time, first step (graph capture, kernel
compilation), the mean of --steps steps after --warmup, one evaluation (shakespeare.py's: the whole
val split in one forward; --eval-batches 10 for 10 x 64 seeded random windows), and
with --profile a cProfile of the timed steps (where the host's time goes).

    PYTHONPATH=$(ls -d packages/*/src | paste -sd:) python3 benchmarks/step_time.py \\
        --data ../shared/data/tinyshakespeare.txt \\
        --runs dense:train.overlap_host=false:orchestrator.mode=advise,dense,moe_fine_dropout

A run is NAME (shakespeare.RUNS) or NAME:KEY=VALUE[:KEY=VALUE...]; shakespeare.py's configuration
overlaps the host with the device (train.overlap_host, orchestrator off), and
`:train.overlap_host=false:orchestrator.mode=advise` is the trainer's synchronous default. The
first run is the baseline of the others' "ratio" (their step over its step). One JSON line per run.
"""

import argparse
import cProfile
import io
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # shakespeare.py's data, model and runs
import shakespeare  # noqa: E402
from ats_train.build import build_trainer  # noqa: E402
from ats_train.config import build_config  # noqa: E402


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(spec: str, data: Path, args: argparse.Namespace, run_dir: Path) -> dict:
    name, *sets = spec.split(":")
    run_args = argparse.Namespace(
        steps=None,  # the run's schedule in shakespeare.py; only warmup + steps of it are taken
        batch_size=64,
        compile=False,
        cuda_graphs=args.device == "cuda",
        seed=args.seed,
        kernels="auto",
        device=args.device,
        eval_batches=args.eval_batches,
        lr=1e-3,
        set=sets,
    )
    run_dir.mkdir()
    t = time.perf_counter()
    with build_trainer(
        build_config(shakespeare.run_config(name, data, run_args)), run_dir
    ) as trainer:
        sync(args.device)
        build = time.perf_counter() - t
        t = time.perf_counter()
        trainer.train_step()
        sync(args.device)
        first = time.perf_counter() - t
        for _ in range(args.warmup):
            trainer.train_step()
        sync(args.device)
        profile = cProfile.Profile() if args.profile else None
        t = time.perf_counter()
        if profile is not None:
            profile.enable()
        for _ in range(args.steps):
            trainer.train_step()
        sync(args.device)
        if profile is not None:
            profile.disable()
        step = (time.perf_counter() - t) / args.steps
        trainer.flush()
        t = time.perf_counter()
        trainer.evaluate()
        sync(args.device)
        evaluation = time.perf_counter() - t
    if profile is not None:
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(40)
        print(text.getvalue(), file=sys.stderr)
    return {
        "run": spec,
        "step_ms": round(1e3 * step, 2),
        "build_s": round(build, 2),
        "first_step_s": round(first, 2),
        "eval_ms": round(1e3 * evaluation, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/tinyshakespeare.txt"))
    parser.add_argument(
        "--runs", default="dense,moe_fine_dropout", help="comma list of runs (docstring)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=149)
    parser.add_argument("--steps", type=int, default=200, help="timed steps")
    parser.add_argument("--eval-batches", type=int, default=0, help="as shakespeare.py's")
    parser.add_argument("--profile", action="store_true", help="cProfile of the timed steps")
    parser.add_argument("--device", default="cuda", help="cpu only for a smoke run of the script")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("step_time.py: needs a CUDA device")
    if not args.data.is_file():
        raise SystemExit(f"step_time.py: {args.data} not found (pass --data)")
    hardware = (
        torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    ) + f"; torch {torch.__version__}"
    with tempfile.TemporaryDirectory() as tmp:
        data = shakespeare.prepare(args.data, Path(tmp) / "data")
        baseline = None
        for i, spec in enumerate(args.runs.split(",")):
            result = measure(spec, data, args, Path(tmp) / f"run-{i}")
            baseline = baseline or result["step_ms"]
            result = {
                "name": f"step_time_{spec}",
                "ours": result["step_ms"],
                "baseline": baseline,
                "ratio": round(result["step_ms"] / baseline, 3),
                "unit": "ms per training step (mean, warm)",
                "hardware": hardware,
                **result,
            }
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
