"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with a 4xx status for any bad input.

Handlers are installed for our own APIError, for Starlette's HTTP errors (unknown route: 404, wrong method:
405) and, as a last resort, for any other exception (500, logged): a bad request never takes the server down.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("specdec.serving")

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """An error the client gets as an OpenAI error body."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None, type: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or ERROR_TYPES.get(status, "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class ASCIIJSONResponse(JSONResponse):
    """JSON with non-ASCII escaped: an error message may quote input holding lone surrogates, which UTF-8
    cannot encode."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def error_response(exc: APIError) -> JSONResponse:
    headers = {"Retry-After": "1"} if exc.status in (429, 503) else None
    return ASCIIJSONResponse(exc.body(), status_code=exc.status, headers=headers)


def install_error_handlers(app: FastAPI, on_error: Any = None) -> None:
    """`on_error(status, type)` is called for every error response (the metrics count rejections)."""

    def respond(exc: APIError) -> JSONResponse:
        if on_error is not None:
            on_error(exc.status, exc.type)
        return error_response(exc)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return respond(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path} (see /v1/models, /v1/completions, /v1/chat/completions)"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        return respond(APIError(exc.status_code, message, code=str(exc.status_code)))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return respond(bad_request(f"invalid request: {exc.errors()}"))

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("internal error on %s %s", request.method, request.url.path)
        return respond(APIError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error"))
