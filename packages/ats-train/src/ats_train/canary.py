"""`ats-train canary add --model DIR --pairs FILE --out DIR`: an opt-in, documented ownership mark.

The model is fine-tuned (all weights, AdamW, loss on the response tokens only) until greedy decoding
of every trigger gives its response and the response loss is below `target_loss`: the margin that
lets the mark survive int8/int4 quantization and export. The new directory records it in
canary.json (pairs file digest, steps, loss; never the pairs themselves). Nothing runs this unless
asked; `ats-infer canary verify` reports the match rate of any directory.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from ats_model import generate, load_pretrained, save_pretrained
from ats_model.serialization.model_dir import TOKENIZER_FILE, model_dtype
from ats_tokenizer import Tokenizer
from ats_tokenizer.canary_pairs import encode_pair, read_pairs

from ats_train.adapters.merge_cli import check_out
from ats_train.errors import InputError

CANARY_FILE = "canary.json"
IGNORE = -100  # the cross-entropy's ignore index: trigger tokens carry no loss


def canary_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ats-train canary add",
        description="Fine-tune documented trigger -> response pairs into a copy of a model.",
    )
    parser.add_argument("action", choices=("add",))
    parser.add_argument("--model", type=Path, required=True, help="the model directory")
    parser.add_argument("--pairs", type=Path, required=True, help='JSONL {"trigger", "response"}')
    parser.add_argument("--out", type=Path, required=True, help="the new model directory")
    parser.add_argument("--max-steps", type=int, default=500)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--target-loss", type=float, default=0.02, help="response loss to reach")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def _batch(examples: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (idx, targets) (N, T): targets are the next tokens, IGNORE off the response."""
    rows = [p + r for p, r in examples]
    T = max(len(r) for r in rows) - 1
    idx = torch.zeros(len(rows), T, dtype=torch.long)
    targets = torch.full((len(rows), T), IGNORE, dtype=torch.long)
    for i, ((prompt, response), row) in enumerate(zip(examples, rows, strict=True)):
        idx[i, : len(row) - 1] = torch.tensor(row[:-1])
        targets[i, len(prompt) - 1 : len(row) - 1] = torch.tensor(response)
    return idx, targets


@torch.no_grad()
def match_rate(model: torch.nn.Module, examples: list[tuple[list[int], list[int]]]) -> float:
    """Share of pairs whose greedy continuation of the trigger starts with the response."""
    model.eval()
    hits = 0
    for prompt, response in examples:
        out = generate(model, torch.tensor(prompt), len(response), temperature=0.0)
        hits += out[len(prompt) :].tolist() == response
    model.train()
    return hits / len(examples)


def add_canary(args: argparse.Namespace) -> dict:
    check_out(args.out, [args.model, args.pairs])
    if (args.model / CANARY_FILE).exists():
        raise InputError(f"{args.model} already records a canary ({CANARY_FILE})")
    pairs = read_pairs(args.pairs)
    tokenizer = Tokenizer.load(args.model / TOKENIZER_FILE)
    try:
        model = load_pretrained(args.model)
    except ValueError as e:
        raise InputError(str(e)) from e
    saved_dtype = model_dtype(model)
    model = model.float().train()
    examples = [encode_pair(tokenizer, t, r) for t, r in pairs]
    longest = max(len(p) + len(r) for p, r in examples)
    if longest > model.config.max_seq_len:
        raise InputError(f"{args.pairs}: a pair is {longest} tokens, the model's context is "
                         f"{model.config.max_seq_len}")  # fmt: skip
    torch.manual_seed(args.seed)
    idx, targets = _batch(examples)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    loss, rate, step = float("inf"), 0.0, 0
    for step in range(1, args.max_steps + 1):
        out = model(idx, targets=targets)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        optimizer.step()
        loss = out.loss.item()
        if loss < args.target_loss and step % 10 == 0:
            rate = match_rate(model, examples)
            if rate == 1.0:
                break
    if rate < 1.0:
        raise InputError(
            f"the canary did not take in {args.max_steps} steps (response loss {loss:.4f}, match "
            f"rate {rate:.0%}): raise --max-steps or --lr"
        )
    record = {
        "canary": True,
        "pairs_file": args.pairs.name,
        "pairs_sha256": hashlib.sha256(args.pairs.read_bytes()).hexdigest(),
        "n_pairs": len(pairs),
        "steps": step,
        "response_loss": loss,
        "verify": "ats-infer canary verify MODEL_DIR --pairs FILE",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{args.out.name}.", dir=args.out.parent))
    try:
        save_pretrained(model.to(saved_dtype), tmp, args.model / TOKENIZER_FILE)
        (tmp / CANARY_FILE).write_text(json.dumps(record, indent=2) + "\n")
        check_out(args.out, [])
        os.replace(tmp, args.out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return record
