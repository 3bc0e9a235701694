"""Tokenizer: ATS trains, HF `tokenizers` loads the saved file and encodes identically; round trips;
python and native backends agree; batch encoding; id layout; clear errors on bad input."""

import hashlib
import importlib.util
import os
import pickle

import pytest
from ats_tokenizer import GPT4_PATTERN, Tokenizer
from ats_tokenizer_inputs import any_text, oracle_text
from hypothesis import given, settings
from tokenizers import Tokenizer as HFTokenizer

HAS_NATIVE = importlib.util.find_spec("ats_native") is not None
needs_native = pytest.mark.skipif(not HAS_NATIVE, reason="ats_native is not built")


@pytest.fixture(scope="module")
def hf_of(tmp_path_factory):
    cache = {}

    def load(tok: Tokenizer) -> HFTokenizer:
        if id(tok) not in cache:
            path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
            tok.save(path)
            cache[id(tok)] = HFTokenizer.from_file(str(path))
        return cache[id(tok)]

    return load


@settings(max_examples=120, deadline=None)
@given(text=oracle_text)
def test_hf_loads_ours_and_encodes_identically(trained, hf_of, text):
    ids = trained.encode(text, allowed_special="all")
    assert ids == hf_of(trained).encode(text).ids
    assert trained.decode(ids) == text
    assert hf_of(trained).decode(ids, skip_special_tokens=False) == text


def test_hf_parity_on_held_out_source(trained, hf_of, held_out_texts):
    for text in held_out_texts:
        ids = trained.encode_ordinary(text)
        assert ids == hf_of(trained).encode(text).ids
        assert trained.decode(ids) == text
    assert hf_of(trained).get_vocab_size() == trained.vocab_size


def test_id_layout(trained):
    assert trained.byte_ids == tuple(range(256))
    assert [m[2] for m in trained.merges] == list(range(256, 256 + len(trained.merges)))
    n = 256 + len(trained.merges)
    assert trained.special_tokens == {
        "<|endoftext|>": n,
        "<|im_start|>": n + 1,
        "<|im_end|>": n + 2,
    }
    assert trained.vocab_size == 1024 and trained.eos_id == n


@settings(max_examples=60, deadline=None)
@given(text=any_text)
def test_decode_encode_round_trip_any_unicode(trained, text):
    assert trained.decode(trained.encode_ordinary(text)) == text


def test_encode_batch_python_process_pool(trained, held_out_texts):
    texts = [t[:3000] for t in held_out_texts] + ["", "a<|endoftext|>b"]
    expected = [trained.encode(t, allowed_special="all") for t in texts]
    assert trained.backend == "python"
    assert trained.encode_batch(texts, allowed_special="all", num_threads=2) == expected
    assert trained.encode_batch(texts, allowed_special="all", num_threads=1) == expected


def test_save_load_round_trip_and_hash(trained, tmp_path):
    path = tmp_path / "tok.json"
    trained.save(path)
    loaded = Tokenizer.load(path, backend="python")
    assert loaded.merges == trained.merges and loaded.special_tokens == trained.special_tokens
    assert loaded.pattern == trained.pattern
    assert loaded.sha256() == trained.sha256() == hashlib.sha256(path.read_bytes()).hexdigest()
    clone = pickle.loads(pickle.dumps(trained))
    assert clone.sha256() == trained.sha256()


@needs_native
@settings(max_examples=150, deadline=None)
@given(text=any_text)
def test_native_backend_equals_python(trained, text):
    native = _native_twin(trained)
    assert native.backend == "native"
    assert native.encode(text, allowed_special="all") == trained.encode(text, allowed_special="all")


@needs_native
def test_native_batch_equals_python(trained, held_out_texts):
    native = _native_twin(trained)
    texts = held_out_texts + ["", "x<|im_end|>y"]
    expected = [trained.encode(t, allowed_special="all") for t in texts]
    assert native.encode_batch(texts, allowed_special="all", num_threads=2) == expected


_twins: dict[int, Tokenizer] = {}


def _native_twin(tok: Tokenizer) -> Tokenizer:
    if id(tok) not in _twins:
        _twins[id(tok)] = Tokenizer(
            tok.byte_ids, tok.merges, tok.special_tokens, tok.pattern, backend="native"
        )
    return _twins[id(tok)]


def test_vocab_too_small_is_a_clear_error():
    with pytest.raises(ValueError, match=r"vocab_size=257 is too small.*= 258"):
        Tokenizer.train(["abc"], 257, special_tokens=("<|a|>", "<|b|>"))


def test_decode_out_of_range_is_a_clear_error(trained):
    with pytest.raises(ValueError, match=r"token id 1024 is out of range \[0, 1024\)"):
        trained.decode([1, 1024])
    with pytest.raises(ValueError, match=r"token id -1 is out of range"):
        trained.decode_bytes([-1])
    with pytest.raises(TypeError):
        trained.decode([1.5])


def test_lone_surrogate_in_encode_is_a_clear_error(trained):
    with pytest.raises(ValueError, match="lone surrogate at index 2"):
        trained.encode("ab\udfffcd")
    with pytest.raises(ValueError, match="lone surrogate at index 0"):
        trained.encode_batch(["ok", "\ud800"])


def test_encode_batch_threads_are_bounded(trained):
    """4 per CPU at most (100000 once started >32k threads), on either backend."""
    limit = 4 * os.cpu_count()
    for bad in (0, -1, limit + 1, 100_000):
        with pytest.raises(ValueError, match=rf"num_threads = {bad}: expected 1 to {limit}"):
            trained.encode_batch(["ok"], num_threads=bad)
    assert trained.encode_batch(["ok"], num_threads=limit) == [trained.encode("ok")]


def test_training_on_one_string_is_an_error():
    with pytest.raises(TypeError, match="not one string"):
        Tokenizer.train("a corpus passed as one str", 300)


def test_eos_missing_is_a_clear_error():
    tok = Tokenizer.train(["hello world"] * 3, 300, special_tokens=(), backend="python")
    with pytest.raises(ValueError, match="no '<\\|endoftext\\|>' special token"):
        _ = tok.eos_id


def test_constructor_rejects_gaps_and_bad_specials():
    with pytest.raises(ValueError, match="without gaps; missing \\[256\\]"):
        Tokenizer(range(256), [], {"<|x|>": 257}, GPT4_PATTERN)
    with pytest.raises(ValueError, match="already a BPE token"):
        Tokenizer(range(256), [], {"<|x|>": 5}, GPT4_PATTERN)
