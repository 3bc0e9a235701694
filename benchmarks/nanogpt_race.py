"""nanoGPT side by side (issue #30): GPT-2 124M as nanoGPT trains it against ATS dense (equal
parameters), ATS MoE (equal active parameters, 8 experts, top 2) and the ATS MoE+MoD hybrid, each
for the same wall-clock budget (model build and torch.compile included), on the same token files,
evaluated on the same held-out tokens.

nanoGPT's model.py is vendored unchanged in benchmarks/nanogpt/ (MIT, its LICENSE beside it). Its
train.py is a configurator-driven script, so its loop is reimplemented below in ~30 lines: bf16
autocast, torch.compile of the whole model, its configure_optimizers (fused AdamW, decay on 2-D
tensors), clip 1.0. Every contender gets the same batches (ats_data TokenLoader, one seed), the
same AdamW hyper-parameters and the same wall-clock schedule: linear warmup over --warmup steps,
then cosine to lr/10 over the fraction of the budget spent (a step count is unknown in advance).
The clock stops during evaluations: each evaluates the same first --eval-tokens of the val split
(held-out files of the corpus) every budget/--evals seconds and at the end.

Data: --data DIR (a folder prepared by `ats-data prepare`) or --source SPEC --tokenizer JSON
(prepared here with every CPU into --data DIR if given, for the other benchmarks to reuse; --max-mb
cuts a raw source to its first whole files).
--make-tokenizer OUT trains the 32k BPE on the first --tokenizer-mb of --source and exits (ATS's
native trainer takes seconds; the pure-Python one on a GPU host without ats_native takes long).

GPU:  python3 benchmarks/nanogpt_race.py --source pyenv --tokenizer tok.json --budget 300
CPU smoke (tiny models, seconds): uv run python benchmarks/nanogpt_race.py --smoke --out r.json
Prints one JSON line per contender, a table, and writes all of it to --out.
"""

import argparse
import contextlib
import hashlib
import importlib.util
import json
import math
import os
import tempfile
import time
from pathlib import Path

import torch
from ats_data import ShardDataset, prepare
from ats_data.loader import TokenLoader, split_windows
from ats_model import count_params
from ats_tokenizer import Tokenizer
from ats_train.build import build_trainer
from ats_train.config import build_config, parse_override
from ats_train.data import sliced_source

HERE = Path(__file__).resolve().parent
CONTENDERS = ("nanogpt", "ats_dense", "ats_moe", "ats_hybrid")
ATS_FAMILY = {"ats_dense": "dense", "ats_moe": "moe", "ats_hybrid": "hybrid"}
GPT2_124M = {"n_layer": 12, "n_head": 12, "n_embd": 768}
SMOKE_GPT = {"n_layer": 2, "n_head": 4, "n_embd": 64}


def load_nanogpt():
    spec = importlib.util.spec_from_file_location("nanogpt_model", HERE / "nanogpt" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class WallClock:
    """Seconds of training time: starts at creation, stops while paused (evaluations)."""

    def __init__(self) -> None:
        self.start, self.paused = time.perf_counter(), 0.0

    def __call__(self) -> float:
        return time.perf_counter() - self.start - self.paused

    @contextlib.contextmanager
    def pause(self):
        t0 = time.perf_counter()
        yield
        self.paused += time.perf_counter() - t0


class TimeCosine:
    """Warmup by steps, then cosine from lr to min_lr over the fraction of the budget spent."""

    name = "time-cosine"

    def __init__(self, lr: float, warmup: int, budget: float, clock: WallClock) -> None:
        self.lr, self.min_lr, self.warmup, self.budget, self.clock = (
            lr,
            lr / 10,
            warmup,
            budget,
            clock,
        )

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        frac = min(self.clock() / self.budget, 1.0)
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1 + math.cos(math.pi * frac))


def eval_windows(dataset: ShardDataset, seq_len: int, tokens: int) -> list:
    """The first `tokens` of the val split as packed (x, y) windows, batches of 16."""
    batches, n = [], 0
    for x, y in split_windows(dataset, "val", seq_len, 16):
        batches.append((x, y))
        n += x.numel()
        if n >= tokens:
            break
    if not batches:
        raise SystemExit(f"nanogpt_race: the val split has no window of {seq_len + 1} tokens")
    return batches


@torch.no_grad()
def evaluate(loss_fn, batches: list, device: torch.device) -> float:
    total, count = 0.0, 0
    for x, y in batches:
        loss = loss_fn(x.to(device), y.to(device))
        total += float(loss) * y.numel()
        count += y.numel()
    return total / count


