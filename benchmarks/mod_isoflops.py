"""Mixture-of-Depths at iso-FLOPs (issue #30; Raposo et al. 2024, arXiv:2404.02258): the preset's MoD
variant (12.5% capacity on every other block, learned router, causal predictor) against its dense
model at equal training FLOPs. Dense trains --dense-steps steps; MoD trains as many steps as the
same FLOPs buy it (ats_model.flops_per_token counts a routed block at its capacity), each with its
own cosine schedule, the same batch and seed. Measured: steps/s after the compile steps, the
wall time of training (compile included), and the val loss on the same held-out windows at the
end, computed eager. Each row says where its time went (phases_s: build, the first --warmup steps
with the compile, the timed steps, the evaluations). The budget is stated in the report
(train_flops: dense's --dense-steps x batch x seq_len x its FLOPs per token). Each leg compiles
from an empty dynamo cache (nanogpt_race.fresh_compile_cache). The goal is MoD >= 1.3x dense
steps/s at a val-loss gap <= 2%.

MoD is evaluated twice: with top-k routing over the sequence (as in training; it reads future
tokens' router scores, so it cannot sample) and with causal routing (each token decides by its
causal predictor, what autoregressive sampling with a KV cache does): the second number is the
sampling path's quality.

GPU: python3 benchmarks/mod_isoflops.py --data DIR [--size 124m] [--dense-steps 2000] [--out J]
CPU smoke: uv run python benchmarks/mod_isoflops.py --smoke
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from ats_data import ShardDataset
from ats_model import flops_per_token
from ats_train.build import build_trainer
from ats_train.config import ModelSection, build_config, parse_override
from ats_train.model_config import build_model_config
from nanogpt_race import eval_windows, evaluate, fresh_compile_cache, smoke_data, sync


def run(preset: str, steps: int, args, data_dir: Path, batches, work: Path) -> dict:
    flat = {
        "data.source": str(data_dir), "model.preset": preset, "train.device": args.device,
        "train.steps": steps, "train.batch_size": args.batch, "train.seq_len": args.seq_len,
        "train.precision": "bf16", "train.compile": args.compile, "train.seed": 1337,
        "train.eval_every": 0, "train.log_every": 100, "checkpoint.every": 0,
        "train.overlap_host": True, "orchestrator.mode": "off", "optim.lr": args.lr,
        "optim.min_lr": args.lr / 10, "optim.warmup_steps": min(100, steps // 10),
        "kernels": "auto", **dict(parse_override(text) for text in args.set),
    }  # fmt: skip
    device = torch.device(args.device)
    run_dir = work / f"run-{preset}"
    run_dir.mkdir(parents=True)
    fresh_compile_cache()  # dense and MoD share RMSNorm / Attention / SwiGLU code objects
    t_start = time.perf_counter()
    with build_trainer(build_config(flat), run_dir) as trainer:
        t_built = time.perf_counter()
        for step in range(steps):
            if step == args.warmup:
                sync(device)
                t0 = time.perf_counter()
            trainer.train_step()
        trainer.flush()
        sync(device)
        t_end = time.perf_counter()
        model = trainer.raw_model

        def loss_fn(causal: bool):
            def fn(x, y):
                # eager: a no_grad compile of the blocks (and, with causal routing, of every
                # data-dependent subset size) would cost more than the few forwards it speeds up
                with trainer.forward_context(), torch.compiler.set_stance("force_eager"):
                    return model(x, targets=y, causal_routing=causal).loss

            return fn

        row = {"name": preset, "steps": steps,
               "steps_per_s": round((steps - args.warmup) / (t_end - t0), 3),
               "train_wall_s": round(t_end - t_built, 3),
               "val_loss": round(evaluate(loss_fn(False), batches, device), 4)}  # fmt: skip
        if model.config.mod is not None:
            row["val_loss_causal_routing"] = round(evaluate(loss_fn(True), batches, device), 4)
        t_eval = time.perf_counter()
    # where the leg's time went: build (model, data, attention choice), the first --warmup steps
    # (compile), the timed steps, the evaluations
    row["phases_s"] = {"build": round(t_built - t_start, 3),
                       "warmup_compile": round(t0 - t_built, 3),
                       "timed_steps": round(t_end - t0, 3),
                       "eval": round(t_eval - t_end, 3)}  # fmt: skip
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=None, help="a folder prepared by ats-data")
    p.add_argument("--size", default="124m", help="preset size: SIZE-dense vs SIZE-mod")
    p.add_argument("--dense-steps", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=10, help="untimed steps (compile)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--lr", type=float, default=1.5e-3)
    p.add_argument("--eval-tokens", type=int, default=262144)
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--set", action="append", default=[], help="config override KEY=VALUE")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny models, a few steps")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    args.device = "cpu" if args.smoke else "cuda"
    if args.smoke:
        args.size, args.dense_steps, args.warmup, args.batch, args.seq_len = "tiny", 4, 1, 4, 32
        args.eval_tokens, args.compile = 1024, False
    elif not torch.cuda.is_available():
        raise SystemExit("benchmarks/mod_isoflops.py: no CUDA device (use --smoke for a CPU run)")
    if not args.smoke and args.data is None:
        raise SystemExit("benchmarks/mod_isoflops.py: --data DIR (a prepared corpus) is required")
    if args.warmup >= args.dense_steps:
        raise SystemExit("benchmarks/mod_isoflops.py: --warmup must be < --dense-steps")
    dense, mod = f"{args.size}-dense", f"{args.size}-mod"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data_dir = smoke_data(work) if args.smoke else args.data
        dataset = ShardDataset(data_dir)
        fpt = {
            name: flops_per_token(
                build_model_config(ModelSection(preset=name), dataset.vocab_size, args.seq_len),
                args.seq_len,
            )
            for name in (dense, mod)
        }
        # equal training FLOPs: the MoD model's steps buy what dense's --dense-steps buy
        mod_steps = round(args.dense_steps * fpt[dense] / fpt[mod])
        batches = eval_windows(dataset, args.seq_len, args.eval_tokens)
        rows = []
        for name, steps in ((dense, args.dense_steps), (mod, mod_steps)):
            row = run(name, steps, args, data_dir, batches, work)
            row["flops_per_token"] = fpt[name]
            row["train_flops"] = fpt[name] * steps * args.batch * args.seq_len
            print(json.dumps(row), flush=True)
            rows.append(row)
    d, m = rows
    summary = {
        "mod_steps_per_s_ratio": round(m["steps_per_s"] / d["steps_per_s"], 3),
        "mod_train_wall_ratio": round(m["train_wall_s"] / d["train_wall_s"], 3),
        "val_gap_topk": round(m["val_loss"] / d["val_loss"] - 1, 4),
        "val_gap_causal_routing": round(m["val_loss_causal_routing"] / d["val_loss"] - 1, 4),
    }
    print(json.dumps(summary), flush=True)
    hardware = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    report = {"rows": rows, "summary": summary, "train_flops_budget": d["train_flops"],
              "hardware": hardware, "torch": torch.__version__}  # fmt: skip
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
