"""`ats-infer canary verify MODEL_DIR --pairs FILE`: the share of documented canary pairs
(ats_tokenizer.canary_pairs) whose greedy continuation of the trigger starts with the response, on any
engine and any directory the engine reads (float, int8/int4, an imported HF export)."""

from __future__ import annotations

from pathlib import Path

from ats_tokenizer.canary_pairs import encode_pair, read_pairs

from ats_infer.engine import load_engine


def verify_canary(
    model_dir: str | Path, pairs_file: str | Path, engine: str = "auto", threads: int = 0
) -> dict:
    """{"matched", "pairs", "match_rate"} of `pairs_file` on `model_dir` (greedy decoding)."""
    pairs = read_pairs(pairs_file)
    runner = load_engine(model_dir, engine, threads=threads)
    matched = 0
    for trigger, response in pairs:
        prompt, expected = encode_pair(runner.tokenizer, trigger, response)
        tokens = runner.generate_tokens(
            prompt, len(expected), (), temperature=0.0, top_k=None, top_p=None, seed=0
        )
        matched += list(tokens)[: len(expected)] == expected
    return {"matched": matched, "pairs": len(pairs), "match_rate": matched / len(pairs)}
