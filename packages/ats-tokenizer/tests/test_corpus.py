"""Streaming input: chunked file reading equals reading whole files (for both named patterns),
special tokens are cut out of training text, bad files give clear errors."""

from collections import Counter

import pytest
from ats_tokenizer import GPT2_PATTERN, GPT4_PATTERN, Tokenizer
from ats_tokenizer.corpus import iter_batches, iter_file_chunks
from ats_tokenizer.pretokenize import pretokenize
from ats_tokenizer_inputs import STDLIB, any_text
from hypothesis import given, settings
from hypothesis import strategies as st


@pytest.mark.parametrize("pattern", [GPT4_PATTERN, GPT2_PATTERN], ids=["gpt4", "gpt2"])
def test_chunked_counts_equal_whole_file_counts(tmp_path, pattern):
    files = sorted(STDLIB.glob("*.py"))[:6]
    chunks = list(iter_file_chunks(files, chunk_chars=2000))
    assert len(chunks) > 6 * 2  # really chunked
    whole = [f.read_text(encoding="utf-8") for f in files]
    assert "".join(chunks) == "".join(whole)
    assert Counter(p for c in chunks for p in pretokenize(c, pattern)) == Counter(
        p for t in whole for p in pretokenize(t, pattern)
    )


@settings(max_examples=100, deadline=None)
@given(text=st.lists(any_text, max_size=8).map("\n".join), chunk=st.integers(1, 40))
def test_chunking_never_changes_pre_tokens(tmp_path_factory, text, chunk):
    path = tmp_path_factory.mktemp("c") / "t.txt"
    path.write_bytes(text.encode("utf-8"))
    chunks = list(iter_file_chunks([path], chunk_chars=chunk))
    assert "".join(chunks) == text
    for pattern in (GPT4_PATTERN, GPT2_PATTERN):
        assert [p for c in chunks for p in pretokenize(c, pattern)] == pretokenize(text, pattern)


def test_train_from_files_equals_train_on_texts(tmp_path):
    files = sorted(STDLIB.glob("*.py"))[:4]
    texts = [f.read_text(encoding="utf-8") for f in files]
    from_files = Tokenizer.train_from_files(files, 600, backend="python")
    assert from_files.merges == Tokenizer.train(texts, 600, backend="python").merges


def test_special_tokens_are_cut_out_of_training_text():
    batches = list(iter_batches(["a<|endoftext|>b", "<|endoftext|>", "c"], ["<|endoftext|>"]))
    assert batches == [["a", "b", "c"]]
    tok = Tokenizer.train(["<|endoftext|>"] * 50, 300, backend="python")
    assert tok.merges == ()  # nothing learned from the special string


def test_bad_files_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        list(iter_file_chunks([tmp_path / "missing.txt"]))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"hello \xff world")
    with pytest.raises(ValueError, match=r"not valid UTF-8 \(near byte 6\)"):
        list(iter_file_chunks([bad]))
    with pytest.raises(TypeError, match="training text 1 is bytes"):
        Tokenizer.train(["ok", b"bytes"], 300)
