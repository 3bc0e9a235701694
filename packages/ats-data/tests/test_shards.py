"""Shards written by prepare against a plain reference pipeline and the real tokenizer: the
tokens of each split are the cleaned, deduplicated documents encoded and joined with EOS; the
index matches the files; 2 workers give the same bytes as 1; uint16/uint32 choice."""

import hashlib
import json
import unicodedata

import ats_data.shards
import numpy as np
import pytest
from ats_data.dataset import ShardDataset
from ats_data.errors import DataError
from ats_data.prepare import prepare
from ats_data.shards import INDEX_NAME, ShardWriter, token_dtype_name, write_index
from ats_data.sources import open_source

EXTRA_DOCS = [
    "duplicate paragraph",
    "duplicate paragraph",
    "x",  # shorter than min_chars
    "",
    "caf\u0065\u0301 \x00with\r\ncontrols\x1b and\ttab",
    "text that spells <|endoftext|> stays text",
    "duplicate paragraph",
    "日本語のテキスト ünïcödé",
]
MIN_CHARS = 2
VAL_FRACTION = 0.1


def corpus_documents() -> list[str]:
    docs = [p for text in open_source("stdlib:email") for p in text.split("\n\n")]
    return docs + EXTRA_DOCS


def reference_clean(doc: str) -> str:
    kept = "".join(c for c in doc if c in "\n\t" or unicodedata.category(c) != "Cc")
    return unicodedata.normalize("NFC", kept)


def reference_splits(docs: list[str]) -> dict[str, list[str]]:
    """Clean, filter, dedup and split, written out plainly."""
    out: dict[str, list[str]] = {"train": [], "val": []}
    seen = set()
    for doc in docs:
        text = reference_clean(doc)
        digest = hashlib.sha256(text.encode()).digest()
        if len(text) < MIN_CHARS or digest in seen:
            continue
        seen.add(digest)
        frac = int.from_bytes(digest[:8], "big") / 2**64
        out["val" if frac < VAL_FRACTION else "train"].append(text)
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for doc in corpus_documents():
            f.write(json.dumps({"text": doc}) + "\n")
    return path


def prepare_corpus(corpus, tokenizer_path, out, workers):
    return prepare(
        corpus,
        tokenizer_path,
        out,
        val_fraction=VAL_FRACTION,
        workers=workers,
        min_chars=MIN_CHARS,
        shard_tokens=20_000,
    )


@pytest.fixture(scope="module")
def prepared(corpus, tokenizer_path, tmp_path_factory):
    return prepare_corpus(corpus, tokenizer_path, tmp_path_factory.mktemp("one_worker"), 1)


def split_tokens(ds: ShardDataset, split: str) -> np.ndarray:
    return np.concatenate([np.asarray(m) for m in ds.shards(split)]).astype(np.int64)


def test_tokens_are_the_cleaned_documents_joined_with_eos(prepared, tokenizer):
    ds = ShardDataset(prepared)
    expected = reference_splits(corpus_documents())
    assert len(expected["val"]) > 20 and len(expected["train"]) > 200
    for split, docs in expected.items():
        tokens = split_tokens(ds, split)
        reference = [t for doc in docs for t in [*tokenizer.encode_ordinary(doc), tokenizer.eos_id]]
        np.testing.assert_array_equal(tokens, reference)
        assert tokenizer.decode(tokens.tolist()) == "".join(d + "<|endoftext|>" for d in docs)
        assert [tokenizer.decode(d[:-1].tolist()) for d in ds.documents(split)] == docs
        # the literal "<|endoftext|>" inside a document is text, not a separator
        assert int((tokens == tokenizer.eos_id).sum()) == len(docs)


