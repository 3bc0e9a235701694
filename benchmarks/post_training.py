"""Post-training demonstration (issue 26): pretrain a small model on generated arithmetic word
problems and bare equations, SFT it into a chat model, then GRPO (exact-match + format rewards)
and, the control, more SFT at GRPO's lr for as many steps, both from GRPO's start: the first SFT
checkpoint whose pass@group on GRPO's own training prompts reaches GRPO_START_PASS (the earliest
policy with a reward to learn from); DPO from the last SFT model; LoRA SFT against full SFT.
Reports held-out exact match after each, the SFT model's pass@group, and DPO's held-out
preference accuracy. Problems of the held-out split use (a, b) pairs that no training document
contains, so the score cannot come from memorised answers. Also measures SFT packing against
padding.

    uv run python benchmarks/post_training.py --scale smoke --work /tmp/post-bench    # CPU, ~minutes
    uv run python benchmarks/post_training.py --device cuda --work /tmp/post-bench    # H200

Writes WORK/report.json and prints it; goals (issue 26): GRPO >= its start + 15 points of exact
match, DPO held-out preference accuracy >= 90%.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import statistics
import sys
import time
import tomllib
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from ats_data.records import Record
from ats_model import generate
from ats_model.adapters.files import ADAPTER_TENSORS
from ats_model.serialization.model_dir import load_pretrained
from ats_tokenizer import Tokenizer
from ats_tokenizer.chat import CHAT_SPECIAL_TOKENS, IM_END, apply_chat_template
from ats_tokenizer.pretokenize import GPT4_PATTERN
from ats_train.cli import main as ats_train
from ats_train.objectives.batching import pack, packed_batch, padded_batch, pair_batch
from ats_train.objectives.dpo import sequence_logps
from ats_train.objectives.examples import dpo_pair, sft_sequence
from ats_train.objectives.logprobs import forward_logprobs
from ats_train.objectives.rewards import exact_match
from ats_train.objectives.sft import SFTObjective
from safetensors import safe_open

sys.path.insert(0, str(Path(__file__).parent))  # benchmarks/lora.py's adapter settings
import lora  # noqa: E402

# the packing measurement packs rows of PACK_ROWS * seq_len tokens (about as many examples each):
# at seq_len one example of ~50 tokens nearly fills a row and packing has nothing to pack
PACK_ROWS = 4
HELDOUT_SHARE = 0.1  # of all (a, b) pairs
# generation budget of an answer: "999+999=8991 reversed. answer: 1998" is 19 digit-split
# tokens, + <|im_end|>
ANSWER_TOKENS = 32
# the LoRA branch's adapter: benchmarks/lora.py's, on every projection
LORA = {"train.trainable": "lora", **dict(kv.split("=", 1) for kv in lora.LORA)}
# Pretraining and SFT peak lrs (decaying to a tenth). At 3e-3 (and SFT at 1e-3) the units digit of
# every answer, the first one written, stayed at chance (1 in 10) and SFT held-out exact match
# near 1/9: benchmarks/units_digit_probe.py shows the same model (and HF's LlamaForCausalLM of its
# shape) learning (a0 + b0) mod 10 at AdamW 3e-4 and not at 3e-3 (1e-3: slowly)
PRETRAIN_LR, PRETRAIN_MIN_LR = 3e-4, 3e-5
SFT_LR, SFT_MIN_LR = 3e-4, 3e-5
# the LoRA SFT's peak lr, 10x the full SFT's: on the cpu scale (2000 pretraining, 200 SFT steps)
# LoRA reached 0.165 held-out exact match at 3e-4, 0.715 at 3e-3 and 0.315 at 1e-2 (full SFT: 1.0)
LORA_LR = 3e-3
# GRPO's lr: constant, and the SFT control's. Most groups score alike, so the gradient is small
# and noisy, and Adam moves every weight by about the lr whatever its gradient's size: at 5e-4 the
# cpu run's sampled exact match fell from 0.117 to 0 in 7 steps; at 5e-5 on the H200 GRPO lost
# 0.4-12 points from SFT models at 0.99-1.0 and its sampled exact match fell from 0.71 to 0.13-0.48
# within 20 steps of an SFT model at 0.85; at 5e-6 an SFT model at 1.0 kept 1.0 (TRL's default: 1e-6).
# From grpo_start (seeds 3-5 on the H200) 5e-6 gained +6.8, +45.4 and +7.6 points in 200 steps
# (seed 5: 0.436 -> 0.512 while the SFT control reached 1.0); 2e-5 gained +20.8, +55.4 and +83.6
GRPO_LR = 2e-5
# DPO's lr, constant: at 2e-4 DPO diverged on the H200 (loss 0.69 -> 0.77-1.11, grad norm up to
# 29.5, both answers' log-likelihood down ~60 nats, exact match 1.0 -> 0); TRL's default is 1e-6
DPO_LR = 1e-5
# GRPO starts from the first SFT checkpoint whose pass@group on the scale's start_prompts of GRPO's
# own training prompts reaches this share: the earliest policy whose groups mostly hold a right answer
# to learn from. The last SFT model (0.996-1.0 held-out exact match after the full scale's 120
# steps on the H200) leaves GRPO nothing to gain.
GRPO_START_PASS = 0.5
NAMES = ["Ada", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana"]
ITEMS = ["apples", "coins", "stamps", "marbles", "books", "shells"]
# GPT-4's pattern with one digit per pre-token (as Llama and DeepSeek split digits). BPE on
# `\p{N}{1,3}` makes a few 3-digit numbers one token and most two ("34" + "5"), and splits a
# 4-digit sum from the left ("102" + "3"): digits of one place value land in different tokens
# and a small model has no consistent units to add in.
DIGIT_PATTERN = GPT4_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")


@dataclass(frozen=True)
class Scale:
    digits: int
    model: dict[str, int]
    seq_len: int
    n_train: int
    n_heldout: int
    n_equations: int  # bare worked equations of training pairs beside the word problems
    pretrain_steps: int
    sft_steps: int
    grpo_steps: int
    dpo_steps: int
    batch: int
    grpo_batch: int
    group: int
    sft_every: int  # SFT checkpoint cadence: the candidates for GRPO's start (grpo_start)
    start_prompts: int  # GRPO training prompts grpo_start samples each candidate on


SMOKE = Scale(2, {"dim": 64, "n_layer": 2, "n_head": 4, "n_kv_head": 2, "ffn_dim": 128}, 96,
              400, 40, 1000, 60, 30, 6, 10, 16, 4, 4, 10, 32)  # fmt: skip
CPU = Scale(2, {"dim": 128, "n_layer": 4, "n_head": 4, "n_kv_head": 2, "ffn_dim": 384}, 128,
            4000, 200, 10000, 800, 200, 40, 60, 32, 16, 8, 25, 256)  # fmt: skip
# FULL's SFT is 120 steps, checkpointed every 2: GRPO starts from the first checkpoint that
# reaches GRPO_START_PASS, so the SFT length only bounds how far it looks. On the H200 seeds reach
# it at steps 20-35; around there pass@8 can climb from 0.45 to 0.98 in 5 steps, so a coarser
# cadence can start GRPO next to the ceiling. A 40-step SFT (its lr decayed by step 40) left one
# seed at pass@8 0.04, with no reward for GRPO to learn from
FULL = Scale(3, {"dim": 384, "n_layer": 6, "n_head": 6, "n_kv_head": 2, "ffn_dim": 1024}, 128,
             20000, 500, 150000, 4000, 120, 200, 200, 128, 32, 8, 2, 256)  # fmt: skip


SCALES = {"smoke": SMOKE, "cpu": CPU, "full": FULL}


def worked(expression: str, result: int) -> str:
    """The answer the model writes: the result's digits least significant first, then the result.
    Left to right, each reversed digit needs only its own column and the carry (or borrow) out of
    the column written just before it, the order in which a small transformer can compute a sum
    (Lee et al. 2023, "Teaching Arithmetic to Small Transformers": reversed outputs learn addition
    from far fewer examples than plain ones). The last number is the true result, which
    exact_match checks, so the worked part cannot be used to game the reward."""
    return f"{expression}={str(result)[::-1]} reversed. answer: {result}"


def problem(rng: random.Random, a: int, b: int) -> tuple[str, str, int]:
    """(question, worked answer, result): an addition or subtraction word problem."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    if rng.random() < 0.5:
        q = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?"
        return q, worked(f"{a}+{b}", a + b), a + b
    a, b = max(a, b), min(a, b)
    q = f"{name} has {a} {item} and gives away {b}. How many {item} are left?"
    return q, worked(f"{a}-{b}", a - b), a - b


