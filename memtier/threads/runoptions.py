"""Run options: the per-call options a host passes through to its agent (spec ``runOptions``).

The host declares their schema as a pydantic model when it builds the service
(``run_options_schema=MyOptions``; a runner may carry it as its
``run_options_schema`` attribute, which ``memtier serve`` uses).  A
``continue`` may then carry a JSON object of those options: validated strictly
(JSON types, unknown fields refused), at most
:data:`memtier.limits.THREAD_RUN_OPTIONS_BYTES` as JSON, and never a field
that names ownership, identity, the request id, the signal, the redactor or
the idempotency key -- neither the schema (refused at construction) nor the
value (refused per call) can carry or override them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson
from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from memtier import limits
from memtier.errors import ConfigurationError, ConversationError, ErrorCode

__all__ = ["RESERVED_RUN_OPTION_NAMES", "check_schema", "validate_run_options"]

Code = ErrorCode

# Names (lower-cased, "_" and "-" removed) that run options may never use: what the
# service itself binds to a turn (spec: RunOptions minus ownership, identity, signal,
# redactor and idempotency key).
RESERVED_RUN_OPTION_NAMES: Final = frozenset(
    {
        "ownership",
        "owner",
        "tenant",
        "tenantid",
        "user",
        "userid",
        "identity",
        "agentidentity",
        "agent",
        "agentid",
        "scopes",
        "requestid",
        "idempotencykey",
        "signal",
        "cancel",
        "cancellation",
        "redactor",
        "threadid",
        "leafid",
        "limits",
        "runlimits",
    }
)


def _normal(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


def check_schema(schema: Any) -> type[BaseModel] | None:
    """The host's schema, checked: a pydantic model refusing unknown fields, no reserved name."""
    if schema is None:
        return None
    if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
        raise ConfigurationError("run_options_schema must be a pydantic BaseModel subclass")
    if schema.model_config.get("extra") != "forbid":
        raise ConfigurationError(
            "run_options_schema must refuse unknown fields (model_config extra='forbid')"
        )
    for name, info in schema.model_fields.items():
        for spelling in (name, info.alias, info.validation_alias, info.serialization_alias):
            if isinstance(spelling, str) and _normal(spelling) in RESERVED_RUN_OPTION_NAMES:
                raise ConfigurationError(
                    f"run_options_schema field {spelling!r} names what the service binds"
                    " (ownership, identity, request id, signal, redactor, limits)"
                )
    return schema


def validate_run_options(
    schema: type[BaseModel] | None, options: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """The validated options as a JSON object (what the runner gets), or None.

    ``invalid_request`` for anything the schema refuses, a reserved name, or options
    given to a service that declares none; ``limit_exceeded`` above the byte bound.
    """
    if options is None:
        return None
    if schema is None:
        raise ConversationError(
            Code.INVALID_REQUEST, "runOptions: this service declares no run options"
        )
    if not isinstance(options, Mapping):
        raise ConversationError(Code.INVALID_REQUEST, "runOptions must be a JSON object")
    for key in options:
        if not isinstance(key, str):
            raise ConversationError(Code.INVALID_REQUEST, "runOptions keys must be strings")
        if _normal(key) in RESERVED_RUN_OPTION_NAMES:
            raise ConversationError(
                Code.INVALID_REQUEST,
                f"runOptions may not carry {key[:64]!r} (ownership, identity and the request"
                " id are bound by the service)",
            )
    try:
        encoded = orjson.dumps(dict(options))
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise ConversationError(Code.INVALID_REQUEST, f"runOptions is not JSON: {exc}") from None
    cap = limits.THREAD_RUN_OPTIONS_BYTES
    if len(encoded) > cap:
        raise ConversationError(
            Code.LIMIT_EXCEEDED, f"runOptions longer than {cap} bytes as JSON", limit=cap
        )
    try:
        model = schema.model_validate_json(encoded, strict=True)
    except PydanticValidationError as exc:
        first: dict[str, Any] = dict(exc.errors()[0]) if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise ConversationError(
            Code.INVALID_REQUEST, f"runOptions: {where}: {first.get('msg', 'invalid')}"[:512]
        ) from None
    dumped: dict[str, Any] = model.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return dumped
