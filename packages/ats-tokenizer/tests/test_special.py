"""Special tokens follow tiktoken's semantics exactly (tiktoken is the oracle): disallowed strings
raise, allowed ones become ids, disallowed_special=() turns the guard off."""

import pytest
from ats_tokenizer import Tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
piece = st.one_of(st.sampled_from(SPECIALS + ["<|", "|>", "endoftext", " ", "\n"]), st.text())
special_text = st.lists(piece, max_size=10).map("".join)
allowed_sets = st.one_of(st.just("all"), st.sets(st.sampled_from(SPECIALS)))


def _outcome(fn):
    try:
        return fn()
    except ValueError:
        return "raised"


@settings(max_examples=150, deadline=None)
@given(text=special_text, allowed=allowed_sets, guard=st.booleans())
def test_matches_tiktoken(trained, trained_tiktoken, text, allowed, guard):
    enc = trained_tiktoken
    disallowed = "all" if guard else ()
    theirs = _outcome(
        lambda: enc.encode(text, allowed_special=allowed, disallowed_special=disallowed)
    )
    ours = _outcome(
        lambda: trained.encode(text, allowed_special=allowed, disallowed_special=disallowed)
    )
    assert ours == theirs


def test_default_refuses_special_strings(trained):
    with pytest.raises(ValueError, match="special token '<\\|endoftext\\|>' at index 5"):
        trained.encode("hello<|endoftext|>")
    text_ids = trained.encode("hello<|endoftext|>", disallowed_special=())
    assert trained.eos_id not in text_ids
    assert text_ids == trained.encode_ordinary("hello<|endoftext|>")
    ids = trained.encode("hello<|endoftext|>", allowed_special={"<|endoftext|>"})
    assert ids[-1] == trained.eos_id and trained.decode(ids) == "hello<|endoftext|>"


def test_partial_allow_still_guards_the_rest(trained):
    with pytest.raises(ValueError, match="<\\|im_end\\|>"):
        trained.encode("<|im_start|>x<|im_end|>", allowed_special={"<|im_start|>"})


def test_unknown_special_names_are_errors(trained):
    with pytest.raises(ValueError, match="not special tokens of this tokenizer"):
        trained.encode("x", allowed_special={"<|nope|>"})


def test_longest_special_wins():
    tok = Tokenizer.train(["abc"] * 3, 300, special_tokens=("<|a|>", "<|a|>b"), backend="python")
    ids = tok.encode("<|a|>b", allowed_special="all")
    assert ids == [tok.special_tokens["<|a|>b"]]