def held_out(a: int, b: int) -> bool:
    """The split, by the unordered pair (a + b and b + a, and their subtraction, fall together):
    a hash of it, so that every digit and every digit pair at every position appears in training.
    (A rule on the digits, such as (7a + b) % 10 == 0, would hold out whole units-digit
    combinations and test a different thing: generalising digit facts across positions.)"""
    return random.Random(f"{min(a, b)} {max(a, b)}").random() < HELDOUT_SHARE


def make_problems(scale: Scale, seed: int) -> tuple[list, list]:
    """(train, held-out): no (a, b) pair of the held-out split occurs in the training split."""
    rng = random.Random(seed)
    lo, hi = 10 ** (scale.digits - 1), 10**scale.digits - 1
    train, heldout = [], []
    while len(train) < scale.n_train or len(heldout) < scale.n_heldout:
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        side = heldout if held_out(a, b) else train
        limit = scale.n_heldout if side is heldout else scale.n_train
        if len(side) < limit:
            side.append(problem(rng, a, b))
    return train, heldout


def equations(scale: Scale, seed: int) -> list[str]:
    """scale.n_equations distinct bare worked equations ("53+24=77 reversed. answer: 77") of
    pairs outside the held-out split, for pretraining: the arithmetic in ~20 tokens instead of a
    ~50-token word problem, so the same pretraining tokens hold about twice as many sums. Distinct,
    because the data pipeline drops exact duplicate documents."""
    rng = random.Random(f"equations {seed}")
    lo, hi = 10 ** (scale.digits - 1), 10**scale.digits - 1
    out: dict[str, None] = {}
    while len(out) < scale.n_equations:
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        if held_out(a, b):
            continue
        if rng.random() < 0.5:
            out[worked(f"{a}+{b}", a + b)] = None
        else:
            a, b = max(a, b), min(a, b)
            out[worked(f"{a}-{b}", a - b)] = None
    return list(out)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def wrong(answer: str, result: int, rng: random.Random) -> str:
    """The same worked answer for a nearby wrong result (never negative, so it reads the same)."""
    bad = result + rng.choice([d for d in (-10, -2, -1, 1, 2, 10) if result + d >= 0])
    return worked(answer.split("=")[0], bad)


