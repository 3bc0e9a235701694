"""Test inputs of the tokenizer tests: stdlib source slices, and hypothesis strategies of arbitrary
Unicode mixed with whitespace runs, emoji, Hangul/CJK, code, numbers and contraction-like snippets.

UNICODE_17_RANGES: the `regex` module used here (2026.11.19) implements Unicode 17.0, while HF
`tokenizers` 0.23 (Oniguruma) and tiktoken 0.14 (Rust regex) implement Unicode 16.0. Exactly the
17,480 code points below are \\p{L} or \\p{N} for `regex` and unassigned for the other two (found by
classifying all code points with each engine; test_pretokenize.py re-derives the set from HF and
checks it). They are a documented Unicode-version difference, so the oracle-parity strategies
(`oracle_text`) leave them out; the python-vs-native strategies (`any_text`) keep them.
"""

import sysconfig
from pathlib import Path

from hypothesis import strategies as st

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def stdlib_texts(n_files: int, start: int = 0) -> list[str]:
    """Sources of n_files top-level stdlib modules (sorted by name: the same slice everywhere)."""
    files = sorted(STDLIB.glob("*.py"))[start : start + n_files]
    return [f.read_text(encoding="utf-8") for f in files]


UNICODE_17_RANGES = (
    (0x00558, 0x00558), (0x0058B, 0x0058C), (0x0088F, 0x0088F), (0x00C5C, 0x00C5C),
    (0x00CDC, 0x00CDC), (0x0208F, 0x0208F), (0x0209D, 0x0209F), (0x0A7CE, 0x0A7CF),
    (0x0A7D2, 0x0A7D2), (0x0A7D4, 0x0A7D4), (0x0A7DD, 0x0A7DD), (0x0A7E2, 0x0A7E2),
    (0x0A7F1, 0x0A7F1), (0x0AB6C, 0x0AB6D), (0x107BB, 0x107BF), (0x10940, 0x10959),
    (0x10EC5, 0x10EC7), (0x10ED9, 0x10EEE), (0x11B0A, 0x11B0A), (0x11DB0, 0x11DDB),
    (0x11DE0, 0x11DE9), (0x11DF1, 0x11DF1), (0x1246F, 0x1246F), (0x12475, 0x1247F),
    (0x12550, 0x12686), (0x16EA0, 0x16EB8), (0x16EBB, 0x16ED3), (0x16FF2, 0x16FF6),
    (0x187F8, 0x187FF), (0x18CD6, 0x18CDA), (0x18D09, 0x18D20), (0x18D80, 0x18DF2),
    (0x18E00, 0x19191), (0x191A0, 0x191D2), (0x1B123, 0x1B128), (0x1B168, 0x1B168),
    (0x1D6A6, 0x1D6A6), (0x1DF1F, 0x1DF24), (0x1DF2B, 0x1DF81), (0x1DF90, 0x1DF96),
    (0x1DFCD, 0x1DFFF), (0x1E6C0, 0x1E6DE), (0x1E6E0, 0x1E6E2), (0x1E6E4, 0x1E6E5),
    (0x1E6E7, 0x1E6ED), (0x1E6F0, 0x1E6F4), (0x1E6FE, 0x1E6FF), (0x2B73A, 0x2B73F),
    (0x2B81E, 0x2B81E), (0x2CEA2, 0x2CEAD), (0x323B0, 0x33479), (0x3D000, 0x3FC3F),
)  # fmt: skip


def is_unicode_17_letter_or_number(ch: str) -> bool:
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in UNICODE_17_RANGES)


SNIPPETS = [
    " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2028", "\x0b",
    "\x0c", "\x85", "\u200b", "🙂", "👩\u200d👩\u200d👧", "🇺🇸", "👍🏽", "한국어", "안녕하세요",
    "中文字符", "日本語のテキスト", "def f(x):\n    return x ** 2\n", "{'a': [1, 2]}", "if (a&&b)",
    "    ", "12345", "3.14159", "1,000,000", "٣٤٥", "²³½", "Ⅻ", "'s", "'LL", "'Re", "'ſ", "don't",
    "I'M", "é", "e\u0301", "ß", "Ǆ", "ﬁ", "Ω", "\x00", "\x7f", "<|endoftext|>", "<|im_end|>",
]  # fmt: skip


def _text(chars: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    piece = st.one_of(st.sampled_from(SNIPPETS), st.text(chars, max_size=8))
    return st.lists(piece, max_size=12).map("".join)


# Every code point except surrogates (which str.encode rejects; tested separately).
_all_chars = st.characters(exclude_categories=("Cs",))
any_text = _text(_all_chars)
oracle_text = _text(_all_chars.filter(lambda c: not is_unicode_17_letter_or_number(c)))
