"""Gopher's repetition filters (Rae et al. 2021, "Scaling Language Models", appendix A.1.1,
table A1, whose thresholds are the defaults): a document is removed when any of these fractions
exceeds its threshold.

- lines / paragraphs (split on newlines / blank lines, stripped, empty ones dropped): the
  fraction of them that repeat an earlier one, and the fraction of the text's characters in
  those repeats;
- top n-gram, n = 2..4 (whitespace words): the characters (word characters, spaces not
  counted) of the most frequent n-gram times its count, over all word characters; an n-gram
  that occurs once is no repetition and scores 0;
- duplicate n-grams, n = 5..10: the word characters covered by any n-gram that occurs more than
  once (each word counted once however many such n-grams cover it), over all word characters
  (RedPajama-V2's `rps_doc_frac_chars_dupe_ngrams`).
"""

import re
from collections import Counter
from dataclasses import dataclass

from ats_data.errors import DataError

_PARAGRAPH = re.compile(r"\n\s*\n")


@dataclass(frozen=True)
class RepetitionConfig:
    dup_line_frac: float = 0.30
    dup_para_frac: float = 0.30
    dup_line_char_frac: float = 0.20
    dup_para_char_frac: float = 0.20
    top_ngram_char_frac: tuple[tuple[int, float], ...] = ((2, 0.20), (3, 0.18), (4, 0.16))
    dup_ngram_char_frac: tuple[tuple[int, float], ...] = (
        (5, 0.15),
        (6, 0.14),
        (7, 0.13),
        (8, 0.12),
        (9, 0.11),
        (10, 0.10),
    )

    def __post_init__(self) -> None:
        fracs = [
            ("dup_line_frac", self.dup_line_frac),
            ("dup_para_frac", self.dup_para_frac),
            ("dup_line_char_frac", self.dup_line_char_frac),
            ("dup_para_char_frac", self.dup_para_char_frac),
        ]
        fracs += [(f"top_{n}gram_char_frac", f) for n, f in self.top_ngram_char_frac]
        fracs += [(f"dup_{n}gram_char_frac", f) for n, f in self.dup_ngram_char_frac]
        for name, value in fracs:
            if not 0.0 <= value <= 1.0:
                raise DataError(f"repetition threshold {name} must be in [0, 1], got {value}")


def duplicate_fractions(parts: list[str], total_chars: int) -> tuple[float, float]:
    """(fraction of `parts` equal to an earlier one, their characters / total_chars)."""
    seen: set[str] = set()
    dup, dup_chars = 0, 0
    for p in parts:
        if p in seen:
            dup += 1
            dup_chars += len(p)
        else:
            seen.add(p)
    return (dup / len(parts) if parts else 0.0), (dup_chars / total_chars if total_chars else 0.0)


def top_ngram_char_frac(words: list[str], n: int) -> float:
    grams = Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))
    if not grams:
        return 0.0
    gram, count = grams.most_common(1)[0]
    if count < 2:
        return 0.0
    return sum(map(len, gram)) * count / sum(map(len, words))


def dup_ngram_char_frac(words: list[str], n: int) -> float:
    starts = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    counts = Counter(starts)
    covered = [False] * len(words)
    for i, gram in enumerate(starts):
        if counts[gram] > 1:
            covered[i : i + n] = [True] * n
    total = sum(map(len, words))
    return sum(len(w) for w, c in zip(words, covered, strict=True) if c) / total if total else 0.0


def repetition_reason(text: str, config: RepetitionConfig) -> str | None:
    """The first Gopher repetition test `text` fails, by name, or None when it passes all."""
    lines = [s for s in (line.strip() for line in text.split("\n")) if s]
    paras = [s for s in (p.strip() for p in _PARAGRAPH.split(text)) if s]
    for name, parts, frac, char_frac in (
        ("line", lines, config.dup_line_frac, config.dup_line_char_frac),
        ("paragraph", paras, config.dup_para_frac, config.dup_para_char_frac),
    ):
        dup, dup_chars = duplicate_fractions(parts, len(text))
        if dup > frac:
            return f"duplicate_{name}_fraction"
        if dup_chars > char_frac:
            return f"duplicate_{name}_char_fraction"
    words = text.split()
    for n, limit in config.top_ngram_char_frac:
        if top_ngram_char_frac(words, n) > limit:
            return f"top_{n}gram_char_fraction"
    for n, limit in config.dup_ngram_char_frac:
        if dup_ngram_char_frac(words, n) > limit:
            return f"duplicate_{n}gram_char_fraction"
    return None