def run(command: list[str], overrides: dict[str, object]) -> None:
    args = [*command, *(f"{k}={v}" for k, v in overrides.items())]
    print("ats-train", " ".join(args), flush=True)
    if ats_train(args) != 0:
        raise SystemExit(f"ats-train {command[0]} failed")


@torch.no_grad()
def exact_match_rate(
    model_dir: Path, heldout: list, device: str, max_new: int, samples: int = 1
) -> float:
    """Chat completions of the held-out questions scored by the shipped exact_match: greedy, or
    with `samples` > 1 the share of questions with at least one right completion among that many
    sampled at temperature 1 (pass@samples, what a GRPO group of that size can find)."""
    model = load_pretrained(model_dir, device=device).eval()
    tok = Tokenizer.load(model_dir / "tokenizer.json")
    stops = (tok.eos_id, tok.special_tokens[IM_END])
    scores = []
    for i in range(0, len(heldout), 64):
        chunk = heldout[i : i + 64]
        prompts = [
            apply_chat_template([{"role": "user", "content": q}], tok.special_tokens,
                                tok.encode_ordinary, add_generation_prompt=True)[0]
            for q, _, _ in chunk
        ]  # fmt: skip
        width = max(map(len, prompts))
        ids = torch.full((len(chunk), width), tok.eos_id, device=device)
        mask = torch.zeros_like(ids)
        for b, p in enumerate(prompts):
            ids[b, width - len(p) :], mask[b, width - len(p) :] = torch.tensor(p), 1
        ids, mask = ids.repeat_interleave(samples, 0), mask.repeat_interleave(samples, 0)
        out = generate(model, ids, max_new, attention_mask=mask, temperature=float(samples > 1),
                       stop_tokens=stops, seed=i)  # fmt: skip
        texts = [tok.decode([t for t in row if t not in stops]) for row in out[:, width:].tolist()]
        right = exact_match([], texts, answer=[str(r) for _, _, r in chunk for _ in range(samples)])
        scores += torch.tensor(right).view(-1, samples).amax(dim=1).tolist()
    return sum(scores) / len(scores)


