"""Property fuzzing of the HTTP API with schemathesis, against the server's own OpenAPI schema: whatever
it generates (valid bodies, wrong types, missing fields, odd strings, other methods), the server answers
without a 5xx and stays healthy. This is the short run for CI; `scripts/fuzz_api.sh` runs 1,000+ cases
against a real `specdec serve` process."""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from specdec.serving.app import create_app
from specdec.serving.server import add_serve_parser, build_state

EXAMPLES = 40  # per operation and mode (operations without inputs need only one)


@pytest.fixture(scope="module")
def served(zoo):
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    args = parser.parse_args(["serve", "--model", zoo.path("llama"), "--device", "cpu", "--threads", "1",
                              "--served-model-name", "tiny", "--max-model-len", "256", "--max-tokens-limit", "4",
                              "--no-warmup"])
    state = build_state(args)
    state.scheduler.start()
    yield state, create_app(state)
    state.scheduler.stop()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
def test_no_request_gets_a_server_error(served, mode):
    """Every operation in the schema, with bodies that follow it (valid) or break it (invalid)."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", served[1])
    statuses: Counter = Counter()
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def check(case):
            response = case.call()
            statuses[response.status_code] += 1
            assert response.status_code < 500, (case.method, case.path, case.body, response.text)

        try:
            check()
        except Unsatisfiable:  # an operation whose inputs can be anything (no input, a string path) has no invalid form
            assert mode == GenerationMode.NEGATIVE and not operation.body, operation.label
    assert sum(statuses.values()) >= 60, statuses
    if mode == GenerationMode.POSITIVE:
        assert statuses[200] > 0, statuses  # some generated requests are served, not only refused


def test_the_schema_describes_the_request_bodies(served):
    doc = served[1].openapi()
    body = doc["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["$ref"].endswith("/CompletionRequest")
    assert "prompt" in doc["components"]["schemas"]["CompletionRequest"]["properties"]
    assert doc["components"]["schemas"]["CompletionRequest"]["properties"]["model"]["enum"] == ["tiny"]
    assert "messages" in doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]


def test_the_server_is_healthy_after_fuzzing(served):
    state, app = served
    assert state.scheduler.alive and state.scheduler.active == 0

    async def health():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await client.get("/health")

    assert asyncio.run(health()).status_code == 200
