"""Near-duplicate removal with MinHash LSH, FineWeb's settings by default: word 5-gram shingles
of the normalised text (lowercase, punctuation to spaces, whitespace collapsed), 14 bands x 8
rows = 112 permutations. A document whose LSH bucket holds an earlier kept document is a
candidate duplicate; it is removed when the signatures' estimated Jaccard similarity is at least
`threshold` (0.7; FineWeb removes every candidate, threshold 0). The check keeps documents below
Jaccard 0.5, which share a band with probability up to 5% at 14 x 8, from being removed, and
costs almost nothing at Jaccard 0.8 (the estimate over 112 permutations has a standard deviation
of about 0.04 there).

Signature: each shingle's key is the high 32 bits of xxh64 of its UTF-8 bytes; permutation k
maps a key x to ((a_k x + b_k) mod 2^64) >> 32, Dietzfelbinger's multiply-add-shift family
(strongly universal from 32-bit keys to 32-bit values for 64-bit a, b; STACS 1996). The keys are
already hash values, so a 2-universal family suffices, as the Mersenne-prime family of datasketch
and datatrove does; this one needs one multiply, one add and one shift per (shingle,
permutation) in uint64 numpy arithmetic, where an exact (a x + b) mod 2^61-1 needs about a dozen
operations. The shingles of many documents are permuted together in blocks
(`signatures_of_texts`); `signature_reference` is the same function in plain Python, the test
oracle.

Signatures are computed in worker processes, the LSH index lives in this one; the first
occurrence of a cluster is kept, so the result does not depend on the number of workers.
"""

import multiprocessing
import re
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain

import numpy as np
from xxhash import xxh64_intdigest

from ats_data.errors import DataError

_NON_WORD = re.compile(r"\W|_")  # whitespace included: words are then split on " " alone
# ASCII text takes str.translate, with the same result as _NON_WORD and about 5x faster.
_ASCII_NON_WORD = str.maketrans({chr(c): " " for c in range(128) if not chr(c).isalnum()})
_CHUNK_DOCS = 256  # documents per task sent to a worker process
_BLOCK_SHINGLES = 4096  # shingles permuted at once: a (4096, 112) uint64 block is 3.7 MB
_U64 = (1 << 64) - 1


