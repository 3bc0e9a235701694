"""OOM recovery on one CUDA GPU: a micro-batch too large for the device raises a real CUDA
out-of-memory error inside the training step; the orchestrator (kind `oom`) halves the micro-batch,
doubles accumulation and retries the same batch until it fits, and training continues with the
global batch unchanged.

The model is the 124m-moe preset (vocab 50304, 12 layers, 8 experts top-2) on byte-level shards of
the Python standard library's own sources, bf16, seq_len 1024, one micro-batch of the whole global
batch to start with: far beyond 139 GiB. Prints JSON lines: one per orchestrator decision, one per
step, then {"name", "ours", "baseline", "ratio", "hardware", ...} (ours = global batch trained,
baseline = global batch asked for; ratio 1.0 = same global batch).

Run on the GPU:   PYTHONPATH=$(ls -d packages/*/src | paste -sd:) python3 benchmarks/oom_recovery.py
Smoke on CPU (tiny model; the OOM is injected with faults.oom_at_step, no real allocation):
                  uv run --no-sync python benchmarks/oom_recovery.py --smoke
"""

import argparse
import json
import platform
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from ats_data.shards import ShardWriter, make_index, write_index
from ats_tokenizer import Tokenizer
from ats_tokenizer.pretokenize import GPT4_PATTERN
from ats_train.build import build_trainer
from ats_train.config import build_config
from ats_train.orchestrator.decisions import read_decisions


def prepare(out: Path, max_bytes: int) -> Path:
    """Byte-level shards (vocab 256 + EOS) of stdlib sources: 90% train, 10% val."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(stdlib.rglob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    data = np.frombuffer(b"".join(chunks), dtype=np.uint8).astype(np.uint16)
    n_train = int(0.9 * len(data))
    tokenizer = Tokenizer(list(range(256)), [], {"<|endoftext|>": 256}, GPT4_PATTERN)
    out.mkdir(parents=True)
    tokenizer.save(out / "tokenizer.json")
    shards = {}
    for split, tokens in (("train", data[:n_train]), ("val", data[n_train:])):
        writer = ShardWriter(out, split, "uint16", max_shard_tokens=1 << 30)
        writer.add(np.append(tokens, np.uint16(tokenizer.eos_id)))
        shards[split] = writer.close()
    write_index(
        out,
        make_index(
            tokenizer_sha256=tokenizer.sha256(),
            vocab_size=tokenizer.vocab_size,
            eos_id=tokenizer.eos_id,
            dtype_name="uint16",
            shards=shards,
            source=str(stdlib),
            cache_key="oom-recovery-stdlib-bytes",
            config={},
            stats={},
        ),
    )
    return out


def settings(args: argparse.Namespace, data_dir: Path) -> dict[str, object]:
    flat: dict[str, object] = {
        "data.source": str(data_dir),
        "train.steps": args.steps,
        "train.batch_size": args.batch_size,  # micro_batch_size unset: one micro-batch of all of it
        "train.eval_batches": 1,
        "train.eval_every": 0,
        "train.log_every": 1,
        "train.sample_tokens": 0,
        "optim.warmup_steps": 1,
        "checkpoint.every": 0,
        "orchestrator.mode": "act",
        "orchestrator.every": 1000,  # only the per-step guards (oom, skip, rollback) act here
    }
    if args.smoke:
        flat.update(
            {
                "model.preset": "tiny-moe",
                "train.seq_len": 32,
                "train.device": "cpu",
                "kernels": "reference",
                "faults.oom_at_step": 2,
                "faults.oom_max_micro_batch": 2,
            }
        )
    else:
        flat.update(
            {
                "model.preset": "124m-moe",
                "model.vocab_size": 50304,
                "train.seq_len": 1024,
                "train.device": "cuda",
                "train.precision": "bf16",
            }
        )
    return flat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=512, help="global sequences per step")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.batch_size = 8
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = prepare(Path(tmp) / "data", 200_000 if args.smoke else 40_000_000)
        run_dir = Path(tmp) / "run"
        run_dir.mkdir()
        with build_trainer(build_config(settings(args, data_dir)), run_dir) as trainer:
            asked = trainer.config.train.batch_size
            seen = 0
            start = time.perf_counter()
            while trainer.step < args.steps:
                record = trainer.train_step()
                for decision in read_decisions(run_dir)[seen:]:
                    print(
                        json.dumps(
                            {
                                "event": "decision",
                                **{
                                    k: decision[k]
                                    for k in ("step", "kind", "reason", "change", "applied")
                                },
                            }
                        ),
                        flush=True,
                    )
                seen = len(read_decisions(run_dir))
                print(
                    json.dumps(
                        {
                            "event": "step",
                            "step": record["step"],
                            "loss": round(record["loss"], 4),
                            "batch_size": trainer.config.train.batch_size,
                            "micro_batch_size": trainer.batch.micro_batch,
                            "tokens_this_step": trainer.config.train.batch_size
                            * trainer.config.train.seq_len,
                            "peak_memory_gb": round(record.get("memory_gb") or 0.0, 2),
                        }
                    ),
                    flush=True,
                )
        decisions = read_decisions(run_dir)
        trained = trainer.config.train.batch_size
        device = trainer.backend.device
        hardware = (
            torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
        )
        print(
            json.dumps(
                {
                    "name": "oom_recovery_global_batch",
                    "ours": trained,
                    "baseline": asked,
                    "ratio": trained / asked,
                    "hardware": f"{hardware or 'cpu'}; torch {torch.__version__}",
                    "recovered": bool(decisions)
                    and all(d["kind"] == "oom" and d["applied"] for d in decisions),
                    "ooms": len(decisions),
                    "micro_batch": [asked, trainer.batch.micro_batch],
                    "steps": trainer.step,
                    "final_loss_finite": bool(np.isfinite(record["loss"])),
                    "wall_s": round(time.perf_counter() - start, 1),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
