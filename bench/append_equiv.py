"""Two ``append_turn`` versions, the same calls: do replies and Redis state match?

``python -m bench.append_equiv --old-source OLD.lua [--seed S] [--calls N]``

``OLD.lua`` is the expanded ``append_turn`` of another tree (``store.scripts["append_turn"]
.source`` there) that takes this tree's ARGV.  Each version runs on its own private
``redis-server`` (free loopback port, temp dir, stopped by pid); both get exactly the same
calls, built once by this tree's ``MemoryCore`` with a driven test clock (steps forward,
back behind the partition's high-water mark, and past the TTL), fixed session ids, a small
pool of turn ids (retries), tool and chat turns, and tight bounds (30 sessions against a
ceiling of 12: evictions; 9 turns, 3 tool results: refusals).  Every reply must be equal;
so must the touched session hash, its newest record and the partition meta after every
call, and at the end every key's content: hashes (``xp`` left out and ``cq``'s value
masked: both hold server time), lists, zsets with scores, stream entries without their
ids.  Exit status 1 on the first difference.  A check of a script change that must not
change behaviour, not a benchmark: it prints how many calls took each path, so that a run
that missed a path shows.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import redis

from bench.server import BenchRedis
from memtier import AvatarMessage, ConversationKey, ConversationStore, MemtierConfig, ToolSummary

__all__ = ["main"]

T0 = 1_800_000_000_000


def _fields(raw: Mapping[Any, Any]) -> dict[bytes, bytes]:
    """A session hash but the fields that hold server time: ``xp`` (TIME of the last
    PEXPIRE) left out, ``cq`` (a stream id, from TIME) kept as present."""
    out = {f: v for f, v in raw.items() if f != b"xp"}
    if b"cq" in out:
        out[b"cq"] = b"<stream id>"
    return out


def _dump(client: redis.Redis) -> dict[bytes, Any]:
    out: dict[bytes, Any] = {}
    for name in sorted(client.scan_iter(count=1000)):
        kind = cast(bytes, client.type(name)).decode()
        value: Any
        if kind == "hash":
            value = _fields(client.hgetall(name))
        elif kind == "list":
            value = client.lrange(name, 0, -1)
        elif kind == "zset":
            value = client.zrange(name, 0, -1, withscores=True)
        elif kind == "stream":
            value = [entry[1] for entry in client.xrange(name) or []]
        else:
            value = client.dump(name)
        out[name] = (kind, value)
    return out


def _touched(client: redis.Redis, keys: tuple[str, ...]) -> tuple[Any, ...]:
    """The session hash (see ``_fields``), newest record and partition meta one call touched."""
    session, turns, meta = keys[0], keys[1], keys[6]
    return _fields(client.hgetall(session)), client.lindex(turns, -1), client.hgetall(meta)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.append_equiv", description=__doc__)
    p.add_argument("--old-source", type=Path, required=True, help="expanded old append_turn")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--calls", type=int, default=3000)
    args = p.parse_args(argv)
    old_source = args.old_source.read_text(encoding="utf-8")
    rng = random.Random(args.seed)
    config = MemtierConfig.load(
        namespace="equiv",
        conversation={
            "max_active_sessions": 12,
            "public_ttl_seconds": 60,
            "im_ttl_seconds": 120,
            "max_tool_results": 3,
            "max_turns_per_session": 9,
        },
    )
    clock = [T0]
    paths: dict[str, int] = {}
    with BenchRedis() as server_old, BenchRedis() as server_new:
        c_old, c_new = server_old.client(), server_new.client()
        store = ConversationStore(c_old, config, clock=lambda: clock[0])
        sha_old = c_old.script_load(old_source)
        sha_new = c_new.script_load(store.scripts["append_turn"].source)
        keys = [
            ConversationKey(f"00000000-0000-4000-8000-{i:012d}", "public" if i % 3 else "im")
            for i in range(30)
        ]
        for step in range(args.calls):
            r = rng.random()
            if r < 0.05:
                clock[0] += rng.choice([30_000, 61_000, 125_000])  # past a TTL
            elif r < 0.08:
                clock[0] -= rng.choice([1, 500, 5_000])  # behind the high-water mark
            else:
                clock[0] += rng.choice([0, 1, 13, 400])
            key = rng.choice(keys)
            turn_id = f"t{rng.randrange(40)}"
            turn = (
                ToolSummary(tool="s", summary="x" * rng.randrange(1, 50), turn_id=turn_id)
                if rng.random() < 0.2
                else AvatarMessage(text="y" * rng.randrange(1, 300), turn_id=turn_id)
            )
            call = store.core.append_call(
                store.core.prepare_turn(key, turn), session_id=f"ses_{step}"
            )
            reply_old = c_old.evalsha(sha_old, 9, *call.keys, *call.args)
            reply_new = c_new.evalsha(sha_new, 9, *call.keys, *call.args)
            if reply_old != reply_new:
                print(f"call {step}: replies differ: {reply_old!r} != {reply_new!r}")
                return 1
            # the session the call touched, after every call (later calls overwrite fields)
            touched_old = _touched(c_old, call.keys)
            touched_new = _touched(c_new, call.keys)
            if touched_old != touched_new:
                print(f"call {step}: session state differs: {touched_old!r} != {touched_new!r}")
                return 1
            status = int(reply_old[0])
            paths[str(status)] = paths.get(str(status), 0) + 1
            if status == 0:
                for name, index in (("rotated", 6), ("evicting", 9), ("sweeping", 11)):
                    if int(reply_old[index]) > 0:
                        paths[name] = paths.get(name, 0) + 1
        state_old, state_new = _dump(c_old), _dump(c_new)
        c_old.close()
        c_new.close()
    differ = sorted(
        k for k in set(state_old) | set(state_new) if state_old.get(k) != state_new.get(k)
    )
    print(f"{args.calls} calls, paths {paths}; {len(state_old)} keys; {len(differ)} differ")
    for key_name in differ[:5]:
        print(f"  {key_name!r}: {state_old.get(key_name)!r} != {state_new.get(key_name)!r}")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
