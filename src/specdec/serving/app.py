"""The FastAPI app: OpenAI's /v1/completions, /v1/chat/completions and /v1/models, plus /health, /version
and /metrics. Request bodies are parsed and checked here (400 for anything wrong, 401 without the API key,
404 for another model, 408 for a body that does not arrive in time, 413 for a huge body, 415 for one that is
not JSON, 429 when the queue is full, 503 when the worker is down). Tokenizing runs on a small thread pool
(serving/tokenizer_pool.py) and generation on the scheduler's worker thread: the event loop only moves bytes.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from specdec import __version__
from specdec.serving.access import install_access_control
from specdec.serving.chat_template import render_chat
from specdec.serving.errors import APIError, bad_request, error_body, install_error_handlers, logger
from specdec.serving.generation import Generation, StepEvent
from specdec.serving.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from specdec.serving.openapi_schema import install_request_schemas, request_body
from specdec.serving.responses import ResponseBuilder, spec_figures, usage
from specdec.serving.scheduler import Scheduler, worker_down
from specdec.serving.schemas import ChatCompletionRequest, CompletionRequest, Limits, parse_request
from specdec.serving.tokenizer_pool import TokenizerPool

MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_BODY_TIMEOUT = 30.0  # seconds to receive a whole request body
CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it, the access log shows it
LIVENESS_POLL = 1.0  # seconds between checks that the worker is alive while a handler waits for events


@dataclass
class ServerState:
    model_name: str  # the name clients send as `model`
    model_path: str
    tokenizers: TokenizerPool  # copies of the tokenizer for the request threads (the worker decodes with the model's)
    limits: Limits
    scheduler: Scheduler
    metrics: ServerMetrics
    speculative_config: dict[str, Any] | None
    created: int
    api_key: str | None = None
    allowed_hosts: list[str] | None = None
    body_timeout: float = DEFAULT_BODY_TIMEOUT

    @property
    def method(self) -> str | None:
        return self.speculative_config["method"] if self.speculative_config else None

    @property
    def num_speculative_tokens(self) -> int:
        return self.metrics.k


def create_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        started_here = not state.scheduler.alive  # a worker started by its owner (a test) is left running
        if started_here:
            state.scheduler.start()
        yield
        if started_here:
            state.scheduler.stop()

    app = FastAPI(title="specdec", version=__version__, lifespan=lifespan)
    app.state.specdec = state
    rejected = state.metrics.request_rejected

    def count_rejection(status: int) -> None:
        rejected.labels(**state.metrics.labels, status=str(status)).inc()

    install_error_handlers(app, on_error=lambda status, _type: count_rejection(status))
    install_access_control(app, state.api_key, state.allowed_hosts, on_reject=count_rejection)

    @app.get("/health")
    async def health() -> JSONResponse:
        if not state.scheduler.alive:
            raise worker_down(state.scheduler.died)
        return JSONResponse({"status": "ok"})

    @app.get("/version")
    async def version() -> JSONResponse:
        return JSONResponse({"version": __version__})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    def model_card() -> dict[str, Any]:
        return {
            "id": state.model_name, "object": "model", "created": state.created, "owned_by": "specdec",
            "root": state.model_path, "max_model_len": state.limits.max_model_len,
            "speculative_config": state.speculative_config,
        }

    @app.get("/v1/models")
    async def list_models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [model_card()]})

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str) -> JSONResponse:
        _check_model(state, model)
        return JSONResponse(model_card())

    @app.post("/v1/completions", openapi_extra=request_body(CompletionRequest))
    async def completions(request: Request) -> Response:
        return await _generate(state, request, "completion")

    @app.post("/v1/chat/completions", openapi_extra=request_body(ChatCompletionRequest))
    async def chat_completions(request: Request) -> Response:
        return await _generate(state, request, "chat")

    install_request_schemas(app, [CompletionRequest, ChatCompletionRequest], state.model_name)
    return app


def _check_model(state: ServerState, model: str) -> None:
    if model != state.model_name:
        raise APIError(404, f"the model {model!r} does not exist; this server serves {state.model_name!r}",
                       param="model", code="model_not_found")


async def _read_json(request: Request, timeout: float) -> Any:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise APIError(413, f"the request body is {length} bytes, more than the {MAX_BODY_BYTES} accepted")
    chunks, size = [], 0
    try:
        with anyio.fail_after(timeout):  # a client that trickles its body must not hold the connection forever
            async for chunk in request.stream():
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise APIError(413, f"the request body is more than the {MAX_BODY_BYTES} bytes accepted")
    except TimeoutError:
        raise APIError(408, f"the request body did not arrive within {timeout:g} s") from None
    body = b"".join(chunks)
    if not body.strip():
        raise bad_request("the request body is empty; send a JSON object")
    try:
        return json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise bad_request("the request body is nested too deeply") from None


def check_prompt_chars(limits: Limits, chars: int, param: str) -> None:
    """The cheap bound before tokenizing: a text this long has more tokens than any prompt may."""
    if limits.max_prompt_chars is not None and chars > limits.max_prompt_chars:
        raise bad_request(f"the {param} has {chars} characters, more than {limits.max_prompt_tokens} tokens can hold: "
                          f"this server's prompt limit is {limits.max_prompt_tokens} tokens (set by "
                          f"{limits.prompt_limit_source})", param=param, code="context_length_exceeded")


def tokenize(tokenizer: Any, text: str, param: str, **kwargs: Any) -> list[int]:
    """Token ids of `text`; text the tokenizer cannot take (lone UTF-16 surrogates, ...) is a 400."""
    try:
        return list(tokenizer(text, **kwargs).input_ids)
    except Exception as exc:  # noqa: BLE001 - the tokenizer's own error types vary
        raise bad_request(f"the {param} cannot be tokenized ({type(exc).__name__}: {exc}); is it valid "
                          "Unicode (no lone surrogates)?", param=param) from None


async def _prompt_ids(state: ServerState, req: CompletionRequest) -> list[int]:
    prompt = req.prompt_input()
    if isinstance(prompt, str):
        check_prompt_chars(state.limits, len(prompt), "prompt")
        ids = await state.tokenizers.run(lambda tok: tokenize(tok, prompt, "prompt"))
    else:
        vocab = state.limits.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise bad_request(f"prompt token ids must be in [0, {vocab}), got {bad[:8]}", param="prompt")
        ids = list(prompt)
    if not ids:
        raise bad_request("the prompt is empty (it tokenizes to no tokens)", param="prompt")
    return ids


async def _generate(state: ServerState, request: Request, kind: str) -> Response:
    arrival = time.monotonic()
    body = await _read_json(request, state.body_timeout)
    if kind == "chat":
        req = parse_request(ChatCompletionRequest, body)
        _check_model(state, req.model)
        messages = req.message_texts()
        check_prompt_chars(state.limits, sum(len(m["content"]) for m in messages), "messages")
        rendered = await state.tokenizers.run(partial(render_chat, messages=messages))
        ids, extra_stop, default_max = rendered.token_ids, rendered.stop, None
    else:
        req = parse_request(CompletionRequest, body)
        _check_model(state, req.model)
        ids, extra_stop, default_max = await _prompt_ids(state, req), [], 16  # OpenAI's default for completions
    params = req.sampling_params(state.limits, len(ids), default_max, extra_stop)
    request_id = uuid.uuid4().hex
    gen = Generation(request_id, ids, params, arrival, asyncio.get_running_loop())
    state.scheduler.submit(gen)
    streaming = False
    try:
        builder = ResponseBuilder(kind, request_id, state.model_name)
        headers = {"X-Request-Id": request_id}
        if req.stream:
            stream = _sse(state, gen, builder, req.include_usage)
            response = SSEResponse(stream, on_close=partial(state.scheduler.release, gen), headers=headers)
            streaming = True  # from here the response releases the generation when it ends
            return response
        final = await _wait_final(state, gen, request)
        if final is None:
            return Response(status_code=CLIENT_CLOSED)
        if final.error is not None:
            raise final.error if isinstance(final.error, APIError) else APIError(
                500, f"generation failed: {type(final.error).__name__}: {final.error}", code="generation_failed")
        spec = spec_figures(final.stats, state.method, state.num_speculative_tokens)
        body = builder.full(final.text or "", final.finish_reason, final.stop_reason,
                            usage(len(ids), final.num_output_tokens), spec)
        return JSONResponse(body, headers=headers)
    finally:
        if not streaming:
            state.scheduler.release(gen)


async def _events(state: ServerState, gen: Generation) -> AsyncIterator[StepEvent]:
    """The generation's events until its last one; an error event if the worker dies without a word."""
    while True:
        events = await gen.take(LIVENESS_POLL)
        if not events and not gen.done and not state.scheduler.alive:
            yield StepEvent("", 0, error=worker_down(state.scheduler.died))
            return
        for event in events:
            yield event
            if event.final:
                return