@torch.no_grad()
def preference_accuracy(
    policy_dir: Path, ref_dir: Path, pairs_file: Path, device: str
) -> tuple[float, float]:
    """(share of held-out pairs whose implicit reward (log pi - log ref) ranks chosen first,
    share of ties). A tie is no preference and counts against accuracy: all ties means the policy
    never left the reference (every DPO update skipped, as non-finite gradients do)."""
    tok = Tokenizer.load(policy_dir / "tokenizer.json")
    lines = pairs_file.read_text().splitlines()
    pairs = [
        dpo_pair(tok, Record(f"{pairs_file}:{i + 1}", json.loads(x))) for i, x in enumerate(lines)
    ]
    models = [load_pretrained(d, device=device).eval() for d in (policy_dir, ref_dir)]
    wins = ties = 0
    for i in range(0, len(pairs), 32):
        x, y = pair_batch(pairs[i : i + 32], tok.eos_id, None)
        ids, mask = x["ids"].flatten(0, 1).to(device), x["attention_mask"].flatten(0, 1).to(device)
        labels = y["labels"].flatten(0, 1).to(device)
        pol, ref = (
            sequence_logps(forward_logprobs(m, ids, mask, labels)[0], labels, False) for m in models
        )
        reward = pol - ref  # (P, 2)
        wins += int((reward[:, 0] > reward[:, 1]).sum())
        ties += int((reward[:, 0] == reward[:, 1]).sum())
    return wins / len(pairs), ties / len(pairs)


def measure_packing(model_dir: Path, sft_file: Path, seq_len: int, device: str, rows: int) -> dict:
    """SFT forward + backward over the same examples, packed into rows of seq_len tokens vs one
    per row padded to the batch's longest: examples/s and real (non-pad) tokens/s, each the best
    of 3 passes."""
    tok = Tokenizer.load(model_dir / "tokenizer.json")
    lines = sft_file.read_text().splitlines()[:512]
    seqs = [sft_sequence(tok, Record(str(i), json.loads(x))) for i, x in enumerate(lines)]
    real = sum(len(s.ids) for s in seqs)
    model = load_pretrained(model_dir, device=device)
    objective = SFTObjective([])
    packed = [packed_batch(c) for c in _chunks(pack(seqs, seq_len, tok.eos_id), rows)]
    padded = [padded_batch(c, tok.eos_id) for c in _chunks(seqs, rows)]
    out = {}
    for name, batches in (("packed", packed), ("padded", padded)):
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for x, y in batches:
                loss = objective.losses(model, x.to(device), y.to(device), 0)[0]
                loss.backward()
            if device == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        out[name] = {"rows": sum(len(x) for x, _ in batches), "examples_per_s": len(seqs) / best,
                     "real_tokens_per_s": real / best}  # fmt: skip
    return out


def sft_run_summary(run_dir: Path) -> dict:
    """What an SFT run trained and at what speed: trainable parameters (the adapter's under LoRA,
    else the whole model's), the bytes their fp32 gradients and AdamW moments take (4 + 8 per
    parameter), the median tokens/s over its logged steps and its last train loss."""
    adapter = run_dir / "adapter" / ADAPTER_TENSORS
    weights = adapter if adapter.is_file() else run_dir / "model" / "model.safetensors"
    with safe_open(str(weights), framework="pt") as f:
        trainable = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    train = [r for r in records if r.get("kind") == "train"]
    return {
        "trainable_params": trainable,
        "grad_and_adamw_mb": round(trainable * 12 / 2**20, 2),
        "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in train),
        "final_train_loss": train[-1]["loss"],
    }


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def grpo_start(sft_run: Path, prompts: list, device: str, group: int) -> tuple[Path, dict]:
    """(model dir, what chose it): the first of the SFT run's checkpoints (in step order, the last
    is its final model) whose pass@group on the prompts reaches GRPO_START_PASS; where none does,
    the last, with "reached": false in the record (GRPO then has little reward to learn from)."""
    checkpoints = sorted((sft_run / "checkpoints").glob("step-*"))
    if not checkpoints:
        raise SystemExit(f"{sft_run}: no checkpoints to start GRPO from")
    tried = []
    for checkpoint in checkpoints:
        rate = exact_match_rate(checkpoint, prompts, device, ANSWER_TOKENS, samples=group)
        tried.append({"step": int(checkpoint.name.split("-")[1]), "pass_at_group": rate})
        if rate >= GRPO_START_PASS:
            break
    reached = tried[-1]["pass_at_group"] >= GRPO_START_PASS
    return checkpoint, {
        "pass_needed": GRPO_START_PASS, "reached": reached, "prompts": len(prompts), "tried": tried
    }  # fmt: skip


