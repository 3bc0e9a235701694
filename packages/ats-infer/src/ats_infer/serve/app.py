"""The FastAPI application: routes, the API-key check (every route but /health), the body size
limit, OpenAI-shaped errors; the model loads in a background thread after the server is up
(/health answers 503 until it is ready)."""

import threading
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ats_infer.serve import dispatch
from ats_infer.serve.chat import create_chat_completion
from ats_infer.serve.completions import create_completion
from ats_infer.serve.errors import APIError, CheckedRoute, install_error_handlers
from ats_infer.serve.limits import BodySizeLimit
from ats_infer.serve.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorResponse,
    Health,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from ats_infer.serve.state import ServerState

ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 429, 503, 504)}
STREAMED = {200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}}}


def build_app(
    state: ServerState,
    load: Callable[[ServerState], None],
    on_load_error: Callable[[Exception], None],
) -> FastAPI:
    """load(state) runs in a thread at startup; on_load_error(err) when it raises."""

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        def run_load() -> None:
            try:
                load(state)
            except Exception as err:  # any failure ends the server, with its message
                on_load_error(err)

        threading.Thread(target=run_load, name="ats-load", daemon=True).start()
        yield
        state.status = "stopping"
        if state.scheduler is not None:
            state.scheduler.stop(state.settings.shutdown_timeout)

    app = FastAPI(title="ats-infer", version="0.1.0", lifespan=lifespan)
    app.router.route_class = CheckedRoute
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=state.settings.max_body_bytes)
    bearer = HTTPBearer(auto_error=False)

    Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]

    def caller(credentials: Credentials) -> str:
        header = None if credentials is None else f"Bearer {credentials.credentials}"
        return state.keys.authenticate(header)

    Caller = Annotated[str, Depends(caller)]

    def ready(who: Caller) -> str:
        if state.status != "ok":
            raise APIError(503, f"the server is {state.status}", headers={"retry-after": "1"})
        return who

    Ready = Annotated[str, Depends(ready)]

    @app.get("/health", response_model=Health, responses={503: {"model": Health}})
    def health() -> JSONResponse:
        return JSONResponse(
            {"status": state.status}, status_code=200 if state.status == "ok" else 503
        )

    @app.get("/metrics", response_class=Response, responses=ERRORS)
    def metrics(_: Caller) -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models", response_model=ModelList, responses=ERRORS)
    def models(_: Ready) -> ModelList:
        card = ModelCard(
            id=state.model_name, created=state.created, max_model_len=state.max_seq_len
        )
        return ModelList(data=[card])

    @app.post(
        "/v1/completions", response_model=CompletionResponse, responses={**ERRORS, **STREAMED}
    )
    async def completions(body: CompletionRequest, request: Request, who: Ready):
        return await create_completion(state, request, who, body)

    @app.post(
        "/v1/chat/completions",
        response_model=ChatCompletionResponse,
        responses={**ERRORS, **STREAMED},
    )
    async def chat(body: ChatCompletionRequest, request: Request, who: Ready):
        return await create_chat_completion(state, request, who, body)

    @app.post("/tokenize", response_model=TokenizeResponse, responses=ERRORS)
    def tokenize(body: TokenizeRequest, _: Ready) -> TokenizeResponse:
        if body.model is not None:
            dispatch.check_model(state, body.model)
        try:
            ids = state.tokenizer.encode(body.prompt)
        except ValueError as err:
            raise APIError(400, f"prompt: {err}", param="prompt") from err
        return TokenizeResponse(tokens=ids, count=len(ids), max_model_len=state.max_seq_len)

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=ERRORS)
    def detokenize(body: DetokenizeRequest, _: Ready) -> DetokenizeResponse:
        if body.model is not None:
            dispatch.check_model(state, body.model)
        bad = [t for t in body.tokens if t >= state.tokenizer.vocab_size]
        if bad:
            raise APIError(
                400,
                f"tokens: id {bad[0]} is out of the tokenizer's vocabulary "
                f"({state.tokenizer.vocab_size} ids)",
                param="tokens",
            )
        return DetokenizeResponse(prompt=state.tokenizer.decode(body.tokens))

    return app
