"""Near-duplicate removal with MinHash LSH (datasketch), FineWeb's settings by default: word
5-gram shingles of the normalised text (lowercase, punctuation to spaces, whitespace collapsed),
14 bands x 8 rows = 112 permutations. A document whose LSH bucket holds an earlier kept document
is a candidate duplicate; it is removed when the signatures' estimated Jaccard similarity is at
least `threshold` (0.7; FineWeb removes every candidate, threshold 0). The check keeps
documents below Jaccard 0.5, which share a band with probability up to 5% at 14 x 8, from being
removed, and costs almost nothing at Jaccard 0.8 (the estimate over 112 permutations has a
standard deviation of about 0.04 there).

Signatures are computed in worker processes, the LSH index lives in this one; the first
occurrence of a cluster is kept, so the result does not depend on the number of workers.
"""

import multiprocessing
import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
from datasketch import LeanMinHash, MinHash, MinHashLSH

from ats_data.errors import DataError

_NON_WORD = re.compile(r"[^\w\s]|_")
_CHUNK_DOCS = 256
_SCHEME = "affine32"  # datasketch 2: 32-bit hash values, an affine permutation family


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


def shingles(text: str, ngram: int) -> set[bytes]:
    """The set of word n-grams of the normalised text (one shingle of all words when shorter)."""
    words = _NON_WORD.sub(" ", text.lower()).split()
    if len(words) <= ngram:
        return {" ".join(words).encode()}
    return {" ".join(words[i : i + ngram]).encode() for i in range(len(words) - ngram + 1)}


def signature(text: str, config: MinHashConfig) -> np.ndarray:
    m = MinHash(num_perm=config.num_perm, seed=config.seed, scheme=_SCHEME)
    m.update_batch(shingles(text, config.ngram))
    return m.hashvalues


def _signatures(args: tuple[list[str], MinHashConfig]) -> list[np.ndarray]:
    texts, config = args
    return [signature(t, config) for t in texts]


def signatures(texts: Iterable[str], config: MinHashConfig, workers: int) -> Iterator[np.ndarray]:
    """Signatures of `texts` in input order, computed by `workers` processes."""
    if workers == 1:
        for t in texts:
            yield signature(t, config)
        return
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers) as pool:
        pending: deque = deque()
        chunk: list[str] = []
        for t in texts:
            chunk.append(t)
            if len(chunk) == _CHUNK_DOCS:
                pending.append(pool.apply_async(_signatures, ((chunk, config),)))
                chunk = []
                if len(pending) >= 2 * workers:
                    yield from pending.popleft().get()
        if chunk:
            pending.append(pool.apply_async(_signatures, ((chunk, config),)))
        while pending:
            yield from pending.popleft().get()


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
    """`add(sig)` says whether a document with this signature is new (and remembers it)."""

    def __init__(self, config: MinHashConfig | None = None) -> None:
        self.config = config = config or MinHashConfig()
        self._lsh = MinHashLSH(num_perm=config.num_perm, params=(config.bands, config.rows))
        self._kept: list[LeanMinHash] = []
        self.report = MinHashReport()

    def add(self, hashvalues: np.ndarray) -> bool:
        self.report.documents += 1
        m = LeanMinHash(seed=self.config.seed, hashvalues=hashvalues, scheme=_SCHEME)
        for key in self._lsh.query(m):
            if self._kept[key].jaccard(m) >= self.config.threshold:
                self._count_removed(key)
                return False
        self._lsh.insert(len(self._kept), m, check_duplication=False)
        self._kept.append(m)
        return True

    def _count_removed(self, key: int) -> None:
        r = self.report
        r.removed += 1
        size = r._sizes.get(key, 1) + 1
        if size == 2:
            r.clusters += 1
        r._sizes[key] = size
        r.largest_cluster = max(r.largest_cluster, size)
