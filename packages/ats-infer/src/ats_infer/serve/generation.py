"""One choice of a request, on the asyncio side: its Job's token events become text deltas,
decoded without splitting a UTF-8 character, cut at the first stop string (text that could be the
start of a stop string is held back until it cannot be), with the logprobs of each token; the job
is cancelled on a stop string, a client that went away, or the request deadline."""

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from ats_tokenizer import Tokenizer

from ats_infer.serve.errors import APIError
from ats_infer.serve.metrics import Metrics
from ats_infer.serve.scheduler import FINISH_NONE, FINISH_STOP, ErrorEvent, Job, Scheduler

POLL_S = 0.25  # how often a waiting request checks its client and deadline


@dataclass
class TokenInfo:
    """A generated token for logprobs: its bytes, logprob and the top alternatives."""

    token: bytes
    logprob: float
    top: list[tuple[bytes, float]]


@dataclass
class Piece:
    text: str
    n_tokens: int  # generated tokens in this piece (a stop token is not one)
    tokens: list[TokenInfo] = field(default_factory=list)  # their logprobs, when asked for
    finish_reason: str | None = None


@dataclass
class Choice:
    """What a finished choice adds up to."""

    text: str = ""
    tokens: list[TokenInfo] = field(default_factory=list)
    finish_reason: str = "length"
    completion_tokens: int = 0


class StopCutter:
    """Text in, text out; ends at the first stop string, holding back a possible stop prefix."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.buffer = ""

    def push(self, text: str) -> tuple[str, bool]:
        """(text safe to emit, stop string seen)."""
        self.buffer += text
        hits = [i for i in (self.buffer.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.buffer = self.buffer[: min(hits)], ""
            return out, True
        cut = max(0, len(self.buffer) - self.hold)
        out, self.buffer = self.buffer[:cut], self.buffer[cut:]
        return out, False

    def flush(self) -> str:
        out, self.buffer = self.buffer, ""
        return out


async def run_choice(
    scheduler: Scheduler,
    job: Job,
    queue: asyncio.Queue,
    tokenizer: Tokenizer,
    stops: list[str],
    deadline: float,
    disconnected: Callable[[], Awaitable[bool]],
    metrics: Metrics,
) -> AsyncIterator[Piece]:
    """Pieces of text as the job's tokens arrive (job already submitted); the last has a
    finish_reason. Raises APIError on an engine error or the deadline."""
    decoder = tokenizer.stream_decoder()
    cutter = StopCutter(stops)
    with_logprobs = job.sampling["logprobs"]
    last = job.submitted
    first = True
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise APIError(504, "the request ran past the server's --request-timeout")
            try:  # the common case, a token already delivered: no timer, no task
                event = queue.get_nowait()
            except asyncio.QueueEmpty:
                try:
                    async with asyncio.timeout(min(POLL_S, remaining)):
                        event = await queue.get()
                except TimeoutError:
                    if await disconnected():
                        return
                    continue
            if isinstance(event, ErrorEvent):
                raise APIError(400, event.message)
            now = time.monotonic()
            (metrics.ttft if first else metrics.itl).observe(now - last)
            first, last = False, now
            if event.finish == FINISH_STOP:  # a stop token: not part of the text
                text, hit = cutter.push(decoder.finish())
                piece = Piece(text + cutter.flush(), 0, [], "stop")
            else:
                text, hit = cutter.push(decoder.push(event.token))
                infos = [_token_info(tokenizer, event)] if with_logprobs else []
                piece = Piece(text, 1, infos, "stop" if hit else None)
                if not hit and event.finish != FINISH_NONE:  # length
                    tail, hit = cutter.push(decoder.finish())
                    piece.text += tail + ("" if hit else cutter.flush())
                    piece.finish_reason = "stop" if hit else "length"
            if piece.finish_reason is not None:
                metrics.e2e.observe(now - job.submitted)
                metrics.finished(piece.finish_reason)
            yield piece
            if piece.finish_reason is not None:
                return
    finally:
        scheduler.cancel(job)  # a no-op once the engine finished it


def _token_info(tokenizer: Tokenizer, event) -> TokenInfo:
    vocab = tokenizer.vocab_size

    def token_bytes(token: int) -> bytes:
        return tokenizer.decode_bytes([token]) if token < vocab else b""

    top = [(token_bytes(t), lp) for t, lp in event.top]
    return TokenInfo(token_bytes(event.token), event.logprob, top)


async def collect(pieces: AsyncIterator[Piece]) -> Choice:
    choice = Choice()
    async for piece in pieces:
        choice.text += piece.text
        choice.tokens.extend(piece.tokens)
        choice.completion_tokens += piece.n_tokens
        if piece.finish_reason is not None:
            choice.finish_reason = piece.finish_reason
    return choice
