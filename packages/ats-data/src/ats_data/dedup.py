"""Exact deduplication by content hash (sha256 or blake2b over the UTF-8 bytes of the cleaned
document). The digest also drives the train/val split (split.py)."""

import hashlib

from ats_data.errors import DataError

HASH_ALGOS = ("sha256", "blake2b")


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
