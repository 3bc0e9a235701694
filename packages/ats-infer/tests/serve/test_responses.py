"""The streamed chunk framing: a choice framed around base's JSON written once gives the same bytes
as the whole chunk serialised (json.dumps is the oracle)."""

import json

from ats_infer.serve.responses import choice_framer, sse


def test_framed_choice_is_the_whole_chunk_serialised() -> None:
    base = {"id": 'cmpl-\u00e9"x', "object": "text_completion", "created": 1, "model": "m/\u4e2d"}
    frame = choice_framer(base)
    for choice in [
        {"index": 0, "text": "", "logprobs": None, "finish_reason": None},
        {"index": 1, "text": "caf\u00e9 \"q\" \\ \n\U0001f600", "logprobs": None,
         "finish_reason": "stop"},
        {"index": 0, "delta": {"content": "</s>\u2028"}, "logprobs": {"content": [1.5, -2]},
         "finish_reason": "length"},
    ]:  # fmt: skip
        framed = frame(choice)
        assert framed == sse({**base, "choices": [choice]})
        assert framed.startswith(b"data: ") and framed.endswith(b"\n\n")
        assert json.loads(framed[6:]) == {**base, "choices": [choice]}
