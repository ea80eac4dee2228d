"""D12: the ACL user deploy/ recommends runs all of memtier and nothing dangerous.

The ACL line is read from ``deploy/redis.conf`` (and must be the same in the
Kubernetes config map), installed on a private server of ours, and then the
whole memory API, a worker's compaction round, snapshots and the threads API run
as that user.  Everything an application has no business doing is denied:
FLUSHALL, FLUSHDB, KEYS, CONFIG, DEBUG, INFO, SHUTDOWN, SCRIPT FLUSH, CLIENT KILL,
MONITOR, FUNCTION, and any key outside memtier's namespace, from a command or
from inside a script.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from faultservers import FaultRedis, fault_redis
from servers import require_real_redis

from memtier import (
    ActionResult,
    AgentResponse,
    AvatarMessage,
    ConversationKey,
    ConversationStore,
    MemtierConfig,
    ToolSummary,
)
from memtier.threads import Ownership, RunnerReply, RunnerTurn, create_conversation_service
from memtier.workers.worker import Worker, WorkerOptions

pytestmark = pytest.mark.real

REPO = Path(__file__).resolve().parents[2]
ADMIN_PASSWORD = "admin-" + uuid.uuid4().hex
APP_PASSWORD = "app-" + uuid.uuid4().hex
OTHER_APP_KEY = "billing:invoice:42"  # another application's key on the same server
NAMESPACE = "memtier"  # the namespace the deploy/ example is written for
_ACL_RE = re.compile(r"^\s*#\s+user memtier (?P<rules>on .+)$", re.MULTILINE)


def recommended_rules(path: Path) -> list[str]:
    (rules,) = _ACL_RE.findall(path.read_text(encoding="utf-8"))
    return rules.split()


def test_redis_conf_and_kubernetes_recommend_the_same_user() -> None:
    assert recommended_rules(REPO / "deploy/redis.conf") == recommended_rules(
        REPO / "deploy/kubernetes/redis-configmap.yaml"
    )


@pytest.fixture
def acl_server() -> Any:
    require_real_redis("redis-server")
    rules = recommended_rules(REPO / "deploy/redis.conf")
    digest = hashlib.sha256(APP_PASSWORD.encode()).hexdigest()
    rules = [f"#{digest}" if r == "#<sha256-hex-of-password>" else r for r in rules]
    assert f"#{digest}" in rules, "the example lost its password placeholder"
    with fault_redis({"requirepass": ADMIN_PASSWORD}, password=ADMIN_PASSWORD) as server:
        with server.admin() as admin:
            admin.execute_command("ACL", "SETUSER", "memtier", *rules)
            admin.set(OTHER_APP_KEY, "paid")
        yield server


def _app_url(server: FaultRedis) -> str:
    return f"redis://memtier:{APP_PASSWORD}@127.0.0.1:{server.port}/0"


def test_the_whole_api_runs_as_the_recommended_user(acl_server: FaultRedis, tmp_path: Path) -> None:
    url = _app_url(acl_server)
    config = MemtierConfig.load(
        redis_url=url,
        namespace=NAMESPACE,
        conversation={
            "persistence_enabled": True,
            "storage_path": str(tmp_path),
            "max_turns_per_session": 10,
        },
    )
    store = ConversationStore.from_config(config, inline_compaction=False)
    key = ConversationKey(uuid.uuid4(), "im")
    other = ConversationKey(uuid.uuid4(), "public")
    try:
        store.append(key, AvatarMessage(text="hello"))
        store.append(key, AgentResponse(text="hi there"))
        store.append(key, ToolSummary(tool="weather", summary="sunny, 21 C"))
        store.append(key, ActionResult(action="teleport", outcome="arrived"))
        for n in range(6):
            store.append(key, AvatarMessage(text=f"more {n}"))
        store.append(other, AvatarMessage(text="elsewhere"))
        assert store.context(key).turns
        assert store.list_metadata().sessions
        assert store.stats()["sessions"] == 2
        worker = Worker(store, WorkerOptions(flush_interval_s=0))
        worker.run(drain=True, deadline_s=30)
        store.compact(key, force=True)
        flushed = store.flush()
        assert flushed.sessions == 2
        # The data-loss check needs no INFO: the gate state gone reads as a loss, and the
        # restore after it (create-only: both sessions are live) runs as this user too.
        assert store.check_data_loss(force=True) is None
        store.client.delete(store.core.keyspace.restore_state)
        lost = store.check_data_loss(force=True)
        assert lost is not None and lost.after_loss and lost.outcome == "restored", lost
        assert (lost.restored, lost.existing) == (0, 2)
        assert store.expire(other)
        assert store.delete(key)
        assert {e.reason for e in store.events()} >= {"operator_expired", "operator_deleted"}
        assert store.sweep() >= 0
        assert store.recover(force=True).outcome is not None
    finally:
        store.close()

    owner = Ownership("acme", "alice")

    def runner(turn: RunnerTurn) -> RunnerReply:
        return RunnerReply(f"echo {turn.message}")

    service = create_conversation_service(config, runner=runner)
    try:
        service.load_scripts()
        assert service.scripts_loaded()
        thread = service.create(owner, title="least privilege")
        result = service.continue_(owner, thread.id, "first", request_id="r1")
        leaf = service.get(owner, thread.id).head_id
        assert leaf is not None and result is not None
        service.branch(owner, thread.id, leaf)
        assert service.replay(owner, thread.id).records
        assert service.export(owner, thread.id).events
        assert service.list(owner).items
        service.archive(owner, thread.id)
        assert service.delete(owner, thread.id).deleted
    finally:
        service.close()

    with acl_server.admin() as admin:
        assert admin.get(OTHER_APP_KEY) == b"paid"


DENIED_COMMANDS: list[tuple[str, ...]] = [
    ("FLUSHALL",),
    ("FLUSHDB",),
    ("KEYS", "*"),
    ("CONFIG", "GET", "*"),
    ("CONFIG", "SET", "maxmemory", "1"),
    ("DEBUG", "SLEEP", "0"),
    ("INFO",),
    ("SHUTDOWN", "NOSAVE"),
    ("SCRIPT", "FLUSH"),
    ("SCRIPT", "KILL"),
    ("CLIENT", "KILL", "TYPE", "normal"),
    ("CLIENT", "LIST"),
    ("MONITOR",),
    ("FUNCTION", "FLUSH"),
    ("ACL", "SETUSER", "memtier", "+@all"),
    ("GET", OTHER_APP_KEY),
    ("SET", OTHER_APP_KEY, "stolen"),
    ("DEL", OTHER_APP_KEY),
    ("RENAME", OTHER_APP_KEY, "{memtier:x}"),
    ("EVAL", f"return redis.call('GET', '{OTHER_APP_KEY}')", "0"),
    ("EVAL", f"return redis.call('DEL', '{OTHER_APP_KEY}')", "1", OTHER_APP_KEY),
]


@pytest.mark.parametrize("command", DENIED_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_everything_else_is_denied(acl_server: FaultRedis, command: tuple[str, ...]) -> None:
    with redis.Redis.from_url(_app_url(acl_server), socket_timeout=5) as app:
        assert app.ping()
        with pytest.raises(redis.ResponseError) as denied:
            app.execute_command(*command)
        message = str(denied.value).lower()
        # NOPERM from a command; "can't access ... keys" from inside a script.
        assert "noperm" in message or "no permissions" in message or "can't access" in message, (
            command,
            message,
        )
    with acl_server.admin() as admin:
        assert admin.get(OTHER_APP_KEY) == b"paid"
        assert admin.dbsize() >= 1
