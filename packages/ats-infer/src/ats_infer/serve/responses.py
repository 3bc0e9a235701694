"""The response loop both endpoints share, whole or streamed: the choices' pieces merged as they
come, each framed by the endpoint's own `delta` (text or chat message), usage counted over them,
Server-Sent Events as OpenAI sends them (`data: {chunk}`, the usage chunk with empty choices, then
`data: [DONE]`), and every job cancelled when the response ends or the client goes away."""

import json
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from fastapi.responses import StreamingResponse

from ats_infer.serve.dispatch import Running, merged
from ats_infer.serve.errors import APIError, error_body
from ats_infer.serve.generation import Choice, Piece, collect


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def stream(
    running: Running,
    base: dict[str, Any],
    delta: Callable[[int, Piece], dict[str, Any]],
    include_usage: bool,
    first: Iterable[dict[str, Any]] = (),
) -> StreamingResponse:
    """`first` chunks, then {**base, "choices": [delta(index, piece)]} per piece, then usage."""
    frame = choice_framer(base)

    async def events() -> AsyncIterator[bytes]:
        try:
            for chunk in first:
                yield sse(chunk)
            completion_tokens = 0
            async for index, piece in merged(running.choices):
                completion_tokens += piece.n_tokens
                yield frame(delta(index, piece))
            if include_usage:
                usage_chunk = usage(running.prompt_tokens, completion_tokens)
                yield sse({**base, "choices": [], "usage": usage_chunk})
        finally:
            running.cancel()

    return StreamingResponse(
        sse_stream(events()), media_type="text/event-stream", headers=running.headers
    )


def choice_framer(base: dict[str, Any]) -> Callable[[dict[str, Any]], bytes]:
    """choice -> sse({**base, "choices": [choice]}), byte for byte, with base's JSON written once
    (a streamed token's event is mostly base)."""
    head = b"data: " + _dumps(base)[:-1] + b',"choices":['

    def frame(choice: dict[str, Any]) -> bytes:
        return head + _dumps(choice) + b"]}\n\n"

    return frame


async def collect_all(running: Running) -> tuple[list[Choice], dict[str, int]]:
    """Every choice run to its end, in order, and the request's usage."""
    try:
        choices = [await collect(pieces) for pieces in running.choices]
    finally:
        running.cancel()
    completion_tokens = sum(c.completion_tokens for c in choices)
    return choices, usage(running.prompt_tokens, completion_tokens)


def _dumps(payload: Any) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


def sse(payload: Any) -> bytes:
    return b"data: " + _dumps(payload) + b"\n\n"


async def sse_stream(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The events, then data: [DONE]; an error mid-stream is sent as an error event (as OpenAI
    does) and ends the stream."""
    try:
        async for event in events:
            yield event
    except APIError as err:
        yield sse(error_body(err.status, err.message, err.param, err.code))
    yield b"data: [DONE]\n\n"
