"""Exact dedup by content hash: hashlib is the oracle; first occurrence wins."""

import hashlib

import pytest
from ats_data.dedup import ExactDeduper, document_digest
from ats_data.errors import DataError


def test_digests_match_hashlib():
    text = "héllo\n"
    assert document_digest(text, "sha256") == hashlib.sha256(text.encode()).digest()
    assert (
        document_digest(text, "blake2b") == hashlib.blake2b(text.encode(), digest_size=32).digest()
    )
    with pytest.raises(DataError, match="unknown hash algorithm 'md5'"):
        document_digest(text, "md5")


@pytest.mark.parametrize("algo", ["sha256", "blake2b"])
def test_keeps_first_occurrence_in_order(algo):
    docs = ["a", "b", "a", "c", "b", "a", "a "]
    deduper = ExactDeduper()
    kept = [d for d in docs if deduper.add(document_digest(d, algo))]
    assert kept == list(dict.fromkeys(docs))
    assert deduper.duplicates == 3
