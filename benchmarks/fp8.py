"""FP8 training (issue #30): a ~1B dense model (preset 1b-dense, Llama-3.2-1B's shape) in bf16 and
in float8 (train.precision = fp8, torchao's tensorwise and rowwise recipes), the same batches and
seed: tokens/s after the compile steps, and the training-loss curve over --steps steps. The goal
is fp8 >= 1.3x bf16 tokens/s with the loss within 1% of bf16's after >= 1000 steps; the number
compared is the mean training loss of the last 10% of steps and the val loss on the same held-out
windows at the end (computed eager). Each model compiles from an empty dynamo cache and a hit of
the recompile limit fails the run (nanogpt_race.fresh_compile_cache): a row never times blocks
that fell back to eager.

--moe-preset PRESET adds rows for an MoE model (bf16 vs fp8): under fp8 its attention runs in
float8 and its experts stay bf16 (ats_train/fp8.py says why: torchao's float8 grouped GEMM hooks
torch._grouped_mm, which ATS's own grouped GEMM never calls).

GPU: python3 benchmarks/fp8.py --data DIR [--steps 1000] [--out fp8.json]
     (DIR: a folder prepared by ats-data, e.g. by benchmarks/nanogpt_race.py --data DIR --source
     pyenv --tokenizer T; torchao on the path)
CPU smoke: uv run python benchmarks/fp8.py --smoke (bf16 runs; each fp8 row records the error
     that fp8 raises off FP8 GPUs)
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from ats_data import ShardDataset
from ats_model import count_params
from ats_train.build import build_trainer
from ats_train.config import build_config, parse_override
from nanogpt_race import eval_windows, evaluate, fresh_compile_cache, smoke_data, sync


def run(
    name: str, preset: str, precision: str, recipe: str, args, data_dir: Path, batches, work: Path
) -> dict:
    flat = {
        "data.source": str(data_dir), "model.preset": preset, "train.device": args.device,
        "train.steps": args.steps, "train.batch_size": args.batch, "train.seq_len": args.seq_len,
        "train.precision": precision, "train.fp8_recipe": recipe, "train.compile": args.compile,
        "train.seed": 1337, "train.eval_every": 0, "train.log_every": 50, "checkpoint.every": 0,
        "orchestrator.mode": "off", "optim.lr": args.lr, "optim.min_lr": args.lr / 10,
        "optim.warmup_steps": min(100, args.steps // 10), "kernels": "auto",
        **dict(parse_override(text) for text in args.set),
    }  # fmt: skip
    row = {"name": name, "preset": preset, "precision": precision,
           "fp8_recipe": recipe if precision == "fp8" else None}  # fmt: skip
    run_dir = work / f"run-{name}"
    run_dir.mkdir(parents=True)
    device = torch.device(args.device)
    fresh_compile_cache()  # the bf16, tensorwise and rowwise models share Block.forward's cache
    try:
        trainer_cm = build_trainer(build_config(flat), run_dir)
    except ValueError as e:  # fp8 off an FP8 GPU (the CPU smoke): the error is the row's result
        if precision != "fp8" or device.type == "cuda":
            raise
        return {**row, "error": str(e)}
    losses = []
    with trainer_cm as trainer:
        t_start = time.perf_counter()
        for step in range(args.steps):
            if step == args.warmup:
                sync(device)
                t0 = time.perf_counter()
            losses.append(float(trainer.train_step()["loss"]))
        sync(device)
        timed = args.steps - args.warmup
        elapsed = time.perf_counter() - t0
        model = trainer.raw_model

        def loss_fn(x, y):
            # eager: the val loss does not need a no_grad compile of every block (tens of seconds
            # at 1B for a few forwards)
            with trainer.forward_context(), torch.compiler.set_stance("force_eager"):
                return model(x, targets=y).loss

        val = evaluate(loss_fn, batches, device)
        total, active = count_params(model.config)
    tail = losses[-max(1, len(losses) // 10) :]
    return {**row, "steps": args.steps, "timed_steps": timed,
            "tokens_per_s": round(timed * args.batch * args.seq_len / elapsed, 1),
            "compile_and_warmup_s": round(t0 - t_start, 1),
            "final_train_loss_mean_last10pct": round(sum(tail) / len(tail), 4),
            "val_loss": round(val, 4), "params": total, "active_params": active,
            "loss_curve": [round(x, 4) for x in losses[:: max(1, args.steps // 100)]],
            "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1) if device.type == "cuda" else None}  # fmt: skip


def compare(rows: list[dict]) -> list[dict]:
    """Each fp8 row against the bf16 row of its preset."""
    base = {r["preset"]: r for r in rows if r["precision"] == "bf16" and "error" not in r}
    out = []
    for r in rows:
        b = base.get(r["preset"])
        if r["precision"] != "fp8" or b is None or "error" in r:
            continue
        out.append({"name": f"{r['name']}_vs_bf16", "speedup": round(r["tokens_per_s"] / b["tokens_per_s"], 3),
                    "train_loss_rel_diff": round(r["final_train_loss_mean_last10pct"] / b["final_train_loss_mean_last10pct"] - 1, 4),
                    "val_loss_rel_diff": round(r["val_loss"] / b["val_loss"] - 1, 4)})  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=None, help="a folder prepared by ats-data")
    p.add_argument("--preset", default="1b-dense")
    p.add_argument("--moe-preset", default=None, help="also bf16 vs fp8 rows for this preset")
    p.add_argument("--recipes", default="tensorwise,rowwise")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=10, help="untimed steps (compile)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--eval-tokens", type=int, default=131072)
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--set", action="append", default=[], help="config override KEY=VALUE")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny model, a few steps")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    args.device = "cpu" if args.smoke else "cuda"
    if args.smoke:
        args.preset, args.steps, args.warmup, args.batch, args.seq_len = "tiny-dense", 4, 1, 2, 32
        args.eval_tokens, args.compile = 1024, False
        args.moe_preset = args.moe_preset and "tiny-moe"
    elif not torch.cuda.is_available():
        raise SystemExit("benchmarks/fp8.py: no CUDA device (use --smoke for a CPU run)")
    if not args.smoke and args.data is None:
        raise SystemExit("benchmarks/fp8.py: --data DIR (a prepared corpus) is required")
    if args.warmup >= args.steps:
        raise SystemExit(
            f"benchmarks/fp8.py: --warmup {args.warmup} must be < --steps {args.steps}"
        )
    runs = [(args.preset, "bf16", "tensorwise")]
    runs += [(args.preset, "fp8", r) for r in args.recipes.split(",")]
    if args.moe_preset:
        runs += [(args.moe_preset, "bf16", "tensorwise"), (args.moe_preset, "fp8", "tensorwise")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data_dir = smoke_data(work) if args.smoke else args.data
        batches = eval_windows(ShardDataset(data_dir), args.seq_len, args.eval_tokens)
        for preset, precision, recipe in runs:
            name = f"{preset}_{precision}" + (f"_{recipe}" if precision == "fp8" else "")
            row = run(name, preset, precision, recipe, args, data_dir, batches, work)
            print(json.dumps(row), flush=True)
            rows.append(row)
            if args.device == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
    comparisons = compare(rows)
    for c in comparisons:
        print(json.dumps(c), flush=True)
    hardware = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    report = {"rows": rows, "comparisons": comparisons, "hardware": hardware,
              "torch": torch.__version__, "steps": args.steps}  # fmt: skip
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
