"""TRL-format rows -> token ids with a loss mask, checked; every error names the row's file:line.

SFT   {"messages": [...]}  chat template, loss on assistant turns (ats_tokenizer.chat)
      {"prompt", "completion"}  strings (completion + <|endoftext|>) or message lists
      {"text"}  loss on every token
DPO   {"prompt", "chosen", "rejected"}  strings or message lists
GRPO  {"prompt", ...}  string or message list; every other column goes to the rewards
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ats_data.errors import DataError
from ats_data.records import Record
from ats_tokenizer import Tokenizer
from ats_tokenizer.chat import apply_chat_template


@dataclass
class Sequence:
    ids: list[int]
    mask: list[int]  # 1 on the tokens the loss scores
    where: str


@dataclass
class Pair:
    chosen: Sequence
    rejected: Sequence
    where: str


@dataclass
class Prompt:
    ids: list[int]
    text: str  # what reward functions see as the prompt
    columns: dict[str, Any] = field(default_factory=dict)
    where: str = ""


def _template(tok: Tokenizer, messages: Any, where: str, generation: bool = False) -> list[list]:
    if not isinstance(messages, list):
        raise DataError(f"{where}: expected a list of messages, got {type(messages).__name__}")
    try:
        ids, mask = apply_chat_template(
            messages, tok.special_tokens, tok.encode_ordinary, add_generation_prompt=generation
        )
    except ValueError as e:
        raise DataError(f"{where}: {e}") from None
    return [ids, mask]


def _text(row: dict[str, Any], key: str, where: str) -> Any:
    if key not in row:
        raise DataError(f"{where}: no field {key!r} (fields: {', '.join(sorted(row)) or 'none'})")
    value = row[key]
    if not isinstance(value, (str, list)):
        raise DataError(
            f"{where}: field {key!r} is {type(value).__name__}, expected a string or a list of messages"
        )
    return value


def completion_sequence(tok: Tokenizer, prompt: Any, completion: Any, where: str) -> Sequence:
    """prompt + completion with the loss on the completion only (TRL's completion_only_loss)."""
    if isinstance(prompt, str) != isinstance(completion, str):
        raise DataError(
            f"{where}: prompt and completion must both be strings or both message lists"
        )
    if isinstance(prompt, str):
        p, c = tok.encode_ordinary(prompt), tok.encode_ordinary(completion) + [tok.eos_id]
        return Sequence(p + c, [0] * len(p) + [1] * len(c), where)
    p_ids, _ = _template(tok, prompt, where)
    ids, mask = _template(tok, prompt + completion, where)
    return Sequence(ids, [0] * len(p_ids) + mask[len(p_ids) :], where)


def sft_sequence(tok: Tokenizer, record: Record) -> Sequence:
    row, where = record.row, record.where
    if "messages" in row:
        ids, mask = _template(tok, row["messages"], where)
        if not any(mask):
            raise DataError(f"{where}: no assistant message: nothing for the loss")
        return Sequence(ids, mask, where)
    if "prompt" in row and "completion" in row:
        return completion_sequence(
            tok, _text(row, "prompt", where), _text(row, "completion", where), where
        )
    if "text" in row:
        text = row["text"]
        if not isinstance(text, str):
            raise DataError(f"{where}: field 'text' is {type(text).__name__}, expected a string")
        ids = tok.encode_ordinary(text) + [tok.eos_id]
        return Sequence(ids, [1] * len(ids), where)
    raise DataError(
        f"{where}: an SFT row needs 'messages', 'prompt' and 'completion', or 'text' "
        f"(fields: {', '.join(sorted(row)) or 'none'})"
    )


def dpo_pair(tok: Tokenizer, record: Record) -> Pair:
    row, where = record.row, record.where
    prompt = _text(row, "prompt", where)
    chosen, rejected = _text(row, "chosen", where), _text(row, "rejected", where)
    if chosen == rejected:
        raise DataError(
            f"{where}: 'chosen' and 'rejected' are identical: the pair states no preference"
        )
    return Pair(
        completion_sequence(tok, prompt, chosen, where),
        completion_sequence(tok, prompt, rejected, where),
        where,
    )


def grpo_prompt(tok: Tokenizer, record: Record) -> Prompt:
    row, where = record.row, record.where
    prompt = _text(row, "prompt", where)
    columns = {k: v for k, v in row.items() if k != "prompt"}
    if isinstance(prompt, str):
        return Prompt(tok.encode_ordinary(prompt), prompt, columns, where)
    ids, _ = _template(tok, prompt, where, generation=True)
    return Prompt(ids, tok.decode(ids), columns, where)


def check_length(n: int, limit: int, where: str, what: str) -> None:
    if n > limit:
        raise DataError(f"{where}: {what} is {n} tokens, longer than the context: {limit}")
