"""What the flush and the recovery plans share: the event call, reply text, the directory."""

from __future__ import annotations

from typing import Any

from memtier.engine import ScriptCall
from memtier.memory.core import MemoryCore
from memtier.memory.models import ConversationKey, ReasonCode
from memtier.memory.scriptspecs import EMIT_EVENT
from memtier.memory.snapshot.directory import SnapshotDir

__all__ = ["emit_event_call", "snapshot_dir_for"]


def emit_event_call(
    core: MemoryCore,
    reason: ReasonCode,
    detail: str,
    *,
    partition: int = 0,
    member: str = "",
    session_id: str = "",
) -> ScriptCall:
    """Publish a ``quarantined`` / ``permissions_not_verified`` / ``snapshot_skipped`` /
    ``restore_skipped`` event: on the member's partition, else partition 0's stream."""
    if member:
        part = core.partition_for(ConversationKey.from_member(member))
    else:
        part = core.keyspace.partition(partition)
    return EMIT_EVENT.call(
        {"meta": part.meta, "events": part.events},
        reason=reason.value,
        member=member,
        session_id=session_id,
        detail=detail[:512],
        max_events=core.conv.max_events,
        clock_override=core.clock_arg(),
    )


def snapshot_dir_for(config: Any) -> SnapshotDir:
    """``<storage_path>/conversations`` of a :class:`~memtier.config.MemtierConfig`."""
    conv = config.conversation
    return SnapshotDir(
        conv.storage_path / "conversations", config.namespace, max_bytes=conv.max_snapshot_bytes
    )
