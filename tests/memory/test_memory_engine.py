"""The memory stores are shells over one engine (issue 13), and the asyncio hot path
steps on the event loop while blocking work (files, a summarizer hook) never does."""

from __future__ import annotations

import ast
import asyncio
import inspect
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from memhelpers import Clock, key

from memtier import AsyncConversationStore, AvatarMessage, ConversationStore
from memtier.memory.persistence import snapshot_dir_for
from memtier.memory.summary import SummaryRequest, deterministic_summary

ROOT = Path(__file__).resolve().parents[2]
API = (
    "append",
    "context",
    "list_metadata",
    "iter_metadata",
    "pop",
    "delete",
    "expire",
    "sweep",
    "stats",
    "events",
    "compact",
    "flush",
    "recover",
    "check_data_loss",
    "load_scripts",
)
MAX_SHELL_LINES = 6  # statements of a shell method, without its docstring


def _body_lines(method: Any) -> int:
    tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    end = body[-1].end_lineno or 0
    return end - body[0].lineno + 1


@pytest.mark.parametrize("store_type", [ConversationStore, AsyncConversationStore])
@pytest.mark.parametrize("name", API)
def test_every_api_method_only_drives_a_plan(store_type: type, name: str) -> None:
    assert _body_lines(getattr(store_type, name)) <= MAX_SHELL_LINES


def test_the_line_count_can_fail() -> None:
    def fat() -> int:
        """Doc."""
        a = 1
        b = a + 1
        c = b + 1
        d = c + 1
        e = d + 1
        f = e + 1
        return f

    assert _body_lines(fat) == 7 > MAX_SHELL_LINES


def test_nothing_in_the_package_imports_bench() -> None:
    offenders = []
    for path in (ROOT / "memtier").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(n == "bench" or n.startswith("bench.") for n in names):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


class _ThreadHops:
    """Counts asyncio.to_thread calls (the engine's offload) while installed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = asyncio.to_thread

        async def counting(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return await real(fn, *args, **kwargs)

        monkeypatch.setattr("memtier.engine.asyncio.to_thread", counting)


@pytest.mark.fake
async def test_async_hot_path_steps_inline_and_files_go_to_a_thread(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import fakeredis

    from memtier.config import MemtierConfig

    hops = _ThreadHops(monkeypatch)
    conv = {"persistence_enabled": True, "storage_path": str(tmp_path)}
    config = MemtierConfig.load(namespace="engine", conversation=conv)
    client = fakeredis.FakeAsyncRedis()
    store = AsyncConversationStore(client, config, snapshots=snapshot_dir_for(config))
    try:
        for i in range(3):
            await store.append(key(1), AvatarMessage(text=f"turn {i} " * 60))
        assert len((await store.context(key(1))).turns) == 3
        assert hops.calls == 0  # append and context: no thread hop
        await store.flush()
        assert hops.calls > 0  # snapshot files: stepped in a worker thread
    finally:
        await client.aclose()


async def test_async_inline_compaction_runs_the_summarizer_off_the_loop(backend: Any) -> None:
    loop_thread = threading.get_ident()
    seen: list[int] = []

    def summarizer(request: SummaryRequest) -> str:
        seen.append(threading.get_ident())
        return deterministic_summary(request)

    config = backend.config(conversation={"max_turns_per_session": 4})
    store = AsyncConversationStore(
        backend.async_client(), config, clock=Clock(), summarizer=summarizer
    )
    try:
        for i in range(6):  # the 5th and 6th appends find the session full
            await store.append(key(1), AvatarMessage(text=f"turn {i} " * 60))
    finally:
        await store.close()
    assert seen, "the inline compaction never called the summarizer"
    assert loop_thread not in seen


def test_sync_inline_compaction_calls_the_summarizer_in_the_callers_thread(
    backend: Any,
) -> None:
    seen: list[int] = []

    def summarizer(request: SummaryRequest) -> str:
        seen.append(threading.get_ident())
        return deterministic_summary(request)

    config = backend.config(conversation={"max_turns_per_session": 4})
    store = ConversationStore(backend.sync_client(), config, clock=Clock(), summarizer=summarizer)
    for i in range(6):
        store.append(key(1), AvatarMessage(text=f"turn {i} " * 60))
    assert seen and set(seen) == {threading.get_ident()}