async def _listen_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _wait_final(state: ServerState, gen: Generation, request: Request) -> StepEvent | None:
    """The last event of a non-streamed request, or None when its client went away (then it is cancelled)."""

    async def last() -> StepEvent:
        event = None
        async for event in _events(state, gen):
            pass
        assert event is not None
        return event

    gone = asyncio.ensure_future(_listen_for_disconnect(request))
    final = asyncio.ensure_future(last())
    try:
        done, _ = await asyncio.wait({final, gone}, return_when=asyncio.FIRST_COMPLETED)
        return final.result() if final in done else None
    finally:
        gone.cancel()
        final.cancel()
        if not gen.done:
            state.scheduler.cancel(gen)


def _sse_line(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


async def _sse(state: ServerState, gen: Generation, builder: ResponseBuilder, include_usage: bool) -> AsyncIterator[str]:
    if builder.chat:
        yield _sse_line(builder.chunk("", role=True, include_usage=include_usage))
    async for event in _events(state, gen):
        if event.error is not None:
            exc = event.error
            message = exc.message if isinstance(exc, APIError) else f"generation failed: {type(exc).__name__}: {exc}"
            yield _sse_line(error_body(message, "internal_error", code="generation_failed"))
            break
        if event.finish_reason == "abort":
            break
        if event.finish_reason is not None:
            spec = spec_figures(event.stats, state.method, state.num_speculative_tokens)
            yield _sse_line(builder.chunk(event.delta if event.delta or not builder.chat else None,
                                          event.finish_reason, include_usage=include_usage, spec=spec))
            if include_usage:
                yield _sse_line(builder.usage_chunk(usage(len(gen.prompt_ids), event.num_output_tokens), spec))
            break
        if event.delta:
            yield _sse_line(builder.chunk(event.delta, include_usage=include_usage))
    yield _sse_line("[DONE]")


class SSEResponse(StreamingResponse):
    """Server-sent events that always watch for the client leaving, and run `on_close` when they end (the
    generation is then cancelled unless it already finished)."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None], headers: dict | None = None):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def run_then_stop(func: Callable[[], Any]) -> None:
                    await func()
                    group.cancel_scope.cancel()

                group.start_soon(run_then_stop, partial(self.stream_response, send))
                await run_then_stop(partial(self.listen_for_disconnect, receive))
        except Exception:  # noqa: BLE001 - a send to a vanished client (OSError, possibly in an exception group)
            logger.info("stream of a client that went away ended", exc_info=True)
        finally:
            self.on_close()
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()
