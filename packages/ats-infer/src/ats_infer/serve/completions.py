"""POST /v1/completions: prompts (a string, strings, token ids, lists of token ids) continued as
text, whole or streamed, with OpenAI's legacy logprobs."""

import secrets
import time

from fastapi import Request
from fastapi.responses import JSONResponse

from ats_infer.serve import dispatch, responses
from ats_infer.serve.errors import APIError
from ats_infer.serve.generation import Piece, TokenInfo
from ats_infer.serve.protocol import CompletionLogprobs, CompletionRequest
from ats_infer.serve.state import ServerState


def encode_prompts(state: ServerState, prompt: str | list) -> list[list[int]]:
    if isinstance(prompt, str):
        prompts: list = [prompt]
    elif prompt and isinstance(prompt[0], int):
        prompts = [prompt]
    else:
        prompts = prompt
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            try:
                ids = state.tokenizer.encode(p)
            except ValueError as err:  # a special-token string in the text
                raise APIError(400, f"prompt: {err}", param="prompt") from err
        else:
            ids = list(p)
        out.append(dispatch.check_ids(state, ids, "prompt" if len(prompts) == 1 else f"prompt.{i}"))
    return out


def legacy_logprobs(tokens: list[TokenInfo], top: int, offset: int) -> CompletionLogprobs:
    text = [t.token.decode("utf-8", errors="replace") for t in tokens]
    offsets, at = [], offset
    for piece in text:
        offsets.append(at)
        at += len(piece)
    tops = None
    if top > 0:
        tops = [{b.decode("utf-8", errors="replace"): lp for b, lp in t.top} for t in tokens]
    return CompletionLogprobs(
        tokens=text,
        token_logprobs=[t.logprob for t in tokens],
        top_logprobs=tops,
        text_offset=offsets,
    )


async def create_completion(
    state: ServerState, request: Request, caller: str, req: CompletionRequest
):
    prompts = encode_prompts(state, req.prompt)
    running = await dispatch.start(
        state, request, caller, req, prompts, req.max_tokens, "max_tokens",
        [state.tokenizer.eos_id], req.logprobs,
    )  # fmt: skip
    cid, created = f"cmpl-{secrets.token_hex(12)}", int(time.time())
    base = {"id": cid, "object": "text_completion", "created": created, "model": req.model}
    top = req.logprobs or 0
    if req.stream:
        offsets = [0] * len(running.choices)  # text_offset goes on across a choice's pieces

        def delta(index: int, piece: Piece) -> dict:
            logprobs = None
            if req.logprobs is not None:
                logprobs = legacy_logprobs(piece.tokens, top, offsets[index]).model_dump()
            offsets[index] += len(piece.text)
            return {"index": index, "text": piece.text, "logprobs": logprobs,
                    "finish_reason": piece.finish_reason}  # fmt: skip

        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return responses.stream(running, base, delta, include_usage)
    collected, usage = await responses.collect_all(running)
    choices = []
    for index, choice in enumerate(collected):
        logprobs = None
        if req.logprobs is not None:
            logprobs = legacy_logprobs(choice.tokens, top, 0).model_dump()
        choices.append({"index": index, "text": choice.text, "logprobs": logprobs,
                        "finish_reason": choice.finish_reason})  # fmt: skip
    body = {**base, "choices": choices, "usage": usage}
    return JSONResponse(body, headers=running.headers)
