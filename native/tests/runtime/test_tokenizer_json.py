"""ats_native.Tokenizer (tokenizer.json read in C++) produces exactly ats_tokenizer's ids on the
standard library's sources and on generated strings, and decodes back to the same bytes."""

import json
import sysconfig
from pathlib import Path

import ats_native
import pytest
from ats_tokenizer import Tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def stdlib_texts(n: int) -> list[str]:
    files = sorted(STDLIB.glob("*.py"))[:n]
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


@pytest.fixture(scope="module", params=["gpt4", "gpt2"])
def tokenizers(request, tmp_path_factory) -> tuple[Tokenizer, ats_native.Tokenizer]:
    from ats_tokenizer.pretokenize import GPT2_PATTERN, GPT4_PATTERN

    pattern = GPT4_PATTERN if request.param == "gpt4" else GPT2_PATTERN
    ref = Tokenizer.train(stdlib_texts(25), 1200, pattern=pattern)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    ref.save(path)
    return ref, ats_native.Tokenizer(str(path))


def test_stdlib_ids_equal(tokenizers) -> None:
    ref, native = tokenizers
    assert native.vocab_size == ref.vocab_size
    for text in stdlib_texts(60)[25:]:  # files the tokenizer was not trained on
        assert native.encode(text) == ref.encode_ordinary(text)


def test_decode_round_trip(tokenizers) -> None:
    ref, native = tokenizers
    text = stdlib_texts(3)[2]
    ids = native.encode(text)
    assert native.decode(ids) == text.encode("utf-8") == ref.decode_bytes(ids)
    eos = ref.special_tokens["<|endoftext|>"]
    assert native.decode([eos]) == b"<|endoftext|>"
    with pytest.raises(ValueError, match="not in the vocabulary"):
        native.decode([ref.vocab_size])


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=80))
def test_generated_strings(tokenizers, text: str) -> None:
    ref, native = tokenizers
    assert native.encode(text) == ref.encode_ordinary(text)


def test_lone_surrogate_and_bad_files(tokenizers, tmp_path: Path) -> None:
    ref, native = tokenizers
    with pytest.raises(ValueError, match="surrogate"):
        native.encode("a\ud800b")
    data = json.loads(ref.to_json())
    data["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\w+"
    (tmp_path / "a.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="gpt4 and gpt2 patterns"):
        ats_native.Tokenizer(str(tmp_path / "a.json"))
    data = json.loads(ref.to_json())
    data["model"]["merges"][3] = ["zzz-not-a-token", "x"]
    (tmp_path / "b.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"model.merges\[3\]"):
        ats_native.Tokenizer(str(tmp_path / "b.json"))
    (tmp_path / "c.json").write_text(ref.to_json()[:-40])
    with pytest.raises(ValueError, match="invalid JSON"):
        ats_native.Tokenizer(str(tmp_path / "c.json"))
    data = json.loads(ref.to_json())  # an id far past the table (fuzzing: a 4 GB allocation)
    data["added_tokens"][0]["id"] = 1_000_000_000
    (tmp_path / "d.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="token id 1000000000 is not below"):
        ats_native.Tokenizer(str(tmp_path / "d.json"))


def test_ascii_escaped_file_reads_the_same(tokenizers, tmp_path: Path) -> None:
    """HF writes tokenizer.json with \\uXXXX escapes (json ensure_ascii): same vocabulary."""
    ref, native = tokenizers
    data = json.loads(ref.to_json())
    path = tmp_path / "escaped.json"
    path.write_text(json.dumps(data, ensure_ascii=True))
    assert "\\u0120" in path.read_text()
    escaped = ats_native.Tokenizer(str(path))
    text = "é ü — 漢字 and  spaces\n\tnew lines 😀"
    assert escaped.encode(text) == native.encode(text) == ref.encode_ordinary(text)