@dataclass(frozen=True)
class MinHashConfig:
    ngram: int = 5
    bands: int = 14
    rows: int = 8
    seed: int = 1
    threshold: float = 0.7

    def __post_init__(self) -> None:
        for name in ("ngram", "bands", "rows"):
            if getattr(self, name) < 1:
                raise DataError(f"minhash {name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.threshold <= 1.0:
            raise DataError(f"minhash threshold must be in [0, 1], got {self.threshold}")

    @property
    def num_perm(self) -> int:
        return self.bands * self.rows


def _words(text: str) -> list[bytes]:
    text = text.lower()
    spaced = text.translate(_ASCII_NON_WORD) if text.isascii() else _NON_WORD.sub(" ", text)
    return spaced.encode().split()


def _shingle_list(text: str, ngram: int) -> list[bytes]:
    words = _words(text)
    if len(words) <= ngram:
        return [b" ".join(words)]
    return [b" ".join(words[i : i + ngram]) for i in range(len(words) - ngram + 1)]


def shingles(text: str, ngram: int) -> set[bytes]:
    """The set of word n-grams of the normalised text (one shingle of all words when shorter)."""
    return set(_shingle_list(text, ngram))


def permutations(config: MinHashConfig) -> tuple[np.ndarray, np.ndarray]:
    """(a, b): the multipliers and offsets of the num_perm permutations, uint64 each."""
    rng = np.random.default_rng(config.seed)
    a, b = rng.integers(0, _U64, size=(2, config.num_perm), dtype=np.uint64, endpoint=True)
    return a, b


def signature_reference(text: str, config: MinHashConfig) -> np.ndarray:
    """The signature in plain Python integers: min over shingle keys x of ((a x + b) mod 2^64)
    >> 32, for each permutation (a, b)."""
    keys = {xxh64_intdigest(s) >> 32 for s in shingles(text, config.ngram)}
    a, b = permutations(config)
    return np.array(
        [
            min(((int(ak) * x + int(bk)) & _U64) >> 32 for x in keys)
            for ak, bk in zip(a, b, strict=True)
        ],
        dtype=np.uint32,
    )


def signatures_of_texts(
    texts: Sequence[str], config: MinHashConfig, block: int = _BLOCK_SHINGLES
) -> np.ndarray:
    """Signatures of `texts`, shape (len(texts), num_perm), uint32. The shingle keys of all
    texts are permuted together, `block` shingles at a time (a document may span blocks)."""
    a, b = permutations(config)
    per_doc = [[xxh64_intdigest(s) >> 32 for s in _shingle_list(t, config.ngram)] for t in texts]
    counts = np.fromiter(map(len, per_doc), np.int64, len(per_doc))  # every text has >= 1
    keys = np.fromiter(chain.from_iterable(per_doc), np.uint64, int(counts.sum()))
    doc_of = np.repeat(np.arange(len(texts)), counts)  # (N,) the document of each shingle
    out = np.full((len(texts), config.num_perm), np.iinfo(np.uint32).max, dtype=np.uint64)
    shift = np.uint64(32)
    for start in range(0, len(keys), block):
        x = keys[start : start + block, None]  # (n, 1)
        v = x * a  # (n, P): uint64 arithmetic wraps, i.e. is mod 2^64
        v += b
        v >>= shift
        d = doc_of[start : start + block]
        first = np.flatnonzero(np.r_[True, d[1:] != d[:-1]])  # where each document's run begins
        docs = d[first]  # distinct: a document's shingles are contiguous
        out[docs] = np.minimum(out[docs], np.minimum.reduceat(v, first, axis=0))
    return out.astype(np.uint32)


def signature(text: str, config: MinHashConfig) -> np.ndarray:
    return signatures_of_texts([text], config)[0]


def _signatures(args: tuple[list[str], MinHashConfig]) -> np.ndarray:
    texts, config = args
    return signatures_of_texts(texts, config)


def signatures(texts: Iterable[str], config: MinHashConfig, workers: int) -> Iterator[np.ndarray]:
    """Signatures of `texts` in input order, computed `_CHUNK_DOCS` at a time by `workers`
    processes (in this one when workers == 1)."""
    chunks = _chunks(texts, _CHUNK_DOCS)
    if workers == 1:
        for chunk in chunks:
            yield from signatures_of_texts(chunk, config)
        return
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers) as pool:
        pending: deque = deque()
        for chunk in chunks:
            pending.append(pool.apply_async(_signatures, ((chunk, config),)))
            if len(pending) >= 2 * workers:
                yield from pending.popleft().get()
        while pending:
            yield from pending.popleft().get()


def _chunks(texts: Iterable[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for t in texts:
        chunk.append(t)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


@dataclass
class MinHashReport:
    documents: int = 0
    removed: int = 0
    clusters: int = 0  # kept documents that had at least one near-duplicate removed
    largest_cluster: int = 0
    _sizes: dict = field(default_factory=dict, repr=False)

    def to_json(self) -> dict:
        return {
            "documents": self.documents,
            "removed": self.removed,
            "removed_fraction": self.removed / self.documents if self.documents else 0.0,
            "clusters": self.clusters,
            "largest_cluster": self.largest_cluster,
        }


class MinHashDeduper:
    """`add(sig)` says whether a document with this signature is new (and remembers it). The
    LSH index: per band, the rows' bytes -> the kept documents with that band."""

    def __init__(self, config: MinHashConfig | None = None) -> None:
        self.config = config = config or MinHashConfig()
        self._buckets: list[dict[bytes, list[int]]] = [{} for _ in range(config.bands)]
        self._kept: list[np.ndarray] = []
        self.report = MinHashReport()

    def add(self, sig: np.ndarray) -> bool:
        c = self.config
        if sig.shape != (c.num_perm,):
            raise DataError(f"minhash signature has shape {sig.shape}, expected ({c.num_perm},)")
        self.report.documents += 1
        bands = [sig[i * c.rows : (i + 1) * c.rows].tobytes() for i in range(c.bands)]
        seen: set[int] = set()
        for buckets, band in zip(self._buckets, bands, strict=True):
            for key in buckets.get(band, ()):
                if key in seen:
                    continue
                seen.add(key)
                if np.count_nonzero(self._kept[key] == sig) >= c.threshold * c.num_perm:
                    self._count_removed(key)
                    return False
        key = len(self._kept)
        self._kept.append(sig)
        for buckets, band in zip(self._buckets, bands, strict=True):
            buckets.setdefault(band, []).append(key)
        return True

    def _count_removed(self, key: int) -> None:
        r = self.report
        r.removed += 1
        size = r._sizes.get(key, 1) + 1
        if size == 2:
            r.clusters += 1
        r._sizes[key] = size
        r.largest_cluster = max(r.largest_cluster, size)