def pretrain(work: Path, corpus: Path, common: dict, model: dict, scale: Scale) -> None:
    run(["--run-dir", str(work / "pretrain")], {
        **common, **model, "model.preset": "tiny-dense", "model.max_seq_len": PACK_ROWS * scale.seq_len,
        "data.source": corpus, "data.tokenizer": work / "tokenizer.json", "data.max_bytes": "none",
        "data.mode": "random", "data.val_fraction": 0.05, "data.cache_dir": work / "cache",
        "train.eval_batches": 1, "train.steps": scale.pretrain_steps, "train.batch_size": scale.batch,
        "optim.lr": PRETRAIN_LR, "optim.min_lr": PRETRAIN_MIN_LR,
        "optim.warmup_steps": scale.pretrain_steps // 10,
    })  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="run dirs and data (recreated)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--scale", default="full", choices=list(SCALES),
                        help="smoke: checks the pipeline; cpu: 2-digit problems and a 0.8M "
                        "model, for iterating on a CPU; full: the H200 demonstration")  # fmt: skip
    parser.add_argument("--pretrain-steps", type=int, help="instead of the scale's: sets how much "
                        "arithmetic the SFT model starts with (GRPO needs it between ~20%% and "
                        "60%% held-out exact match)")  # fmt: skip
    parser.add_argument("--dpo-lr", type=float, default=DPO_LR)
    parser.add_argument("--sft-steps", type=int, help="instead of the scale's (full: 120; GRPO "
                        "starts from the first SFT checkpoint that reaches GRPO_START_PASS)")  # fmt: skip
    parser.add_argument("--grpo-steps", type=int, help="instead of the scale's")
    parser.add_argument("--grpo-lr", type=float, default=GRPO_LR)
    parser.add_argument("--lora-lr", type=float, default=LORA_LR,
                        help="peak lr of the LoRA SFT (default %(default)s)")  # fmt: skip
    parser.add_argument("--grpo-set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="more ats-train settings of the GRPO run, e.g. orchestrator.mode=off "
                        "grpo.scale=group")  # fmt: skip
    parser.add_argument("--no-dpo", action="store_true",
                        help="pretrain, SFT, GRPO and its control only (a GRPO sweep)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pretrained", type=Path, metavar="WORK",
                        help="start from the pretrained model of an earlier run's --work (same "
                        "--seed, scale and pretraining steps) instead of pretraining again")  # fmt: skip
    args = parser.parse_args(argv)
    if args.pretrained is not None:
        if args.pretrained.resolve() == args.work.resolve():
            parser.error("--pretrained must name another run's --work (this one is recreated)")
        if not (args.pretrained / "pretrain" / "model").is_dir():
            parser.error(f"--pretrained {args.pretrained}: no pretrain/model in it")
    if bad := [kv for kv in args.grpo_set if "=" not in kv]:
        parser.error(f"--grpo-set takes KEY=VALUE, got {bad}")
    scale = SCALES[args.scale]
    if args.pretrain_steps is not None:
        scale = replace(scale, pretrain_steps=args.pretrain_steps)
    if args.sft_steps is not None:
        scale = replace(scale, sft_steps=args.sft_steps)
    if args.grpo_steps is not None:
        scale = replace(scale, grpo_steps=args.grpo_steps)
    work = args.work
    train, heldout = make_problems(scale, args.seed)
    rng = random.Random(args.seed + 1)
    documents = [f"{q}\n{a}" for q, a, _ in train] + equations(scale, args.seed)
    random.Random(args.seed + 2).shuffle(documents)
    text = "\n\n".join(documents) + "\n"  # one document per paragraph
    if args.pretrained is not None:  # checked before anything of --work is removed
        if (args.pretrained / "pretrain.txt").read_text() != text:
            parser.error(f"--pretrained {args.pretrained}: its pretraining corpus differs from "
                         "this run's (another --seed or --scale)")  # fmt: skip
        steps = tomllib.loads((args.pretrained / "pretrain" / "config.toml").read_text())
        if steps["train"]["steps"] != scale.pretrain_steps:
            parser.error(f"--pretrained {args.pretrained}: pretrained {steps['train']['steps']} "
                         f"steps, this run's scale {scale.pretrain_steps} (--pretrain-steps)")  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    corpus = work / "pretrain.txt"
    corpus.write_text(text)
    if args.pretrained is None:
        tok = Tokenizer.train(
            iter([text]), 512, special_tokens=CHAT_SPECIAL_TOKENS, pattern=DIGIT_PATTERN
        )
        tok.save(work / "tokenizer.json")
    else:  # the same problems, tokenizer and pretrained weights as that run's
        shutil.copy(args.pretrained / "tokenizer.json", work / "tokenizer.json")
    chat = [
        [{"role": "user", "content": q}, {"role": "assistant", "content": a}] for q, a, _ in train
    ]
    sft_file = write_jsonl(work / "sft.jsonl", [{"messages": m} for m in chat])
    grpo_file = write_jsonl(work / "grpo.jsonl", [
        {"prompt": [{"role": "user", "content": q}], "answer": str(r)} for q, _, r in train])  # fmt: skip

    def pairs(rows: list) -> list[dict]:
        return [{"prompt": [{"role": "user", "content": q}],
                 "chosen": [{"role": "assistant", "content": a}],
                 "rejected": [{"role": "assistant", "content": wrong(a, r, rng)}]} for q, a, r in rows]  # fmt: skip

    dpo_file = write_jsonl(work / "dpo.jsonl", pairs(train))
    dpo_heldout = write_jsonl(work / "dpo_heldout.jsonl", pairs(heldout))
    common = {
        "train.device": args.device, "train.seq_len": scale.seq_len, "train.log_every": 10,
        "train.eval_every": 0, "train.sample_tokens": 0, "checkpoint.every": 0,
        "train.precision": "bf16" if args.device == "cuda" else "fp32",
    }  # fmt: skip
    model = {f"model.{k}": v for k, v in scale.model.items()}
    t0 = time.perf_counter()
    if args.pretrained is not None:
        shutil.copytree(args.pretrained / "pretrain" / "model", work / "pretrain" / "model")
    else:
        pretrain(work, corpus, common, model, scale)
    post = {**common, "data.val_fraction": 0.02}
    run(["sft", "--run-dir", str(work / "sft")], {
        **post, "model.init_from": work / "pretrain" / "model", "data.source": sft_file,
        "train.steps": scale.sft_steps, "train.batch_size": scale.batch // 4, "optim.lr": SFT_LR,
        "optim.min_lr": SFT_MIN_LR, "optim.warmup_steps": scale.sft_steps // 10,
        "checkpoint.every": scale.sft_every,
        "checkpoint.keep_last": scale.sft_steps // scale.sft_every + 1,
    })  # fmt: skip
    sft_dir = work / "sft" / "model"
    start_dir, start = grpo_start(work / "sft", train[: scale.start_prompts], args.device, scale.group)
    run(["grpo", "--run-dir", str(work / "grpo")], {
        **post, "model.init_from": start_dir, "data.source": grpo_file,
        "train.steps": scale.grpo_steps, "train.batch_size": scale.grpo_batch,
        "grpo.group_size": scale.group, "grpo.max_completion_tokens": ANSWER_TOKENS,
        "grpo.rewards": '["exact_match","answer_format"]', "grpo.reward_weights": "[1.0,0.2]",
        "grpo.loss_type": "dr_grpo", "grpo.scale": "none",
        "optim.lr": args.grpo_lr, "optim.min_lr": args.grpo_lr, "optim.warmup_steps": 0,
        "optim.weight_decay": 0.0, **dict(kv.split("=", 1) for kv in args.grpo_set),
    })  # fmt: skip
    # the control: SFT continued from GRPO's start for as many steps as GRPO took, at GRPO's lr
    run(["sft", "--run-dir", str(work / "sft_more")], {
        **post, "model.init_from": start_dir, "data.source": sft_file,
        "train.steps": scale.grpo_steps, "train.batch_size": scale.batch // 4,
        "optim.lr": args.grpo_lr, "optim.min_lr": args.grpo_lr, "optim.warmup_steps": 0,
    })  # fmt: skip
    if not args.no_dpo:
        # LoRA against full fine-tuning: the same SFT from the same pretrained model
        run(["sft", "--run-dir", str(work / "sft_lora")], {
            **post, "model.init_from": work / "pretrain" / "model", "data.source": sft_file,
            "train.steps": scale.sft_steps, "train.batch_size": scale.batch // 4,
            "optim.lr": args.lora_lr, "optim.min_lr": args.lora_lr / 10,
            "optim.warmup_steps": scale.sft_steps // 10, **LORA,
        })  # fmt: skip
        run(["dpo", "--run-dir", str(work / "dpo")], {
            **post, "model.init_from": sft_dir, "data.source": dpo_file, "dpo.beta": 0.1,
            "train.steps": scale.dpo_steps, "train.batch_size": scale.batch // 4,
            "optim.lr": args.dpo_lr, "optim.min_lr": args.dpo_lr, "optim.warmup_steps": 0,
        })  # fmt: skip
    train_s = time.perf_counter() - t0
    report = {
        "scale": args.scale,
        "device": args.device,
        "dpo_lr": args.dpo_lr,
        "grpo_lr": args.grpo_lr,
        "grpo_set": args.grpo_set,
        "settings": asdict(scale),
        "heldout_problems": len(heldout),
        "exact_match": {
            stage: exact_match_rate(model_dir, heldout, args.device, ANSWER_TOKENS)
            for stage, model_dir in (
                ("pretrained", work / "pretrain" / "model"),
                ("sft", sft_dir),
                ("grpo_start", start_dir),
                ("sft_continued", work / "sft_more" / "model"),
                ("grpo", work / "grpo" / "model"),
                *([] if args.no_dpo else [("dpo", work / "dpo" / "model")]),
            )
        },
        # the same scoring on training problems (pairs seen in training) and pass@group
        "sft_exact_match_train_problems": exact_match_rate(
            sft_dir, train[: len(heldout)], args.device, ANSWER_TOKENS
        ),
        "sft_pass_at_group": exact_match_rate(
            sft_dir, heldout, args.device, ANSWER_TOKENS, samples=scale.group
        ),
        "grpo_start": {"model": str(start_dir.relative_to(work)), **start},
        "train_seconds": train_s,
    }
    em = report["exact_match"]
    report["goals"] = {
        "grpo_gain_points": 100 * (em["grpo"] - em["grpo_start"]),
        "grpo_gain_ge_15": em["grpo"] - em["grpo_start"] >= 0.15,
        "grpo_start_reached_pass": start["reached"],
    }
    if not args.no_dpo:
        report["sft_lora_vs_full"] = {
            "lora_lr": args.lora_lr,
            "full": sft_run_summary(work / "sft"),
            "lora": sft_run_summary(work / "sft_lora"),
            "lora_exact_match": exact_match_rate(
                work / "sft_lora" / "model", heldout, args.device, ANSWER_TOKENS
            ),
        }
        report["sft_packing"] = measure_packing(
            sft_dir, sft_file, PACK_ROWS * scale.seq_len, args.device, 8
        )
        accuracy, ties = preference_accuracy(
            work / "dpo" / "model", sft_dir, dpo_heldout, args.device
        )
        report["dpo_heldout_preference_accuracy"] = accuracy
        report["dpo_heldout_preference_ties"] = ties
        report["goals"]["dpo_pref_acc_ge_90"] = accuracy >= 0.9
    (work / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
