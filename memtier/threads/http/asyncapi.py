"""The service as the routes call it: always awaitable, every method typed.

An :class:`~memtier.threads.aio.AsyncConversationService` is used as it is; a sync
:class:`~memtier.threads.service.ConversationService` is wrapped so that each call runs
in Starlette's threadpool (it blocks on Redis).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, TypeAlias

from starlette.concurrency import run_in_threadpool

from memtier.threads.aio import AsyncConversationService
from memtier.threads.models import (
    AgentIdentity,
    CancelResult,
    ContinueResult,
    ConversationThread,
    DeleteResult,
    ExportResult,
    Ownership,
    ReplayPage,
    ThreadPage,
)
from memtier.threads.service import ConversationService

__all__ = ["AsyncApi", "Service", "async_api"]

Service: TypeAlias = AsyncConversationService | ConversationService


class AsyncApi(Protocol):
    """The service methods the HTTP routes call."""

    async def create_or_get(
        self,
        ownership: Ownership,
        *,
        title: str | None = None,
        thread_id: str | None = None,
        request_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> tuple[ConversationThread, bool]: ...

    async def list(
        self, ownership: Ownership, *, cursor: str | None = None, limit: int | None = None
    ) -> ThreadPage: ...

    async def get(self, ownership: Ownership, thread_id: str) -> ConversationThread: ...

    async def delete(self, ownership: Ownership, thread_id: str) -> DeleteResult: ...

    async def continue_(
        self,
        ownership: Ownership,
        thread_id: str,
        message: str,
        *,
        request_id: str | None = None,
        leaf_id: str | None = None,
        run_options: Mapping[str, Any] | None = None,
        identity: AgentIdentity | None = None,
    ) -> ContinueResult: ...

    async def cancel_run(
        self, ownership: Ownership, thread_id: str, request_id: str
    ) -> CancelResult: ...

    async def branch(
        self,
        ownership: Ownership,
        thread_id: str,
        leaf_id: str,
        *,
        expected_version: int | None = None,
    ) -> ConversationThread: ...

    async def archive(
        self, ownership: Ownership, thread_id: str, *, expected_version: int | None = None
    ) -> ConversationThread: ...

    async def export(
        self, ownership: Ownership, thread_id: str, *, cursor: str | None = None
    ) -> ExportResult: ...

    async def replay(
        self,
        ownership: Ownership,
        thread_id: str,
        *,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> ReplayPage: ...


class _InThreadpool:
    """A sync service whose calls run in Starlette's threadpool (one line per method)."""

    def __init__(self, service: ConversationService) -> None:
        self._service = service

    async def create_or_get(
        self,
        ownership: Ownership,
        *,
        title: str | None = None,
        thread_id: str | None = None,
        request_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> tuple[ConversationThread, bool]:
        return await run_in_threadpool(
            self._service.create_or_get,
            ownership,
            title=title,
            thread_id=thread_id,
            request_id=request_id,
            metadata=metadata,
        )

    async def list(
        self, ownership: Ownership, *, cursor: str | None = None, limit: int | None = None
    ) -> ThreadPage:
        return await run_in_threadpool(self._service.list, ownership, cursor=cursor, limit=limit)

    async def get(self, ownership: Ownership, thread_id: str) -> ConversationThread:
        return await run_in_threadpool(self._service.get, ownership, thread_id)

    async def delete(self, ownership: Ownership, thread_id: str) -> DeleteResult:
        return await run_in_threadpool(self._service.delete, ownership, thread_id)

    async def continue_(
        self,
        ownership: Ownership,
        thread_id: str,
        message: str,
        *,
        request_id: str | None = None,
        leaf_id: str | None = None,
        run_options: Mapping[str, Any] | None = None,
        identity: AgentIdentity | None = None,
    ) -> ContinueResult:
        return await run_in_threadpool(
            self._service.continue_,
            ownership,
            thread_id,
            message,
            request_id=request_id,
            leaf_id=leaf_id,
            run_options=run_options,
            identity=identity,
        )

    async def cancel_run(
        self, ownership: Ownership, thread_id: str, request_id: str
    ) -> CancelResult:
        return await run_in_threadpool(self._service.cancel_run, ownership, thread_id, request_id)

    async def branch(
        self,
        ownership: Ownership,
        thread_id: str,
        leaf_id: str,
        *,
        expected_version: int | None = None,
    ) -> ConversationThread:
        return await run_in_threadpool(
            self._service.branch, ownership, thread_id, leaf_id, expected_version=expected_version
        )

    async def archive(
        self, ownership: Ownership, thread_id: str, *, expected_version: int | None = None
    ) -> ConversationThread:
        return await run_in_threadpool(
            self._service.archive, ownership, thread_id, expected_version=expected_version
        )

    async def export(
        self, ownership: Ownership, thread_id: str, *, cursor: str | None = None
    ) -> ExportResult:
        return await run_in_threadpool(self._service.export, ownership, thread_id, cursor=cursor)

    async def replay(
        self,
        ownership: Ownership,
        thread_id: str,
        *,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> ReplayPage:
        return await run_in_threadpool(
            self._service.replay, ownership, thread_id, cursor=cursor, limit=limit
        )


def async_api(service: Service) -> AsyncApi:
    """``service`` as the routes call it."""
    if isinstance(service, AsyncConversationService):
        return service
    return _InThreadpool(service)
