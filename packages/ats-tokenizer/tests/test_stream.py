"""The streaming decoder never emits broken UTF-8 and its output concatenates to decode()."""

import numpy as np
from ats_tokenizer_inputs import any_text
from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=150, deadline=None)
@given(text=any_text, data=st.data())
def test_random_splits_concatenate_to_decode(trained, text, data):
    ids = trained.encode(text, allowed_special="all")
    cuts = sorted(data.draw(st.lists(st.integers(0, len(ids)), max_size=8)))
    decoder = trained.stream_decoder()
    out = []
    for start, end in zip([0, *cuts], [*cuts, len(ids)], strict=True):
        chunk = decoder.push(ids[start:end])
        assert "\ufffd" not in chunk or "\ufffd" in text  # never a broken character
        out.append(chunk)
    out.append(decoder.finish())
    assert "".join(out) == trained.decode(ids) == text


@settings(max_examples=100, deadline=None)
@given(ids=st.lists(st.integers(0, 1023), max_size=30))
def test_arbitrary_ids_match_decode_with_replacement(trained, ids):
    # Ids that do not form valid UTF-8 decode to U+FFFD exactly as decode() does.
    decoder = trained.stream_decoder()
    streamed = "".join(decoder.push(i) for i in ids) + decoder.finish()
    assert streamed == trained.decode(ids)


def test_one_id_at_a_time_holds_incomplete_characters(trained):
    text = "🙂"  # four bytes, likely several tokens
    decoder = trained.stream_decoder()
    pieces = [decoder.push(np.int64(i)) for i in trained.encode_ordinary(text)]
    assert all(p in ("", text) for p in pieces) and "".join(pieces) == text
    assert decoder.finish() == ""
