"""Regex pre-tokenization: the two named patterns (GPT-4 cl100k, GPT-2) and the UTF-8 guard.

The `regex` module's Unicode semantics for \\p{L}, \\p{N}, \\s and (?i) are the reference that the
native splitter (ats_native.pretokenize) must reproduce exactly; see briefs/tokenizer_api.md.
"""

import regex

# tiktoken's cl100k_base pattern (GPT-4), in its original (non-possessive) spelling.
GPT4_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# GPT-2's pattern, also what HF's ByteLevel pre-tokenizer applies with use_regex=true.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

# Pattern string -> the name the native module knows it by.
NAMED_PATTERNS = {GPT4_PATTERN: "gpt4", GPT2_PATTERN: "gpt2"}


def utf8_bytes(text: str) -> bytes:
    """UTF-8 bytes of `text`; a lone surrogate (unencodable) is a ValueError naming its index."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"text is not valid Unicode: lone surrogate at index {err.start} "
            f"(U+{ord(text[err.start]):04X}); it cannot be encoded to UTF-8"
        ) from None


def check_text(text: str) -> None:
    """Raise ValueError if `text` holds a lone surrogate (see utf8_bytes)."""
    if not isinstance(text, str):
        raise TypeError(f"expected str, got {type(text).__name__}")
    utf8_bytes(text)


class PreTokenizer:
    """Splits text into pre-tokens with one compiled pattern."""

    def __init__(self, pattern: str) -> None:
        try:
            self._regex = regex.compile(pattern)
        except regex.error as err:
            raise ValueError(f"invalid pre-tokenization pattern {pattern!r}: {err}") from None
        self.pattern = pattern

    def split(self, text: str) -> list[str]:
        check_text(text)
        return self._regex.findall(text)


def pretokenize(text: str, pattern: str = GPT4_PATTERN) -> list[str]:
    """`regex.findall(pattern, text)` after the lone-surrogate check."""
    return PreTokenizer(pattern).split(text)
