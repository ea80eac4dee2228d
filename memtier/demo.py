"""``memtier demo``: drive the conversation-memory store end to end.

Several simulated avatars talk to an agent on both channels from a few worker
threads at once; the demo then prints one key's LLM context, the metadata of
every session (never content) and the reason-code events.  With no
``MEMTIER_REDIS_URL`` it runs on the embedded in-process Redis and says so.

On a real Redis it works in a namespace of its own (``memtier-demo`` unless
``--namespace``), starts from a clean slate there and shows only the events it
published after that step.
"""

from __future__ import annotations

import argparse
import logging
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from memtier import limits
from memtier.clicommon import CliParser, add_common_arguments, guarded, load_config, setup_logging
from memtier.memory.models import (
    ActionResult,
    AgentResponse,
    AvatarMessage,
    Channel,
    ConversationKey,
    ToolSummary,
    Turn,
)
from memtier.memory.store import ConversationStore

AVATARS = 4
SCRIPT: list[Turn] = [
    AvatarMessage(text="Hi! Where can I find the sandbox region?"),
    AgentResponse(text="The public sandbox is in the north-east of the grid. Want a teleport?"),
    AvatarMessage(
        text="Yes please. My key is sk-proj-abcdefghijklmnopqrstuvwxyz0123456789 if needed"
    ),
    ToolSummary(tool="region_lookup", summary="Sandbox Island: online, 12 avatars, 128,128,25"),
    ActionResult(action="teleport_offer", outcome="offer sent; avatar accepted"),
    AgentResponse(text="Teleport sent -- enjoy the sandbox!"),
]


def _converse(store: ConversationStore, key: ConversationKey) -> int:
    for i, turn in enumerate(SCRIPT):
        # Retries reuse the turn id, so a lost reply never stores a turn twice.
        store.append(key, turn.model_copy(update={"turn_id": f"{key.member}:{i}"}))
    return len(SCRIPT)


DEMO_NAMESPACE = "memtier-demo"


def _where(url: str) -> str:
    """``scheme://host:port/db`` of a Redis URL, without credentials or query."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _events_end(store: ConversationStore) -> str | None:
    """The cursor after the newest event now on the stream (bounded: it is capped)."""
    cursor: str | None = None
    page_size = int(limits.EVENTS_PAGE.ceiling)
    for _ in range(int(limits.MAX_EVENTS.ceiling) // page_size + 2):
        page = store.events(after=cursor, limit=page_size)
        if not page:
            break
        cursor = page[-1].cursor
    return cursor


def main(argv: list[str] | None = None) -> int:
    parser = CliParser(prog="memtier demo", description=__doc__)
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    args.namespace = args.namespace or DEMO_NAMESPACE  # its own, never the app's default
    return guarded("demo", lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    setup_logging(args, logging.WARNING, plain=True)  # a demo for people, not log files
    config = load_config(args)
    store = ConversationStore.from_config(config)
    if not store.embedded and config.redis_url:  # the embedded case: memtier.connection says it
        print(
            f"memtier demo: using Redis at {_where(config.redis_url)}"
            f" (namespace {config.namespace!r}, its own)"
        )

    keys = [
        ConversationKey(uuid.uuid5(uuid.NAMESPACE_URL, f"memtier-demo-avatar-{n}"), channel)
        for n in range(AVATARS)
        for channel in (Channel.PUBLIC, Channel.IM)
    ]
    for key in keys:  # a clean slate, so the demo is repeatable on a real server
        store.delete(key)
    since = _events_end(store)  # show only the events of this run, not the clean slate's
    with ThreadPoolExecutor(max_workers=4) as pool:
        appended = sum(pool.map(lambda k: _converse(store, k), keys))
    print(f"\nappended {appended} turns from {AVATARS} avatars on both channels (4 threads)")

    # A retried turn (same turn id) is stored once.
    first = keys[0]
    receipt = store.append(first, SCRIPT[0].model_copy(update={"turn_id": f"{first.member}:0"}))
    print(f"retry of turn 0 -> duplicate={receipt.duplicate}, seq={receipt.seq} (stored once)")

    context = store.context(first)
    print(f"\ncontext for {first.avatar} on {first.channel.value} (session {context.session_id}):")
    for message in context.messages:
        flag = " [untrusted]" if message.untrusted else ""
        print(f"  {message.role:>9}{flag}: {message.content!r}")

    print("\nsession metadata (never content):")
    for meta in store.iter_metadata():
        print(
            f"  {meta.avatar} {meta.channel.value:<6} session={meta.session_id}"
            f" turns={meta.turn_count} bytes={meta.bytes}"
            f" last_active={meta.last_active_at:%H:%M:%S}"
        )

    store.expire(keys[1])
    store.delete(keys[2])
    print("\nevents (reason codes, never content):")
    for event in store.events(after=since):
        print(
            f"  {event.timestamp:%H:%M:%S} {event.reason.value:<26} {event.avatar} {event.channel}"
        )
    stats = store.stats()
    print(f"\nlive sessions: {stats['sessions']}, stored bytes: {stats['bytes']}")
    store.close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
