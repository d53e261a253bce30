"""Who may call the server, and how: API key, Content-Type and Host checks, before any route runs.

- `api_key` (`--api-key` or SPECDEC_API_KEY): every /v1 route needs `Authorization: Bearer <key>`, compared
  in constant time; without it, 401 (as vLLM's --api-key). /health, /version and /metrics stay open.
- A POST must say `Content-Type: application/json`, else 415. A web page can make a visitor's browser send a
  "simple" cross-origin POST (text/plain, no preflight) to a server on localhost; JSON-only closes that door.
- `allowed_hosts` (`--allowed-hosts`): requests whose Host header is not listed get 400, against DNS
  rebinding (Starlette's TrustedHostMiddleware does the matching).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import Any

from starlette.middleware.trustedhost import TrustedHostMiddleware

from specdec.serving.errors import APIError, error_response

JSON_TYPES = ("application/json",)


def bearer_token(headers: dict[bytes, bytes]) -> str | None:
    value = headers.get(b"authorization", b"").decode("latin-1")
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def media_type(headers: dict[bytes, bytes]) -> str:
    return headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()


class AccessControl:
    """Pure ASGI middleware (no body buffering, so streaming and disconnect detection are untouched)."""

    def __init__(self, app: Any, api_key: str | None, on_reject: Callable[[int], None] | None = None) -> None:
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.on_reject = on_reject

    def problem(self, scope: dict[str, Any]) -> APIError | None:
        headers = dict(scope.get("headers") or [])
        if self.api_key is not None and scope["path"].startswith("/v1"):
            given = bearer_token(headers)
            if given is None or not secrets.compare_digest(given.encode(), self.api_key):
                return APIError(401, "missing or wrong API key: send the header `Authorization: Bearer <key>`",
                                code="invalid_api_key")
        if scope["method"] == "POST" and media_type(headers) not in JSON_TYPES:
            got = media_type(headers) or "none"
            return APIError(415, f"the request body must be JSON, sent with `Content-Type: application/json` "
                            f"(got {got})", code="unsupported_media_type")
        return None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            error = self.problem(scope)
            if error is not None:
                if self.on_reject is not None:
                    self.on_reject(error.status)
                response = error_response(error)
                if error.status == 401:
                    response.headers["WWW-Authenticate"] = "Bearer"
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def install_access_control(app: Any, api_key: str | None, allowed_hosts: Sequence[str] | None,
                           on_reject: Callable[[int], None] | None = None) -> None:
    app.add_middleware(AccessControl, api_key=api_key, on_reject=on_reject)
    if allowed_hosts:  # added last, so it runs first
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))
