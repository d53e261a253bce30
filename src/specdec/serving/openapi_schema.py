"""The request bodies in /openapi.json.

The generation routes read their bodies themselves (to answer every malformed body with an OpenAI error,
not FastAPI's 422), so FastAPI cannot see their schemas. They are added here from the same pydantic models
that parse the bodies, which lets clients and property fuzzers (schemathesis) see what the server takes.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

REF = "#/components/schemas/{model}"


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """The route's `openapi_extra`: its JSON body is `model`."""
    schema = {"$ref": REF.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def install_request_schemas(app: FastAPI, models: list[type[BaseModel]], served_model: str) -> None:
    """`served_model`: the one `model` value the server accepts (any other is a 404), so the schema says so."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            for model in models:
                schema = model.model_json_schema(ref_template=REF)
                schemas.update(schema.pop("$defs", {}))
                if "model" in schema.get("properties", {}):
                    schema["properties"]["model"] = {"type": "string", "enum": [served_model], "title": "Model"}
                schemas[model.__name__] = schema
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
