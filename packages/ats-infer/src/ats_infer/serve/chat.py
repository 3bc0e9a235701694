"""POST /v1/chat/completions: messages in ats-tokenizer's ChatML template (a clear 400 when the
model's tokenizer lacks its special tokens), the reply ending at <|im_end|> or <|endoftext|>, whole
or streamed as chat.completion.chunk events."""

import secrets
import time

from ats_tokenizer.chat import IM_END, IM_START
from fastapi import Request
from fastapi.responses import JSONResponse

from ats_infer.serve import dispatch, responses
from ats_infer.serve.errors import APIError
from ats_infer.serve.generation import Piece, TokenInfo
from ats_infer.serve.protocol import ChatCompletionRequest
from ats_infer.serve.state import ServerState

ROLE_OF = {"developer": "system"}  # OpenAI's newer name for the system role


def chat_prompt(state: ServerState, req: ChatCompletionRequest) -> list[int]:
    specials = state.tokenizer.special_tokens
    missing = [t for t in (IM_START, IM_END) if t not in specials]
    if missing:
        raise APIError(
            400,
            f"this model's tokenizer has no chat special tokens {missing}: it cannot take chat "
            "messages; use /v1/completions with a plain prompt",
            param="messages",
            code="chat_template_missing",
        )
    messages = [{"role": ROLE_OF.get(m.role, m.role), "content": m.text()} for m in req.messages]
    ids, _ = state.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return dispatch.check_ids(state, ids, "messages")


def chat_logprobs(tokens: list[TokenInfo]) -> dict:
    def entry(token: bytes, logprob: float) -> dict:
        text = token.decode("utf-8", errors="replace")
        return {"token": text, "logprob": logprob, "bytes": list(token)}

    content = [
        {**entry(t.token, t.logprob), "top_logprobs": [entry(b, lp) for b, lp in t.top]}
        for t in tokens
    ]
    return {"content": content}


async def create_chat_completion(
    state: ServerState, request: Request, caller: str, req: ChatCompletionRequest
):
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    prompt = chat_prompt(state, req)
    stops = [state.tokenizer.eos_id, state.tokenizer.special_tokens[IM_END]]
    top = (req.top_logprobs or 0) if req.logprobs else None
    max_tokens = req.max_completion_tokens or req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
    running = await dispatch.start(
        state, request, caller, req, [prompt], max_tokens, param, stops, top
    )
    cid, created = f"chatcmpl-{secrets.token_hex(12)}", int(time.time())
    base = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": req.model}
    if req.stream:
        role = {"role": "assistant", "content": ""}  # the role first, as OpenAI sends it
        first = [{**base, "choices": [{"index": index, "delta": role, "logprobs": None,
                                       "finish_reason": None}]}
                 for index in range(len(running.choices))]  # fmt: skip

        def delta(index: int, piece: Piece) -> dict:
            logprobs = chat_logprobs(piece.tokens) if req.logprobs else None
            return {"index": index, "delta": {"content": piece.text}, "logprobs": logprobs,
                    "finish_reason": piece.finish_reason}  # fmt: skip

        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return responses.stream(running, base, delta, include_usage, first)
    collected, usage = await responses.collect_all(running)
    choices = [
        {
            "index": index,
            "message": {"role": "assistant", "content": choice.text},
            "logprobs": chat_logprobs(choice.tokens) if req.logprobs else None,
            "finish_reason": choice.finish_reason,
        }
        for index, choice in enumerate(collected)
    ]
    body = {**base, "object": "chat.completion", "choices": choices, "usage": usage}
    return JSONResponse(body, headers=running.headers)
