"""prepare: the cache key reuses shards for the same inputs and refuses to mix datasets; errors
leave nothing half-written."""

import json
import os
import re

import pytest
from ats_data.dataset import ShardDataset
from ats_data.errors import DataError
from ats_data.prepare import prepare
from ats_data.shards import INDEX_NAME
from ats_tokenizer import Tokenizer


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "src" / "book.txt"
    path.parent.mkdir()
    path.write_text("\n\n".join(f"paragraph {i}: " + "words " * (i % 13) for i in range(300)))
    return path


def shard_stats(folder):
    return {p.name: p.stat().st_mtime_ns for p in sorted(folder.glob("*.bin"))}


def test_same_inputs_reuse_the_shards(text_file, tokenizer_path, tmp_path):
    out = tmp_path / "out"
    assert prepare(text_file, tokenizer_path, out, val_fraction=0.1, workers=1) == out
    before = shard_stats(out)
    index_before = (out / INDEX_NAME).read_text()
    assert prepare(str(text_file), tokenizer_path, out, val_fraction=0.1, workers=2) == out
    assert shard_stats(out) == before
    assert (out / INDEX_NAME).read_text() == index_before
    ds = ShardDataset(out)
    assert ds.num_docs("train") + ds.num_docs("val") == 300
    assert Tokenizer.load(out / "tokenizer.json").sha256() == ds.tokenizer_sha256
    assert 10 < ds.num_docs("val") < 60


def test_other_inputs_are_refused_unless_overwrite(text_file, tokenizer_path, tmp_path):
    out = tmp_path / "out"
    prepare(text_file, tokenizer_path, out, val_fraction=0.1, workers=1)
    with pytest.raises(DataError, match="already holds a dataset prepared from other inputs"):
        prepare(text_file, tokenizer_path, out, val_fraction=0.2, workers=1)
    text_file.write_text(text_file.read_text() + "\n\nnew paragraph")  # source changed
    with pytest.raises(DataError, match="already holds a dataset prepared from other inputs"):
        prepare(text_file, tokenizer_path, out, val_fraction=0.1, workers=1)
    prepare(text_file, tokenizer_path, out, val_fraction=0.1, workers=1, overwrite=True)
    ds = ShardDataset(out)
    assert ds.num_docs("train") + ds.num_docs("val") == 301


def test_another_tokenizer_changes_the_key(text_file, tokenizer_path, tmp_path):
    other = Tokenizer.train([text_file.read_text()], vocab_size=300)
    other_path = tmp_path / "other.json"
    other.save(other_path)
    a = json.loads(
        (prepare(text_file, tokenizer_path, tmp_path / "a", workers=1) / INDEX_NAME).read_text()
    )
    b = json.loads(
        (prepare(text_file, other_path, tmp_path / "b", workers=1) / INDEX_NAME).read_text()
    )
    assert a["cache_key"] != b["cache_key"]
    assert b["tokenizer"]["sha256"] == other.sha256() != a["tokenizer"]["sha256"]


def test_failure_midway_leaves_no_shards_and_no_index(tmp_path, tokenizer_path):
    src = tmp_path / "d.jsonl"
    lines = [json.dumps({"text": f"document {i}"}) for i in range(500)] + ['{"body": "x"}']
    src.write_text("\n".join(lines))
    out = tmp_path / "out"
    with pytest.raises(DataError, match=r"d\.jsonl:501: no field 'text'"):
        prepare(src, tokenizer_path, out, workers=2)
    assert list(out.iterdir()) == []


def test_empty_splits_are_errors(tmp_path, tokenizer_path):
    src = tmp_path / "one.txt"
    src.write_text("a single paragraph")
    # The advice names only what every caller accepts: ats-train requires val_fraction > 0.
    with pytest.raises(
        DataError, match="gave no validation documents: 1 documents, each in val"
    ) as e:
        prepare(src, tokenizer_path, tmp_path / "a", val_fraction=0.05, workers=1)
    assert str(e.value).endswith("use a source with more documents or a larger val_fraction")
    assert "val_fraction=0" not in str(e.value)
    # val_fraction=0 is the explicit way to ask for no validation documents
    prepare(src, tokenizer_path, tmp_path / "b", val_fraction=0.0, workers=1)
    assert ShardDataset(tmp_path / "b").num_docs("val") == 0
    assert ShardDataset(tmp_path / "b").num_docs("train") == 1
    with pytest.raises(DataError, match=r"left no training documents \(1 read, 1 shorter than 100"):
        prepare(src, tokenizer_path, tmp_path / "c", val_fraction=0.0, min_chars=100, workers=1)


