"""`ats-train plan`: the compute-optimal plan for a FLOP budget, and what it means for a preset."""

from __future__ import annotations

import argparse
import math

from ats_train.errors import ConfigError
from ats_train.planning.chinchilla import (
    TOKENS_PER_PARAM,
    compute_optimal,
    describe,
    steps_for_tokens,
)
from ats_train.planning.settings import LAWS


def plan_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ats-train plan",
        description="Compute-optimal model size and tokens for a FLOP budget (Hoffmann et al. "
        "2022), and optionally the run a preset needs.",
    )
    parser.add_argument("--flops", type=float, required=True, help="training budget, e.g. 1e20")
    parser.add_argument("--law", choices=LAWS, default="approach1")
    parser.add_argument("--preset", help="an ats_model preset: its tokens and steps")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=256, help="global sequences per step")
    return parser


def plan_report(args: argparse.Namespace) -> list[str]:
    if not (math.isfinite(args.flops) and args.flops > 0):
        raise ConfigError(f"--flops = {args.flops} must be a finite number > 0")
    if args.seq_len < 1 or args.batch_size < 1:
        raise ConfigError("--seq-len and --batch-size must be >= 1")
    lines = describe(compute_optimal(args.flops, args.law))
    if args.preset is None:
        return lines
    from ats_model import count_params, flops_per_token, presets

    if args.preset not in presets.names():
        raise ConfigError(
            f"--preset {args.preset!r} is not a preset ({', '.join(presets.names())})"
        )
    config = presets.get(args.preset)
    if args.seq_len > config.max_seq_len:
        raise ConfigError(f"--seq-len {args.seq_len} exceeds {args.preset}'s max_seq_len")
    total, active = count_params(config)
    per_token = flops_per_token(config, args.seq_len)
    tokens = args.flops / per_token
    chinchilla_tokens = TOKENS_PER_PARAM * active
    return [
        *lines,
        f"preset {args.preset}: {total:.4g} parameters, {active:.4g} active per token, "
        f"{per_token:.4g} training FLOPs per token at seq_len {args.seq_len}",
        f"  the budget buys     {tokens:.4g} tokens = {tokens / active:.1f} per active parameter "
        f"= {steps_for_tokens(tokens, args.batch_size, args.seq_len)} steps of "
        f"{args.batch_size} x {args.seq_len}",
        f"  20 tokens / param   {chinchilla_tokens:.4g} tokens, {chinchilla_tokens * per_token:.4g} "
        f'FLOPs (train with plan.steps_from = "tokens_per_param")',
    ]
