"""The served OpenAPI document, made exact, and the FastAPI options memtier builds with."""

from __future__ import annotations

import inspect
from typing import Any

from fastapi import FastAPI

from memtier.threads.http.errormap import status_table

__all__ = ["fastapi_options", "finish_document"]


def fastapi_options() -> dict[str, Any]:
    """Keyword arguments for ``FastAPI(...)``: recent FastAPI versions ship OpenTelemetry
    hooks, switched off (memtier reports through its own Prometheus metrics)."""
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters:
        return {
            "telemetry": {
                "tracing": False,
                "metrics": False,
                "logs": False,
                "operation_spans": False,
                "auto_configure": False,
            }
        }
    return {}


def finish_document(document: dict[str, Any]) -> dict[str, Any]:
    """The generated document, made exact: FastAPI's 422 (the API answers 400
    ``invalid_request`` instead) is removed, and every error code with its one status is
    listed under ``x-memtier-error-codes`` (docs/threads.md has the same table)."""
    for path in document.get("paths", {}).values():
        for operation in path.values():
            responses = operation.get("responses", {})
            if "HTTPValidationError" in str(responses.get("422", "")):  # FastAPI's, not ours
                responses.pop("422")
    schemas = document.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    document["x-memtier-error-codes"] = status_table()
    return document
