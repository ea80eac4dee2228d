"""Loaded into ``st run`` (``SCHEMATHESIS_HOOKS``) by test_threads_schemathesis.py.

schemathesis 4 starts a stateful walk only at operations its dependency heuristic
deems "likely to succeed with random data".  It reads ``requestId`` in the create
body as a foreign key to a ``Request`` resource that no operation produces, so it
never starts a walk at ``createConversation`` -- and the walk the issue asks for
(create -> continue -> branch -> archive -> export -> replay -> delete, through the
document's links) would never begin.  This marks the create operation as a root of
the walk.  It changes where walks may start, nothing about what is generated or
checked.
"""

from __future__ import annotations

from typing import Any

from schemathesis.specs.openapi import stateful

_original = stateful.is_likely_root_transition


def _create_is_a_root(operation: Any, node: Any, produced_anywhere: set[str]) -> bool:
    if operation.method == "post" and getattr(operation, "definition", None) is not None:
        raw = getattr(operation.definition, "raw", None)
        if isinstance(raw, dict) and raw.get("operationId") == "createConversation":
            return True
    return bool(_original(operation, node, produced_anywhere))


stateful.is_likely_root_transition = _create_is_a_root
