"""Special tokens with tiktoken semantics: text that spells a special token raises unless the caller
allows it (a prompt-injection guard); allowed ones become their id, the rest is ordinary text."""

from collections.abc import Collection, Iterator
from typing import Literal

import regex

SpecialSpec = Literal["all"] | Collection[str]


class DisallowedSpecialError(ValueError):
    """Text spells a disallowed special token; the message names the Python arguments (the CLI
    names its flags instead, from `token` and `index`)."""

    def __init__(self, token: str, index: int) -> None:
        self.token = token
        self.index = index
        super().__init__(
            f"text holds the special token {token!r} at index {index}, which is disallowed: pass "
            "allowed_special={...} to encode it as a special token, or disallowed_special=() to "
            "encode it as ordinary text"
        )


def resolve_special(
    specials: dict[str, int], allowed_special: SpecialSpec, disallowed_special: SpecialSpec
) -> tuple[frozenset[str], frozenset[str]]:
    """(allowed, disallowed) sets as tiktoken.Encoding.encode computes them."""
    allowed = frozenset(specials) if allowed_special == "all" else frozenset(allowed_special)
    if disallowed_special == "all":
        disallowed = frozenset(specials) - allowed
    else:
        disallowed = frozenset(disallowed_special)
    for name, group in (("allowed_special", allowed), ("disallowed_special", disallowed)):
        unknown = sorted(group - specials.keys())
        if unknown:
            raise ValueError(
                f"{name} names {unknown}, which are not special tokens of this tokenizer "
                f"(known: {sorted(specials)})"
            )
    return allowed, disallowed


def _alternation(tokens: Collection[str]) -> regex.Pattern:
    # Longest first so that a special token that is a prefix of another never wins.
    ordered = sorted(tokens, key=lambda t: (-len(t), t))
    return regex.compile("|".join(regex.escape(t) for t in ordered))


class SpecialMatcher:
    """Finds special-token strings in text; compiled once per (allowed, disallowed) pair."""

    def __init__(self, allowed: frozenset[str], disallowed: frozenset[str]) -> None:
        self._allowed = _alternation(allowed) if allowed else None
        self._disallowed = _alternation(disallowed) if disallowed else None

    def check(self, text: str) -> None:
        if self._disallowed is None:
            return
        match = self._disallowed.search(text)
        if match is not None:
            raise DisallowedSpecialError(match.group(), match.start())

    def split(self, text: str) -> Iterator[tuple[str, bool]]:
        """Yields (piece, is_special) in order; no piece is empty."""
        if self._allowed is None:
            if text:
                yield text, False
            return
        start = 0
        for match in self._allowed.finditer(text):
            if match.start() > start:
                yield text[start : match.start()], False
            yield match.group(), True
            start = match.end()
        if start < len(text):
            yield text[start:], False
