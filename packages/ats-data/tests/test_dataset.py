"""ShardDataset opens a valid folder and rejects a missing, truncated or corrupted one with an
error that names the file."""

import json

import numpy as np
import pytest
from ats_data.dataset import ShardDataset
from ats_data.errors import DataError
from ats_data.shards import INDEX_NAME, write_index

EOS = 9


@pytest.fixture
def folder(tmp_path, make_token_dataset):
    docs = {"train": [np.array([1, 2, 3, EOS]), np.array([4, EOS])], "val": [np.array([5, 6, EOS])]}
    return make_token_dataset(tmp_path, docs, vocab_size=10, eos_id=EOS)


def edit_index(folder, edit):
    index = json.loads((folder / INDEX_NAME).read_text())
    edit(index)
    write_index(folder, index)


def test_opens_a_valid_folder(folder):
    ds = ShardDataset(folder)
    assert ds.splits == ("train", "val")
    assert ds.num_tokens("train") == 6 and ds.num_docs("train") == 2
    assert [d.tolist() for d in ds.documents("train")] == [[1, 2, 3, EOS], [4, EOS]]
    assert [o.tolist() for o in ds.doc_offsets("train")] == [[0, 4]]
    assert (ds.vocab_size, ds.eos_id, ds.dtype) == (10, EOS, np.dtype("<u2"))
    assert not ds.shards("train")[0].flags.writeable


def test_missing_folder_and_missing_index(tmp_path):
    with pytest.raises(DataError, match=r"dataset folder not found: .*nope"):
        ShardDataset(tmp_path / "nope")
    with pytest.raises(DataError, match=r"index\.json not found \(not a prepared dataset"):
        ShardDataset(tmp_path)


def test_truncated_shard_names_the_file(folder):
    shard = folder / "train-00000.bin"
    shard.write_bytes(shard.read_bytes()[:-1])
    with pytest.raises(
        DataError,
        match=r"shard .*train-00000\.bin is 11 bytes, expected 12 "
        r"\(6 tokens x 2 bytes\): truncated",
    ):
        ShardDataset(folder, verify=False)


def test_corrupted_shard_fails_the_sha256_check(folder):
    shard = folder / "val-00000.bin"
    data = bytearray(shard.read_bytes())
    data[0] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(
        DataError,
        match=r"shard .*val-00000\.bin is corrupted: sha256 [0-9a-f]{64} "
        r"!= [0-9a-f]{64} in the index",
    ):
        ShardDataset(folder)
    ShardDataset(folder, verify=False)  # sizes still match: only the hash sees it


def test_missing_shard(folder):
    (folder / "val-00000.bin").unlink()
    with pytest.raises(DataError, match=r"shard .*val-00000\.bin not found"):
        ShardDataset(folder)


def test_document_without_eos(folder):
    edit_index(folder, lambda ix: ix["tokenizer"].update(eos_id=3))
    with pytest.raises(DataError, match=r"train-00000\.bin: document 0 does not end with EOS id 3"):
        ShardDataset(folder)


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda ix: ix.update(version=99), "version 99, this ats-data reads 1"),
        (lambda ix: ix.update(format="other"), "format 'other', expected 'ats-data/shards'"),
        (lambda ix: ix.update(dtype="float32"), "dtype 'float32', expected one of"),
        (lambda ix: ix.pop("splits"), "missing field 'splits'"),
        (lambda ix: ix["tokenizer"].update(vocab_size="10"), "field 'vocab_size' has type str"),
        (
            lambda ix: ix["tokenizer"].update(vocab_size=70000),
            r"vocab_size 70000 must be in \[1, 65536\] \(dtype uint16\)",
        ),
        (lambda ix: ix["tokenizer"].update(vocab_size=-1), r"vocab_size -1 must be in \[1, "),
        (
            lambda ix: ix["tokenizer"].update(eos_id=10),
            r"eos_id 10 must be in \[0, vocab_size 10\)",
        ),
        (lambda ix: ix["tokenizer"].update(eos_id=-1), r"eos_id -1 must be in \[0, vocab_size"),
        (lambda ix: ix["splits"]["train"]["shards"][0].update(file="../x.bin"), "plain file name"),
        (
            lambda ix: ix["splits"]["train"]["shards"][0].update(doc_offsets=[0, 7]),
            "doc_offsets end",
        ),
        (lambda ix: ix["splits"]["train"]["shards"][0].update(doc_offsets=[1]), "must start at 0"),
        # a ValueError, an OverflowError, or a silent cast (nested, bool) before
        *(
            (
                lambda ix, bad=bad: ix["splits"]["train"]["shards"][0].update(doc_offsets=bad),
                r"doc_offsets must be a non-empty list of integers in \[0, 2\*\*63\)",
            )
            for bad in ([0, "a"], [0, 1.5], [[0], [4]], [0, True], [], [0, 2**63 + 5], [-1, 2])
        ),
    ],
)
def test_malformed_index_fields(folder, edit, message):
    edit_index(folder, edit)
    with pytest.raises(DataError, match=message):
        ShardDataset(folder)


def test_index_not_json(folder):
    (folder / INDEX_NAME).write_text("{not json")
    with pytest.raises(DataError, match=r"index\.json: not valid JSON at line 1 column 2"):
        ShardDataset(folder)
    (folder / INDEX_NAME).write_text("[" * 100_000 + "]" * 100_000)  # a RecursionError before
    with pytest.raises(DataError, match=r"index\.json: not valid JSON for this reader: .* nested"):
        ShardDataset(folder)
    (folder / INDEX_NAME).write_bytes(b'{"format": "\xff"}')
    with pytest.raises(DataError, match=r"index\.json: not UTF-8 text \(byte 0xff at offset 12\)"):
        ShardDataset(folder)
    (folder / INDEX_NAME).write_text("[]")
    with pytest.raises(DataError, match=r"index\.json: expected a JSON object, got list"):
        ShardDataset(folder)
