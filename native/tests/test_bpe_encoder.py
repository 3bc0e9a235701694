"""ats_native.BpeEncoder vs a plain-Python BPE written from the contract (random merge tables and
id assignments), vs tiktoken on ranks trained by ats_native.train_bpe, and its input checks."""

import random
import sysconfig
from pathlib import Path

import ats_native
import pytest
import regex
import tiktoken
from ats_tokenizer.pretokenize import GPT2_PATTERN, GPT4_PATTERN
from hypothesis import given, settings
from hypothesis import strategies as st

PATTERNS = {"gpt4": GPT4_PATTERN, "gpt2": GPT2_PATTERN}


def ref_encode(text: str, byte_ids: list[int], merges: list[tuple[int, int, int]], pattern: str):
    """The contract, literally: per pre-token, merge the lowest-rank pair, leftmost first."""
    ranks = {(left, right): (rank, merged) for rank, (left, right, merged) in enumerate(merges)}
    out = []
    for piece in regex.findall(pattern, text):
        ids = [byte_ids[b] for b in piece.encode("utf-8")]
        while len(ids) > 1:
            found = [
                (ranks[p][0], i)
                for i, p in enumerate(zip(ids, ids[1:], strict=False))
                if p in ranks
            ]
            if not found:
                break
            _, i = min(found)
            ids[i : i + 2] = [ranks[(ids[i], ids[i + 1])][1]]
        out.extend(ids)
    return out


def random_table(seed: int, n_merges: int) -> tuple[list[int], list[tuple[int, int, int]]]:
    """Shuffled byte ids and merges over ids that the test texts produce often."""
    rng = random.Random(seed)
    ids = list(range(5000))
    rng.shuffle(ids)
    byte_ids = ids[:256]
    fresh = iter(ids[256:])
    common = [byte_ids[b] for b in b" 'abst\n\xc3\xa9"]
    known = list(common)
    merges, seen = [], set()
    while len(merges) < n_merges:
        pair = (rng.choice(known), rng.choice(known))
        if pair in seen:
            continue
        seen.add(pair)
        merged = next(fresh)
        merges.append((pair[0], pair[1], merged))
        known.append(merged)
    return byte_ids, merges


texts = st.text(alphabet=st.sampled_from(list(" 'abst\né\u4e2d\U0001f600sS1")), max_size=80)


@pytest.mark.parametrize("name", ["gpt4", "gpt2"])
@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32), n_merges=st.integers(0, 60), text=texts)
def test_matches_plain_python_bpe(name: str, seed: int, n_merges: int, text: str) -> None:
    byte_ids, merges = random_table(seed, n_merges)
    enc = ats_native.BpeEncoder(byte_ids, merges, name)
    assert enc.encode(text) == ref_encode(text, byte_ids, merges, PATTERNS[name])


def test_long_pieces_use_the_same_order() -> None:
    # pre-tokens over 256 bytes take the heap path; it must agree with the linear scan
    byte_ids, merges = random_table(7, 40)
    rng = random.Random(3)
    for _ in range(20):
        text = "".join(rng.choice("aabst") for _ in range(rng.randint(200, 1500)))
        enc = ats_native.BpeEncoder(byte_ids, merges, "gpt4")
        assert enc.encode(text) == ref_encode(text, byte_ids, merges, GPT4_PATTERN)


def test_encode_batch_equals_encode() -> None:
    byte_ids, merges = random_table(11, 50)
    enc = ats_native.BpeEncoder(byte_ids, merges, "gpt2")
    batch = ["", "a", "ab's sat", "tsetse\n\n  ba"] * 25
    expected = [enc.encode(t) for t in batch]
    for threads in (0, 1, 2, 5):
        assert enc.encode_batch(batch, threads=threads) == expected


def stdlib_texts(n_files: int) -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    return [p.read_text("utf-8", errors="replace") for p in files[:n_files]]


