"""LoRA against full fine-tuning at the same steps: trainable parameters, the bytes of gradients and
AdamW state they need, speed and loss, on one ats-train config run twice (train.trainable = all,
then lora). Both start from the same seeded weights and see the same batches.

Memory is counted from the tensors themselves (gradient + optimizer state bytes after the run), not
from the process RSS, which a shared CPU machine makes noisy; on CUDA the peak allocated memory is
printed too. Speed is the median tokens/s of the logged steps.

Prints, after the runs' console output, one JSON line per mode: {"mode", "trainable", "params", "grad_mb", "optim_mb", "peak_mb",
"tokens_per_s", "train_loss", "val_loss"}.
Both runs start from the same random init (the base is not pretrained here): the numbers compare
the training mechanisms, not how well either adapts a trained model.
Run: uv run --no-sync python benchmarks/lora.py [--steps 40] [--preset tiny-moe] [--device cpu]
     [--lora] (the LoRA mode only) [key=value ...] (more ats-train overrides)
"""

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch
from ats_train.build import build_trainer
from ats_train.config import load_config

LORA = ["lora.rank=8", "lora.alpha=16", 'lora.targets=["wq","wk","wv","wo","w1","w3","w2"]']


def run(mode: str, args: argparse.Namespace, root: Path) -> dict:
    overrides = [
        f"model.preset={args.preset}",
        f"train.steps={args.steps}",
        f"train.batch_size={args.batch_size}",
        f"train.seq_len={args.seq_len}",
        f"train.eval_every={args.steps}",
        "train.log_every=1",
        "train.sample_tokens=0",
        f"train.device={args.device}",
        "checkpoint.every=0",
        f"train.trainable={mode}",
        *(LORA if mode == "lora" else []),
        *args.overrides,
    ]
    config = load_config(None, overrides)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    run_dir = root / mode
    run_dir.mkdir()
    with build_trainer(config, run_dir) as trainer:
        trainer.train()
        params = list(trainer.raw_model.parameters())
        trainable = [p for p in params if p.requires_grad]
        optim_bytes = sum(
            t.numel() * t.element_size()
            for state in trainer.optimizer.state.values()
            for t in state.values()
            if torch.is_tensor(t) and t.dim() > 0
        )
    trainer.backend.close()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    val = [r for r in records if r["kind"] == "val"]
    return {
        "mode": mode,
        "trainable": sum(p.numel() for p in trainable),
        "params": sum(p.numel() for p in params),
        "grad_mb": sum(p.numel() * p.element_size() for p in trainable) / 2**20,
        "optim_mb": optim_bytes / 2**20,
        "peak_mb": torch.cuda.max_memory_allocated() / 2**20 if args.device == "cuda" else None,
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in train[1:]),
        "train_loss": statistics.mean(r["loss"] for r in train[-10:]),
        "val_loss": val[-1]["val_loss"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--preset", default="tiny-moe")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--lora", action="store_true", help="run the LoRA mode only")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = [
            run(mode, args, Path(tmp)) for mode in (["lora"] if args.lora else ["all", "lora"])
        ]
    # after the runs' own console output: the result lines are the ones starting with "{"
    for result in results:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
