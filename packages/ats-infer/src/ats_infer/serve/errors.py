"""Errors in OpenAI's shape, {"error": {"message", "type", "param", "code"}}, for every failure the
server reports: its own (APIError), request validation (400, never FastAPI's 422), unknown routes
and methods."""

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict"}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict:
    kind = ERROR_TYPES.get(status, "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(
        error_body(err.status, err.message, err.param, err.code),
        status_code=err.status,
        headers=err.headers,
    )


def _validation_message(err: RequestValidationError) -> tuple[str, str | None]:
    first = err.errors()[0]
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {first.get('msg')}", None
    # a union names its member after the field (prompt.constrained-str): keep the field path only
    fields = []
    for part in loc:
        if part in TYPE_TAGS or not (part.isidentifier() or part.isdigit()):
            break
        fields.append(part)
    param = ".".join(fields)
    return f"{param or 'body'}: {first.get('msg')} (got {first.get('input')!r:.80})", param or None


class CheckedRoute(APIRoute):
    """A route whose request body must be UTF-8 (JSON's encoding): a clear 400 naming the byte,
    where FastAPI alone only says it could not parse the body."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def checked(request: Request):
            body = await request.body()  # cached: the handler reads it again
            try:
                body.decode("utf-8")
            except UnicodeDecodeError as err:
                raise APIError(
                    400,
                    f"the request body is not valid UTF-8: {err.reason} at byte {err.start} "
                    f"({body[err.start : err.start + 1]!r})",
                ) from err
            return await handler(request)

        return checked


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, err: APIError) -> JSONResponse:
        return error_response(err)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(err)
        return error_response(APIError(400, message, param=param, code="invalid_value"))

    @app.exception_handler(HTTPException)
    async def _http(_: Request, err: HTTPException) -> JSONResponse:
        return error_response(APIError(err.status_code, str(err.detail), headers=err.headers))