def test_index_describes_the_files(prepared, tokenizer):
    index = json.loads((prepared / INDEX_NAME).read_text())
    assert index["format"] == "ats-data/shards" and index["version"] == 1
    assert index["tokenizer"] == {
        "sha256": tokenizer.sha256(),
        "vocab_size": tokenizer.vocab_size,
        "eos_id": tokenizer.eos_id,
    }
    assert index["dtype"] == "uint16"
    cleaned = [reference_clean(d) for d in corpus_documents()]
    long_enough = [c for c in cleaned if len(c) >= MIN_CHARS]
    assert index["stats"] == {
        "documents_read": len(cleaned),
        "dropped_short": len(cleaned) - len(long_enough),
        "dropped_long": 0,
        "dropped_repetition": {},  # repetition and PII filters are off by default
        "pii_replaced": {},
        "duplicates": len(long_enough) - len(set(long_enough)),
        "near_duplicates": 0,  # the default dedup is exact only
        "skipped": {},
        "licences": {"unknown": len(set(long_enough))},  # JSONL records carry no licence
        "sources": {"jsonl": len(set(long_enough))},
    }
    assert index["stats"]["duplicates"] >= 2 and index["stats"]["dropped_short"] >= 2
    for split, entry in index["splits"].items():
        assert len(entry["shards"]) >= (3 if split == "train" else 1)
        for shard in entry["shards"]:
            data = (prepared / shard["file"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == shard["sha256"]
            tokens = np.frombuffer(data, dtype="<u2")
            assert len(tokens) == shard["num_tokens"]
            assert shard["num_tokens"] <= 20_000 or shard["num_docs"] == 1
            # documents never span shards: each starts at 0 or right after an EOS
            ends = np.flatnonzero(tokens == tokenizer.eos_id)
            assert ends[-1] == len(tokens) - 1
            assert shard["doc_offsets"] == [0, *(ends[:-1] + 1).tolist()]
            assert shard["num_docs"] == len(ends)
        assert entry["num_tokens"] == sum(s["num_tokens"] for s in entry["shards"])
    assert not list(prepared.glob(".*tmp*"))


def test_two_workers_write_the_same_bytes_as_one(
    corpus, tokenizer_path, prepared, tmp_path, monkeypatch
):
    monkeypatch.setattr(ats_data.shards, "_CHUNK_DOCS", 16)  # many chunks in flight
    parallel = prepare_corpus(corpus, tokenizer_path, tmp_path, 2)
    one = json.loads((prepared / INDEX_NAME).read_text())
    two = json.loads((parallel / INDEX_NAME).read_text())
    assert one == two
    for split in one["splits"].values():
        for shard in split["shards"]:
            assert (prepared / shard["file"]).read_bytes() == (
                parallel / shard["file"]
            ).read_bytes()


def test_dtype_choice():
    assert token_dtype_name(256) == "uint16"
    assert token_dtype_name(65536) == "uint16"  # ids 0..65535 fit
    assert token_dtype_name(65537) == "uint32"
    assert token_dtype_name(200_000) == "uint32"


def test_uint32_shards_round_trip(tmp_path, make_token_dataset):
    rng = np.random.default_rng(0)
    eos = 99_999
    docs = [np.append(rng.integers(0, eos, size=n), eos) for n in (5, 70, 1, 300)]
    make_token_dataset(tmp_path, {"train": docs}, vocab_size=100_000, eos_id=eos, shard_tokens=100)
    ds = ShardDataset(tmp_path)
    assert ds.dtype == np.dtype("<u4")
    assert max(int(m.max()) for m in ds.shards("train")) > 65535
    assert [d.tolist() for d in ds.documents("train")] == [d.tolist() for d in docs]


def test_index_write_is_atomic(tmp_path):
    write_index(tmp_path, {"format": "first"})
    with pytest.raises(TypeError):
        write_index(tmp_path, {"format": object()})  # fails halfway through serializing
    assert json.loads((tmp_path / INDEX_NAME).read_text()) == {"format": "first"}
    assert [p.name for p in tmp_path.iterdir()] == [INDEX_NAME]


def test_writer_rejects_ids_outside_the_dtype(tmp_path):
    writer = ShardWriter(tmp_path, "train", "uint16", 100)
    writer.add(np.array([1, 65535]))
    with pytest.raises(DataError, match="train document 1: token ids must be .* in \\[0, 65535\\]"):
        writer.add(np.array([65536]))
