"""Text for perplexity and for quantization calibration, split as ats-data splits a corpus for
training: documents are cleaned and deduplicated, and one goes to "val" or "train" by its content
digest (ats_data.split.assign_split), never by position. So eval-ppl's "val" text is text that
ats-train never trained on at the same data.val_fraction (0.05 by default), and calibration reads
"train" text only, never what perplexity is measured on.

Token stream: <|endoftext|> doc_1 <|endoftext|> doc_2 <|endoftext|> ... (each document as ats-data
tokenizes it: encode_ordinary + <|endoftext|>), cut into windows of seq_len + 1 tokens that share
one token with the next, so every token after the first is predicted exactly once.

ats-data is the optional extra `ats-infer[eval]`: it is imported here, when text is split, and
nowhere else, so generate and serve install and run without it.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from ats_tokenizer import Tokenizer

DEFAULT_VAL_FRACTION = 0.05  # ats-train's data.val_fraction


def split_documents(
    source: str | Path, split: str, val_fraction: float = DEFAULT_VAL_FRACTION
) -> Iterator[str]:
    """The documents of `source` (a path or "stdlib") that ats-data puts in `split`. Arguments and
    the ats-data install are checked on the call, before the first document is read."""
    try:
        from ats_data import open_source
        from ats_data.clean import CleanConfig, Cleaner
        from ats_data.dedup import ExactDeduper, document_digest
        from ats_data.split import SPLITS, assign_split, check_val_fraction
    except ModuleNotFoundError as e:
        if e.name is None or e.name.split(".")[0] != "ats_data":
            raise
        raise RuntimeError(  # as engine.py names a missing engine's extra
            "held-out and calibration text are split by ats-data, which is not installed: "
            "pip install 'ats-infer[eval]'"
        ) from e
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: expected one of {', '.join(SPLITS)}")
    check_val_fraction(val_fraction)
    if split == "val" and val_fraction == 0:
        raise ValueError("val_fraction = 0 holds nothing out: expected a fraction in (0, 1)")
    cleaner, deduper = Cleaner(CleanConfig()), ExactDeduper()

    def documents() -> Iterator[str]:
        for raw in open_source(source):
            text = cleaner(raw)
            if text is None:
                continue
            digest = document_digest(text)
            if deduper.add(digest) and assign_split(digest, val_fraction) == split:
                yield text

    return documents()


@dataclass(frozen=True)
class Windows:
    ids: np.ndarray  # (N, seq_len + 1) int64; window k+1 starts with window k's last token
    n_bytes: int  # UTF-8 bytes of the predicted tokens (<|endoftext|> counts 0)
    n_documents: int  # documents the windows touch

    @property
    def n_tokens(self) -> int:
        """Predicted tokens: seq_len per window."""
        return self.ids.shape[0] * (self.ids.shape[1] - 1)


def token_windows(
    tokenizer: Tokenizer, documents: Iterator[str], seq_len: int, max_tokens: int
) -> Windows:
    """Whole windows of the token stream holding at most `max_tokens` predicted tokens (0: the
    whole stream); raises when not even one window fits."""
    if seq_len < 1 or max_tokens < 0:
        raise ValueError(f"seq_len = {seq_len} must be >= 1 and max_tokens = {max_tokens} >= 0")
    eos = tokenizer.eos_id
    stream, n_documents = [eos], 0
    limit = None if max_tokens == 0 else max_tokens // seq_len * seq_len + 1
    for text in documents:
        stream.extend(tokenizer.encode_ordinary(text))
        stream.append(eos)
        n_documents += 1
        if limit is not None and len(stream) >= limit:
            break
    n_windows = (len(stream) - 1) // seq_len
    if limit is not None:
        n_windows = min(n_windows, (limit - 1) // seq_len)
    if n_windows == 0:
        raise ValueError(
            f"the text holds {len(stream) - 1} tokens in {n_documents} documents: fewer than one "
            f"window of {seq_len}; give more text or a smaller --seq-len"
        )
    flat = np.asarray(stream[: n_windows * seq_len + 1], dtype=np.int64)
    starts = np.arange(n_windows)[:, None] * seq_len
    ids = flat[starts + np.arange(seq_len + 1)[None, :]]  # (N, seq_len + 1)
    sizes = np.array([len(tokenizer.decode_bytes([i])) for i in range(tokenizer.vocab_size)])
    sizes[eos] = 0
    return Windows(ids, int(sizes[flat[1:]].sum()), n_documents)
