"""Models built from values memtier itself produced and checked, without validation.

One owner for :func:`trusted`: the memory read path (records, receipts) and the threads'
entries and thread hashes build models from stored values whose types the writer fixed;
pydantic 2's validation -- or its ``model_construct`` -- costs more per instance than the
values' own checks.  Callers check what they pass (or fall back to validating) and tests compare
the result with a validated instance.
"""

from __future__ import annotations

from typing import Any, Final, TypeVar

from pydantic import BaseModel

__all__ = ["trusted"]

_M = TypeVar("_M", bound=BaseModel)
# The slot descriptors of BaseModel's four instance slots: setting through them directly is
# what ``object.__setattr__`` ends up doing, without its per-call name lookup (the read path
# builds 40 models per context of 20 turns).
_SET_DICT: Final = BaseModel.__dict__["__dict__"].__set__
_SET_FIELDS_SET: Final = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_SET_EXTRA: Final = BaseModel.__dict__["__pydantic_extra__"].__set__
_SET_PRIVATE: Final = BaseModel.__dict__["__pydantic_private__"].__set__
_new: Final = object.__new__


def trusted(
    model: type[_M], values: dict[str, Any], fields_set: frozenset[str] | None = None
) -> _M:
    """An instance of a frozen memtier model from values the caller built and checked.

    What ``model_construct`` does (no validation), without its per-call overhead, which
    in pydantic 2.x costs more than validating: ``values`` must name every field, in
    declaration order, with the declared types (tests/memory/test_core_decode.py compares
    the result with a validated instance).  Only for models without private attributes or
    ``model_post_init``; the memory read path uses it (memory core, turn-record codec),
    the append receipt, the threads entries and the threads themselves
    (tests/threads/test_entry_rows.py, tests/threads/test_thread_records.py), the
    ledger's records (tests/threads/test_event_records.py) and a continue's result
    (tests/threads/test_threads_service.py).  ``fields_set``: the fields a
    validating call would have been given (default: all of them), for a model whose
    callers leave a defaulted field out.
    """
    obj = _new(model)
    _SET_DICT(obj, values)
    _SET_FIELDS_SET(obj, set(values) if fields_set is None else set(fields_set))
    _SET_EXTRA(obj, None)
    _SET_PRIVATE(obj, None)
    return obj