def fresh_compile_cache() -> None:
    """Before each model of a benchmark that trains several in one process. Dynamo keeps one cache
    per code object (Block.forward, RMSNorm.forward, ...), shared by every model in the process
    and capped at recompile_limit (8) entries, past which the blocks run eager without an error
    (a model's blocks take 4: 2 grad modes x first block or not). Each model compiles from an
    empty cache, and reaching the cap fails the run instead of timing eager blocks."""
    torch._dynamo.reset()
    torch._dynamo.config.fail_on_recompile_limit_hit = True


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def race(name: str, train_step, loss_fn, args, batches, device, clock: WallClock) -> dict:
    """Steps until the budget is spent (at least --min-steps), evaluating every budget /
    args.evals seconds."""
    curve, step, next_eval = [], 0, args.budget / args.evals
    while clock() < args.budget or step < args.min_steps:
        train_step(step)
        step += 1
        if clock() >= next_eval or clock() >= args.budget:
            sync(device)
            with clock.pause():
                curve.append(
                    (round(clock(), 2), step, round(evaluate(loss_fn, batches, device), 4))
                )
            next_eval += args.budget / args.evals
    sync(device)
    if not curve or curve[-1][1] != step:
        with clock.pause():
            curve.append((round(clock(), 2), step, round(evaluate(loss_fn, batches, device), 4)))
    return {"name": name, "steps": step, "train_s": round(clock(), 2), "final_val_loss": curve[-1][2],
            "tokens_per_s": round(step * args.batch * args.seq_len / clock(), 1), "curve": curve}  # fmt: skip


