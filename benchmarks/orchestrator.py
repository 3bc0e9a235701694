"""Never hurts: the orchestrator in mode `act` (the default) against `off` on healthy runs.

Each family (dense, MoE, MoD, hybrid: the tiny-* presets) trains on the Python standard library's
own source with each seed, once with the orchestrator acting and once with it off, from the same
seed, data order and schedule. The goal (issue 25): on every run the final val loss with `act` is
within 0.5% of `off`, or better. One JSON line per run pair, with the decisions `act` applied and
why; then a summary; exit 1 if any pair misses the goal.

    uv run python benchmarks/orchestrator.py                 # 4 families x 3 seeds x 300 steps
    uv run python benchmarks/orchestrator.py --quick         # 4 families x 1 seed x 100 steps
    uv run python benchmarks/orchestrator.py --h200          # 124m-dense, 2,000 steps, on CUDA

`--set key=value` overrides any config key of every run (e.g. `--set train.device=cuda`).
`--control` trains `off` a second time from the same seed ("off_vs_off" in the row): the
run-to-run spread of one configuration. On the CPU it is 0 (the runs repeat bit for bit, so an
`act` run that applied nothing ends on `off`'s loss exactly); bf16 training on a GPU is not
deterministic, and an `act` run that applied nothing differs from `off` by that spread alone.
`--deterministic` asks torch for deterministic algorithms in every run
(`torch.use_deterministic_algorithms`, cuDNN's deterministic algorithms, CUBLAS_WORKSPACE_CONFIG
when unset), so that on the GPU too `off` repeats and an `act` run that applied nothing ends on
`off`'s loss; an op without a deterministic implementation then raises.
Evaluation: the whole val split (train.eval_batches = 0), so the number has no sampling noise.
"""

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import torch
from ats_train.build import build_trainer
from ats_train.config import build_config, parse_override
from ats_train.orchestrator.decisions import read_decisions

GOAL = 0.005  # act's final val loss at most this much (relative) above off's
FAMILIES = ("dense", "moe", "mod", "hybrid")

CPU = {  # a few hundred steps of a tiny model on this machine's cores
    "data.source": "stdlib",
    "data.max_bytes": 1_000_000,
    "data.vocab_size": 1024,
    "train.batch_size": 8,
    "train.seq_len": 64,
    "train.eval_every": 50,
    "train.eval_batches": 0,
    "train.log_every": 1000,
    "train.sample_tokens": 0,
    "train.device": "cpu",
    "train.precision": "fp32",
    "optim.warmup_steps": 30,
    "checkpoint.every": 50,
    "checkpoint.keep_last": 1,
}
H200 = {  # GPT-2 small's shape on the whole standard library
    "data.source": "stdlib",
    "data.max_bytes": None,
    "data.vocab_size": 8192,
    "train.batch_size": 16,
    "train.seq_len": 512,
    "train.eval_every": 250,
    "train.eval_batches": 0,
    "train.log_every": 100,
    "train.sample_tokens": 0,
    "train.device": "cuda",
    "train.precision": "bf16",
    # named, not "auto": "auto" times the backends in each run, and two runs whose timings land
    # near a tie choose differently and so train with different numerics
    "train.sdpa_backend": "flash",
    "optim.warmup_steps": 100,
    "checkpoint.every": 500,
    "checkpoint.keep_last": 1,
}


def final_val_loss(run_dir: Path) -> float:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [r for r in records if r["kind"] == "val"][-1]["val_loss"]


def train(flat: dict[str, object], run_dir: Path) -> float:
    run_dir.mkdir(parents=True)
    with build_trainer(build_config(flat), run_dir) as trainer:
        trainer.train()
    return final_val_loss(run_dir)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed x 100 steps per family")
    parser.add_argument("--h200", action="store_true", help="124m-dense, 2,000 steps, CUDA bf16")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--seeds", default=None, help="comma list (default 1,2,3; --quick: 1)")
    parser.add_argument("--steps", type=int, default=None, help="default 300 (--quick 100)")
    parser.add_argument("--set", action="append", default=[], metavar="key=value")
    parser.add_argument("--keep-runs", type=Path, help="keep run dirs here (default: a tmp dir)")
    parser.add_argument(
        "--control", action="store_true", help="also a second `off` run: the run-to-run spread"
    )
    parser.add_argument(
        "--deterministic", action="store_true", help="deterministic algorithms in every run"
    )
    args = parser.parse_args()
    if args.deterministic:  # before the first CUDA call: cuBLAS reads its workspace setting once
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
    if args.h200:
        sizes, base, steps, seeds = ["124m-dense"], H200, 2000, [1]
    else:
        sizes = [f"tiny-{f}" for f in args.families.split(",")]
        base, steps = CPU, 100 if args.quick else 300
        seeds = [1] if args.quick else [1, 2, 3]
    steps = args.steps or steps
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else seeds
    user = dict(parse_override(item) for item in args.set)
    misses = []
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep_runs or Path(tmp)
        for preset in sizes:
            for seed in seeds:
                flat = {**base, "model.preset": preset, "train.steps": steps, "train.seed": seed}
                losses = {}
                for mode in ("off", "act", *(["off2"] if args.control else [])):
                    flat_mode = {**flat, **user, "orchestrator.mode": mode.rstrip("2")}
                    losses[mode] = train(flat_mode, root / f"{preset}-s{seed}-{mode}")
                decisions = read_decisions(root / f"{preset}-s{seed}-act")
                delta = losses["act"] / losses["off"] - 1.0
                ok = delta <= GOAL
                if not ok:
                    misses.append(f"{preset} seed {seed}")
                row = {
                    "name": f"orchestrator_{preset}_s{seed}",
                    "steps": steps,
                    "val_off": round(losses["off"], 5),
                    "val_act": round(losses["act"], 5),
                    "act_vs_off": round(delta, 5),
                    **(
                        {"off_vs_off": round(losses["off2"] / losses["off"] - 1.0, 5)}
                        if args.control
                        else {}
                    ),
                    "within_goal": ok,
                    "applied": [
                        f"{d['kind']}@{d['step']}: {d['reason']}" for d in decisions if d["applied"]
                    ],
                    "advised": [f"{d['kind']}@{d['step']}" for d in decisions if not d["applied"]],
                    "hardware": f"{platform.processor() or 'cpu'}; torch {torch.__version__}",
                }
                print(json.dumps(row), flush=True)
    n = len(sizes) * len(seeds)
    print(
        f"{n - len(misses)} of {n} within {GOAL:.1%} of off"
        + (f"; missed: {', '.join(misses)}" if misses else "")
    )
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