def test_bad_arguments(text_file, tokenizer_path, tmp_path):
    with pytest.raises(DataError, match=r"tokenizer '.*missing\.json' does not exist"):
        prepare(text_file, tmp_path / "missing.json", tmp_path / "o")
    with pytest.raises(DataError, match=r"source not found"):
        prepare(tmp_path / "nope", tokenizer_path, tmp_path / "o")
    with pytest.raises(DataError, match=r"val_fraction must be in \[0, 1\), got 1.5"):
        prepare(text_file, tokenizer_path, tmp_path / "o", val_fraction=1.5)
    for workers in (0, 4 * (os.cpu_count() or 1) + 1, 100_000):  # 100000 processes started before
        with pytest.raises(DataError, match=rf"workers must be in \[1, \d+\] .* got {workers}"):
            prepare(text_file, tokenizer_path, tmp_path / "o", workers=workers)
    with pytest.raises(DataError, match="hash_algo must be one of sha256, blake2b"):
        prepare(text_file, tokenizer_path, tmp_path / "o", hash_algo="md5")


def test_bad_tokenizer_files_are_data_errors(text_file, tokenizer_path, tmp_path):
    """Each was a traceback (RecursionError, AttributeError, TokenizerFileError, or a ValueError
    from a worker) or a misleading "not found"; all are DataError naming the file."""
    good = json.loads(tokenizer_path.read_text(encoding="utf-8"))

    def write(name: str, text: str):
        path = tmp_path / name
        path.write_text(text, encoding="utf-8", errors="surrogateescape")  # \udcff: byte 0xff
        return path

    no_eos = dict(good, added_tokens=[])  # the special token is the last id: the rest stays dense
    cases = [
        (write("deep.json", "[" * 100_000 + "]" * 100_000), "deep.json: not valid JSON for this"),
        (write("added.json", json.dumps(dict(good, added_tokens=[1]))), "expected a JSON object"),
        (write("binary.json", "\udcff{}"), "binary.json: not UTF-8 text (byte 0xff at offset 0)"),
        (write("no_eos.json", json.dumps(no_eos)), "has no '<|endoftext|>' special token"),
        (tmp_path, "is a folder, expected a file"),
    ]
    for path, message in cases:
        out = tmp_path / "o"
        with pytest.raises(DataError, match=re.escape(message)):
            prepare(text_file, path, out, workers=1)
        assert not out.exists()


def test_reuse_of_a_corrupted_dataset_is_an_error(text_file, tokenizer_path, tmp_path):
    out = prepare(text_file, tokenizer_path, tmp_path / "out", val_fraction=0.1, workers=1)
    shard = out / "train-00000.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(DataError, match=r"train-00000\.bin is .* truncated.*overwrite=True"):
        prepare(text_file, tokenizer_path, out, val_fraction=0.1, workers=1)
    prepare(text_file, tokenizer_path, out, val_fraction=0.1, workers=1, overwrite=True)
    ShardDataset(out)


def test_a_folder_that_is_not_a_dataset_is_refused(text_file, tokenizer_path, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "train-00000.bin").write_bytes(b"my own file")
    with pytest.raises(DataError, match=r"not empty and holds no ats-data dataset"):
        prepare(text_file, tokenizer_path, out, val_fraction=0.1, workers=1)
    assert (out / "train-00000.bin").read_bytes() == b"my own file"
    assert sorted(p.name for p in out.iterdir()) == ["train-00000.bin"]
    prepare(text_file, tokenizer_path, out, val_fraction=0.1, workers=1, overwrite=True)
    assert ShardDataset(out).num_docs("train") > 0


def test_stats_count_duplicates_licences_and_sources(tokenizer_path, tmp_path):
    src = tmp_path / "d.jsonl"
    base = " ".join(f"word{i}" for i in range(100))
    texts = [f"document number {i} " * 5 for i in range(40)] + [base, base, base + " tail"]
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    index = json.loads(
        (
            prepare(src, tokenizer_path, tmp_path / "o", dedup="minhash", workers=1) / INDEX_NAME
        ).read_text()
    )
    stats = index["stats"]
    assert (stats["documents_read"], stats["duplicates"], stats["near_duplicates"]) == (43, 1, 1)
    assert stats["licences"] == {"unknown": 41} and stats["sources"] == {"jsonl": 41}
    assert index["config"]["dedup"] == "minhash"


def test_stats_count_repetition_drops_and_pii(tokenizer_path, tmp_path):
    src = tmp_path / "d.jsonl"
    texts = [f"note {i}: write to me{i}@example.org about {i} things today" for i in range(30)]
    texts += ["spam spam spam\n" * 5 + "eggs", "buy now " * 10]
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = prepare(src, tokenizer_path, tmp_path / "o", workers=1, repetition_filter=True, pii=True)
    index = json.loads((out / INDEX_NAME).read_text())
    stats = index["stats"]
    assert stats["dropped_repetition"] == {
        "duplicate_line_fraction": 1,
        "top_2gram_char_fraction": 1,
    }
    assert stats["pii_replaced"] == {"email": 30}
    assert (index["config"]["repetition_filter"], index["config"]["pii"]) == (True, True)
    assert stats["sources"] == {"jsonl": 30}
