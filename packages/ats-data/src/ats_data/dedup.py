"""Deduplication: exact (content hash, sha256 or blake2b over the UTF-8 bytes of the cleaned
document; the digest also drives the train/val split, split.py) and near-duplicate (MinHash LSH,
minhash.py). `dedup_documents` applies a mode to a stream of documents."""

import hashlib
from collections import deque
from collections.abc import Iterable, Iterator

from ats_data.document import Document
from ats_data.errors import DataError
from ats_data.minhash import MinHashConfig, MinHashDeduper, MinHashReport, signatures

HASH_ALGOS = ("sha256", "blake2b")
DEDUP_MODES = ("exact", "minhash", "none")  # minhash runs after exact


def document_digest(text: str, algo: str = "sha256") -> bytes:
    """32-byte content digest of a document."""
    data = text.encode("utf-8")
    if algo == "sha256":
        return hashlib.sha256(data).digest()
    if algo == "blake2b":
        return hashlib.blake2b(data, digest_size=32).digest()
    raise DataError(f"unknown hash algorithm {algo!r} (expected one of {', '.join(HASH_ALGOS)})")


class ExactDeduper:
    """Remembers the digests seen so far; `add` says whether a document is new."""

    def __init__(self) -> None:
        self._seen: set[bytes] = set()
        self.duplicates = 0

    def add(self, digest: bytes) -> bool:
        if digest in self._seen:
            self.duplicates += 1
            return False
        self._seen.add(digest)
        return True


def check_dedup_mode(mode: str) -> None:
    if mode not in DEDUP_MODES:
        raise DataError(f"dedup must be one of {', '.join(DEDUP_MODES)}, got {mode!r}")


class Dedup:
    """Exact, then (mode "minhash") near-duplicate removal over a document stream; the counts
    are in `exact_duplicates` and `minhash` after the stream is consumed."""

    def __init__(self, mode: str, config: MinHashConfig | None = None, workers: int = 1):
        check_dedup_mode(mode)
        self.mode = mode
        self.exact = ExactDeduper()
        self.near = MinHashDeduper(config or MinHashConfig()) if mode == "minhash" else None
        self.workers = workers

    @property
    def minhash(self) -> MinHashReport | None:
        return self.near.report if self.near is not None else None

    def __call__(self, docs: Iterable[Document]) -> Iterator[Document]:
        if self.mode == "none":
            yield from docs
            return
        unique = (d for d in docs if self.exact.add(document_digest(d.text)))
        if self.near is None:
            yield from unique
            return
        # Signatures come back in input order: pair them with the documents they belong to.
        pending: deque[Document] = deque()

        def texts() -> Iterator[str]:
            for d in unique:
                pending.append(d)
                yield d.text

        for sig in signatures(texts(), self.near.config, self.workers):
            doc = pending.popleft()
            if self.near.add(sig):
                yield doc
