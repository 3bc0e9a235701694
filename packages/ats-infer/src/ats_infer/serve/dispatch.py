"""From a validated request to running choices: model name and context checks (a clear 400 each),
sampling settings for the engine, the rate limiter, then one Job per choice submitted to the
scheduler; and the choices' pieces merged as they come."""

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from ats_infer.serve.errors import APIError
from ats_infer.serve.generation import Piece, run_choice
from ats_infer.serve.protocol import SamplingFields
from ats_infer.serve.scheduler import Job, Scheduler
from ats_infer.serve.state import ServerState


@dataclass
class Running:
    """The choices of one request, each an async iterator of Pieces, and its rate-limit headers."""

    choices: list[AsyncIterator[Piece]]
    prompt_tokens: int
    headers: dict[str, str]
    jobs: list[Job]
    scheduler: Scheduler

    def cancel(self) -> None:
        """Ends every choice still running (a no-op for finished ones)."""
        for job in self.jobs:
            self.scheduler.cancel(job)


def check_model(state: ServerState, name: str) -> None:
    if name != state.model_name:
        raise APIError(
            404,
            f"the model {name!r} does not exist; this server serves {state.model_name!r}",
            param="model",
            code="model_not_found",
        )


def check_ids(state: ServerState, ids: list[int], what: str) -> list[int]:
    if not ids:
        raise APIError(400, f"{what} is empty after tokenization", param=what)
    bad = [t for t in ids if t >= state.vocab_size]
    if bad:
        raise APIError(
            400,
            f"{what}: token id {bad[0]} is out of the model's vocabulary ({state.vocab_size} ids)",
            param=what,
        )
    return ids


def max_new_tokens(state: ServerState, prompt_len: int, requested: int | None, param: str) -> int:
    limit = state.max_seq_len
    if requested is None:
        requested = limit - prompt_len
    if prompt_len + requested > limit or requested < 1:
        raise APIError(
            400,
            f"this model's maximum context length is {limit} tokens; the request needs "
            f"{prompt_len + max(requested, 1)} ({prompt_len} in the prompt, {max(requested, 1)} "
            f"for the completion): shorten the prompt or lower {param}",
            param=param,
            code="context_length_exceeded",
        )
    return requested


def sampling(
    state: ServerState, req: SamplingFields, stop_tokens: list[int], top: int | None
) -> dict[str, Any]:
    bias = {int(k): v for k, v in (req.logit_bias or {}).items()}
    for token in bias:
        if token >= state.tokenizer.vocab_size:
            raise APIError(
                400,
                f"logit_bias: token id {token} is out of the tokenizer's vocabulary "
                f"({state.tokenizer.vocab_size} ids)",
                param="logit_bias",
            )
    return {
        "temperature": req.temperature,
        "top_k": max(0, req.top_k),
        "top_p": req.top_p,
        "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
        "logit_bias": bias,
        "stop_tokens": stop_tokens,
        "logprobs": top is not None,
        "top_logprobs": top or 0,
        "vocab_limit": state.vocab_limit,
    }


async def start(
    state: ServerState,
    request: Request,
    caller: str,
    req: SamplingFields,
    prompts: list[list[int]],
    max_tokens: int | None,
    max_tokens_param: str,
    stop_tokens: list[int],
    top_logprobs: int | None,
) -> Running:
    """Checks, admits and submits every choice (len(prompts) * n); nothing runs on a 4xx."""
    check_model(state, req.model)
    budgets = [max_new_tokens(state, len(p), max_tokens, max_tokens_param) for p in prompts]
    settings = sampling(state, req, stop_tokens, top_logprobs)
    cost = sum(len(p) + b for p, b in zip(prompts, budgets, strict=True)) * req.n
    headers = state.limiter.admit(caller, cost) if state.limiter else {}
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + state.settings.request_timeout
    base_seed = secrets.randbits(63) if req.seed is None else req.seed
    mailbox = state.scheduler.mailbox(loop)
    jobs, queues = [], []
    for prompt, budget in zip(prompts, budgets, strict=True):
        for _ in range(req.n):
            queue: asyncio.Queue = asyncio.Queue()
            seed = (base_seed + len(jobs)) % 2**64
            jobs.append(
                Job.for_mailbox(
                    mailbox,
                    queue,
                    prompt=prompt,
                    max_new_tokens=budget,
                    sampling={**settings, "seed": seed},
                )  # fmt: skip
            )
            queues.append(queue)
    state.scheduler.submit(jobs)
    stops = req.stop_list()

    async def disconnected() -> bool:
        return await request.is_disconnected()

    choices = [
        run_choice(
            state.scheduler,
            job,
            queue,
            state.tokenizer,
            stops,
            deadline,
            disconnected,
            state.metrics,
        )  # fmt: skip
        for job, queue in zip(jobs, queues, strict=True)
    ]
    return Running(choices, sum(len(p) for p in prompts), headers, jobs, state.scheduler)


async def merged(choices: list[AsyncIterator[Piece]]) -> AsyncIterator[tuple[int, Piece]]:
    """(choice index, piece) from all choices as they come; the first error is raised."""
    if len(choices) == 1:
        async for piece in choices[0]:
            yield 0, piece
        return
    out: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(index: int, pieces: AsyncIterator[Piece]) -> None:
        try:
            async for piece in pieces:
                await out.put((index, piece))
        except APIError as err:
            await out.put((index, err))
        await out.put((index, done))

    tasks = [asyncio.create_task(pump(i, c)) for i, c in enumerate(choices)]
    try:
        finished = 0
        while finished < len(tasks):
            index, item = await out.get()
            if item is done:
                finished += 1
            elif isinstance(item, APIError):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # each choice cancels its job
