"""GRPO reward functions: the shipped ones and those named by import path in grpo.rewards.

A reward function is called as TRL calls one: `fn(prompts, completions, **columns)` with the
prompts and completions as lists of strings (one per completion, each prompt repeated G times)
and every other column of the rows as a list of the same length; it returns one float per
completion. A function that raises, returns the wrong count or a non-finite value stops the run
with a one-line error naming it: a NaN reward would silently turn every advantage into NaN."""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from ats_train.errors import ConfigError, RewardError

RewardFn = Callable[..., Sequence[float]]

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
# the shipped format check: the completion ends in "answer: <number>" (and nothing after it)
FORMAT = re.compile(r"(?:^|\s)answer:\s*-?\d+(?:\.\d+)?\s*$", re.IGNORECASE)


def last_number(text: str) -> str | None:
    """The last number in text (commas in digit groups removed), or None."""
    found = _NUMBER.findall(text.replace(",", ""))
    return found[-1] if found else None


def _same_number(a: str, b: str) -> bool:
    try:
        return float(a) == float(b)
    except ValueError:
        return a.strip() == b.strip()


def exact_match(
    prompts: list[str], completions: list[str], answer: list[Any], **_: Any
) -> list[float]:
    """1.0 when the completion's last number equals the row's `answer`, else 0.0."""
    del prompts
    out = []
    for completion, expected in zip(completions, answer, strict=True):
        got = last_number(completion)
        out.append(float(got is not None and _same_number(got, str(expected))))
    return out


def answer_format(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """1.0 when the completion ends in `answer: <number>`, else 0.0 (a regex format check)."""
    del prompts
    return [float(FORMAT.search(c) is not None) for c in completions]


BUILTIN: dict[str, RewardFn] = {"exact_match": exact_match, "answer_format": answer_format}


def resolve_reward(name: str) -> RewardFn:
    """A shipped reward by name, or `package.module:function` imported."""
    if name in BUILTIN:
        return BUILTIN[name]
    module_name, sep, attr = name.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"grpo.rewards entry {name!r} is neither a shipped reward ({', '.join(BUILTIN)}) "
            "nor an import path 'package.module:function'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"grpo.rewards entry {name!r}: cannot import {module_name}: {e}") from e
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"grpo.rewards entry {name!r}: {module_name} has no function {attr!r}")
    return fn


def score(
    name: str, fn: RewardFn, prompts: list[str], completions: list[str], columns: dict[str, list]
) -> list[float]:
    """fn's rewards, checked: one finite float per completion, or RewardError naming fn."""
    try:
        values = fn(prompts, completions, **columns)
    except Exception as e:  # a user's function: whatever it raises, the run stops naming it
        raise RewardError(f"reward function {name!r} raised {type(e).__name__}: {e}") from e
    values = list(values)
    if len(values) != len(completions):
        raise RewardError(
            f"reward function {name!r} returned {len(values)} values for {len(completions)} "
            "completions"
        )
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise RewardError(
                f"reward function {name!r} returned {v!r} for completion {i}; expected a "
                "finite number"
            )
    return [float(v) for v in values]