@pytest.fixture(scope="module")
def trained() -> tuple[ats_native.BpeEncoder, tiktoken.Encoding]:
    """A 3000-merge BPE trained by ats_native on stdlib source, and tiktoken on the same ranks."""
    counter = ats_native.WordCounter("gpt4")
    counter.add(stdlib_texts(150))
    merges = counter.train(3000, 2)
    token_bytes = [bytes([b]) for b in range(256)]
    for left, right in merges:
        token_bytes.append(token_bytes[left] + token_bytes[right])
    # ids are ranks: bytes are 0..255 and merge i is 256 + i
    assert len(set(token_bytes)) == len(token_bytes), "two merges spell the same bytes"
    ranks = {b: i for i, b in enumerate(token_bytes)}
    tik = tiktoken.Encoding(
        "ats-test", pat_str=GPT4_PATTERN, mergeable_ranks=ranks, special_tokens={}
    )
    merged = [(left, right, 256 + i) for i, (left, right) in enumerate(merges)]
    return ats_native.BpeEncoder(list(range(256)), merged, "gpt4"), tik


def test_matches_tiktoken_on_stdlib(trained) -> None:
    enc, tik = trained
    texts = stdlib_texts(400)[150:]
    assert enc.encode_batch(texts, threads=2) == tik.encode_ordinary_batch(texts, num_threads=2)


def test_matches_tiktoken_on_one_long_text(trained) -> None:
    # over 64 KiB, encode() itself uses the per-thread pre-token cache
    enc, tik = trained
    text = "".join(stdlib_texts(200)[150:])
    assert len(text) > 1 << 16
    assert enc.encode(text) == tik.encode_ordinary(text)


@settings(max_examples=200, deadline=None)
@given(text=st.one_of(st.text(max_size=80), texts))
def test_matches_tiktoken_on_any_text(trained, text: str) -> None:
    enc, tik = trained
    assert enc.encode(text) == tik.encode_ordinary(text)


def test_identity_bytes() -> None:
    enc = ats_native.BpeEncoder(list(range(256)), [], "gpt4")
    text = "héllo wörld \U0001f600"
    assert enc.encode(text) == list(text.encode("utf-8"))


@pytest.mark.parametrize(
    ("byte_ids", "merges", "message"),
    [
        (list(range(255)), [], "256 ids, got 255"),
        ([-1] + list(range(1, 256)), [], r"byte_ids\[0\] holds id -1"),
        ([0] + list(range(255)), [], "repeats an earlier byte id"),
        (list(range(256)), [(0, 1, 256), (1, 2, 256)], "already a byte or merged id"),
        (list(range(256)), [(0, 1, 5)], "already a byte or merged id"),
        (list(range(256)), [(0, 999, 256)], "neither a byte id nor the result of an earlier"),
        (list(range(256)), [(0, 257, 256), (0, 1, 257)], "result of an earlier merge"),
        (list(range(256)), [(0, 1, 256), (0, 1, 257)], "repeats the pair"),
        (list(range(256)), [(0, 1, 2**31)], "outside"),
    ],
)
def test_bad_tables_raise(byte_ids, merges, message) -> None:
    with pytest.raises(ValueError, match=message):
        ats_native.BpeEncoder(byte_ids, merges, "gpt4")


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="unknown pattern 'gpt3'"):
        ats_native.BpeEncoder(list(range(256)), [], "gpt3")
    enc = ats_native.BpeEncoder(list(range(256)), [], "gpt4")
    with pytest.raises(ValueError, match="lone surrogate at index 1"):
        enc.encode("a\udfff")
    with pytest.raises(ValueError, match=r"texts\[1\] contains a lone surrogate at index 0"):
        enc.encode_batch(["ok", "\ud800"])
    with pytest.raises(ValueError, match=r"threads = -1: expected 0 \(all"):
        enc.encode_batch(["ok"], threads=-1)
    with pytest.raises(TypeError, match="list of str, not a str"):
        enc.encode_batch("abc")