def run_nanogpt(args, dataset: ShardDataset, vocab: int, batches, device) -> dict:
    nanogpt = load_nanogpt()
    clock = WallClock()
    torch.manual_seed(args.seed)
    shape = SMOKE_GPT if args.smoke else GPT2_124M
    cfg = nanogpt.GPTConfig(
        block_size=args.seq_len, vocab_size=vocab, dropout=0.0, bias=False, **shape
    )
    model = nanogpt.GPT(cfg).to(device)
    optimizer = model.configure_optimizers(0.1, args.lr, (0.9, 0.95), device.type)
    compiled = torch.compile(model) if args.compile else model
    loader = TokenLoader(dataset, "train", args.batch, args.seq_len, seed=args.seed)
    schedule = TimeCosine(args.lr, args.warmup, args.budget, clock)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)

    def train_step(step: int) -> None:
        for group in optimizer.param_groups:
            group["lr"] = schedule(step)
        x, y = (t.to(device, non_blocking=True) for t in next(loader))
        with autocast:
            _, loss = compiled(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def loss_fn(x, y):
        with autocast:
            return compiled(x, y)[1]

    result = race("nanogpt", train_step, loss_fn, args, batches, device, clock)
    params = sum(p.numel() for p in model.parameters())
    return {**result, "params": params, "active_params": params,
            "model": f"nanoGPT GPT {shape}, vocab {vocab}, GELU MLP, LayerNorm, learned positions"}  # fmt: skip


def run_ats(name: str, args, data_dir: Path, batches, device, run_dir: Path) -> dict:
    clock = WallClock()
    preset = f"{'tiny' if args.smoke else '124m'}-{ATS_FAMILY[name]}"
    flat = {
        "data.source": str(data_dir), "model.preset": preset, "train.device": device.type,
        "train.steps": 10**9, "train.batch_size": args.batch, "train.seq_len": args.seq_len,
        "train.seed": args.seed, "train.precision": "bf16", "train.compile": args.compile,
        "train.overlap_host": True, "orchestrator.mode": "off", "train.eval_every": 0,
        "train.log_every": 100, "checkpoint.every": 0, "optim.lr": args.lr,
        "optim.min_lr": args.lr / 10, "optim.betas": [0.9, 0.95], "optim.weight_decay": 0.1,
        "optim.grad_clip": 1.0, "kernels": "auto",
        **dict(parse_override(text) for text in args.set),
    }  # fmt: skip
    run_dir.mkdir(parents=True)
    with build_trainer(build_config(flat), run_dir) as trainer:
        trainer.schedule = TimeCosine(args.lr, args.warmup, args.budget, clock)
        model = trainer.raw_model

        def loss_fn(x, y):
            with trainer.forward_context():
                return model(x, targets=y).loss

        result = race(
            name, lambda step: trainer.train_step(), loss_fn, args, batches, device, clock
        )
        trainer.flush()
        total, active = count_params(model.config)
    return {**result, "params": total, "active_params": active, "model": preset}


def prepared_data(args, work: Path) -> Path:
    """--data as is when it holds a prepared corpus and no --tokenizer is given; else --source
    prepared with --tokenizer into --data (kept for the other benchmarks) or a temporary folder.
    prepare() reuses a folder that already holds the same source and tokenizer's shards."""
    if args.data is not None and args.tokenizer is None:
        return args.data
    if args.tokenizer is None:
        raise SystemExit("nanogpt_race: --source needs --tokenizer (or pass a prepared --data)")
    source, note = sliced_source(args.source, int(args.max_mb * 1e6) if args.max_mb else None)
    print(f"corpus {note}", flush=True)
    t0 = time.perf_counter()
    out = prepare(source, args.tokenizer, args.data or work / "data", workers=os.cpu_count() or 1)
    print(f"prepared in {time.perf_counter() - t0:.1f} s", flush=True)
    return out


def smoke_data(work: Path) -> Path:
    source, _ = sliced_source("stdlib:email", None)
    tok = work / "tokenizer.json"
    Tokenizer.train(iter(source), 512).save(tok)
    return prepare(source, tok, work / "data", val_fraction=0.2, workers=1)


def summary(results: list[dict]) -> dict:
    """The issue's goals, read off the curves."""
    by = {r["name"]: r for r in results}
    out = {}
    if "nanogpt" in by and "ats_dense" in by:
        target = by["nanogpt"]["final_val_loss"]
        reached = [t for t, _, loss in by["ats_dense"]["curve"] if loss <= target]
        out["ats_dense_time_to_nanogpt_final_s"] = reached[0] if reached else None
        out["nanogpt_train_s"] = by["nanogpt"]["train_s"]
    if "ats_moe" in by and "ats_dense" in by:
        out["moe_minus_dense_nats"] = round(
            by["ats_moe"]["final_val_loss"] - by["ats_dense"]["final_val_loss"], 4
        )
    if "ats_hybrid" in by and "ats_dense" in by:
        out["hybrid_minus_dense_nats"] = round(
            by["ats_hybrid"]["final_val_loss"] - by["ats_dense"]["final_val_loss"], 4
        )
    return out  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=None, help="a prepared folder (module doc)")
    p.add_argument("--source", default="pyenv", help="a source spec to prepare (with --tokenizer)")
    p.add_argument("--tokenizer", type=Path, default=None)
    p.add_argument("--max-mb", type=float, default=None, help="cut --source to its first N MB")
    p.add_argument("--make-tokenizer", type=Path, default=None, help="train the BPE here, exit")
    p.add_argument("--vocab", type=int, default=32768, help="--make-tokenizer's vocabulary")
    p.add_argument("--tokenizer-mb", type=float, default=64.0, help="--make-tokenizer's text")
    p.add_argument("--contenders", default=",".join(CONTENDERS), help="comma list, or none")
    p.add_argument("--budget", type=float, default=300.0, help="seconds per contender, compile in")
    p.add_argument("--evals", type=int, default=10, help="evaluations per contender")
    p.add_argument("--eval-tokens", type=int, default=262144)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--lr", type=float, default=1.5e-3)
    p.add_argument("--warmup", type=int, default=100, help="linear warmup steps")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--min-steps", type=int, default=1, help="steps run even past the budget")
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--set", action="append", default=[], help="ATS config override KEY=VALUE")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny models, seconds")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args()
    if args.make_tokenizer is not None:
        source, note = sliced_source(args.source, int(args.tokenizer_mb * 1e6))
        Tokenizer.train(iter(source), args.vocab).save(args.make_tokenizer)
        print(f"tokenizer {args.make_tokenizer}: vocab {args.vocab}, trained on {note}")
        return
    if args.smoke:
        args.budget, args.evals, args.eval_tokens = min(args.budget, 3.0), 2, 2048
        args.batch, args.seq_len, args.warmup, args.compile = 4, 32, 5, False
        args.min_steps = 3
    names = [n for n in args.contenders.split(",") if n and n != "none"]
    if unknown := set(names) - set(CONTENDERS):
        raise SystemExit(f"nanogpt_race: unknown contenders {sorted(unknown)} (of {CONTENDERS})")
    device = torch.device("cpu" if args.smoke else "cuda")
    if names and device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("nanogpt_race: no CUDA device (use --smoke for a CPU run)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data_dir = smoke_data(work) if args.smoke else prepared_data(args, work)
        dataset = ShardDataset(data_dir)
        batches = eval_windows(dataset, args.seq_len, args.eval_tokens)
        digest = hashlib.sha256(b"".join(x.numpy().tobytes() for x, _ in batches)).hexdigest()
        results = []
        for name in names:
            fresh_compile_cache()
            if name == "nanogpt":
                # the tokenizer's vocabulary, as the ATS models get it (build_model_config)
                row = run_nanogpt(args, dataset, dataset.vocab_size, batches, device)
            else:
                row = run_ats(name, args, data_dir, batches, device, work / f"run-{name}")
            row.update(eval_tokens=sum(y.numel() for _, y in batches), eval_sha256=digest,
                       budget_s=args.budget, batch=args.batch, seq_len=args.seq_len)  # fmt: skip
            print(json.dumps(row), flush=True)
            results.append(row)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        report = {"results": results, "summary": summary(results),
                  "corpus": dataset.index.get("source"),
                  "train_tokens": dataset.num_tokens("train"), "val_tokens": dataset.num_tokens("val"),
                  "hardware": torch.cuda.get_device_name() if names and device.type == "cuda" else "cpu",
                  "torch": torch.__version__}  # fmt: skip
    print(
        f"{'contender':12s} {'params':>12s} {'active':>12s} {'steps':>7s} {'tok/s':>10s} {'val loss':>9s}"
    )
    for r in results:
        print(f"{r['name']:12s} {r['params']:12,d} {r['active_params']:12,d} {r['steps']:7d} "
              f"{r['tokens_per_s']:10,.0f} {r['final_val_loss']:9.4f}")  # fmt: skip
    print(json.dumps(report["summary"]))
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
