"""Snapshot generation files: format, write protocol, permissions, retention, validation."""

from __future__ import annotations

import errno
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from servers import unavailable
from workhelpers import (
    Clock,
    key,
    persistent_store,
    populate,
    resign,
    snaps,
    turn_for,
)

from memtier import AvatarMessage, ReasonCode, SnapshotError, limits
from memtier.memory import snapshot
from memtier.memory.snapshot import (
    HEADER_BLOCK,
    GenerationFile,
    Rejection,
    SnapshotDir,
    VerifiedGeneration,
    verify_generation,
)
from memtier.redaction import contains_secret

REPO = Path(__file__).resolve().parents[2]


def _verify(store: Any, gen: GenerationFile) -> VerifiedGeneration | Rejection:
    assert store.snapshots is not None
    return verify_generation(gen, store.config.namespace, store.core.conv, snaps(store).max_bytes)


def test_flush_writes_a_self_describing_generation(backend: Any, tmp_path: Path) -> None:
    clock = Clock()
    store = persistent_store(backend, tmp_path, clock)
    contexts = populate(store, 6, turns=4)
    result = store.flush()
    assert result.generation == 1 and result.sessions == 6 and result.skipped == {}
    path = Path(result.path)
    assert path.parent == tmp_path / "conversations"
    assert path.name == f"{backend.namespace}.00000000000000000001.snapshot"
    raw = path.read_bytes()
    assert raw.startswith(b"MEMTIER-SNAPSHOT\n") and len(raw) == result.bytes
    gen = snaps(store).generations()[0]
    verified = _verify(store, gen)
    assert isinstance(verified, VerifiedGeneration)
    header = verified.header
    assert header["format"] == "memtier-snapshot"
    assert header["format_version"] == 1 and header["schema_version"] == 1
    assert header["sessions"] == 6 and len(header["payload_sha256"]) == 64
    assert header["flush_wall_ms"] == clock.now and header["flush_clock_ms"] == clock.now
    lines = [orjson.loads(x) for x in raw[HEADER_BLOCK:].splitlines()]
    by_member = {line["member"]: line for line in lines}
    for k, ctx in contexts.items():
        line = by_member[k.member]
        assert line["id"] == ctx.session_id
        assert [r["seq"] for r in line["records"]] == [t.seq for t in ctx.turns]
        assert [r["role"] for r in line["records"]] == [t.role.value for t in ctx.turns]
        assert [r["f"] for r in line["records"]] == [t.fields for t in ctx.turns]
        assert line["bytes"] == sum(r["bytes"] for r in line["records"])
        assert sorted(t for t, _ in line["receipts"]) == sorted(r["id"] for r in line["records"])


def test_flush_includes_summaries_and_skips_expired_sessions(backend: Any, tmp_path: Path) -> None:
    clock = Clock()
    store = persistent_store(
        backend, tmp_path, clock, max_turns_per_session=10, public_ttl_seconds=60.0
    )
    k = key(1, "im")
    for i in range(30):
        store.append(k, turn_for(i))
    store.append(key(2), AvatarMessage(text="soon expired"))
    clock.advance(60_000)  # key(2) (public) is past its TTL, key(1) (IM) is not
    result = store.flush()
    assert result.sessions == 1
    line = orjson.loads(Path(result.path).read_bytes()[HEADER_BLOCK:].splitlines()[0])
    assert line["member"] == k.member and line["summary"] is not None
    assert line["summary_bytes"] == len(line["summary"].encode())
    assert line["age_ms"] == 60_000


def test_permissions_are_forced_to_0700_and_0600(backend: Any, tmp_path: Path) -> None:
    store = persistent_store(backend, tmp_path)
    directory = tmp_path / "conversations"
    directory.mkdir(mode=0o755)
    os.chmod(directory, 0o755)
    populate(store, 2)
    first = Path(store.flush().path)
    os.chmod(first, 0o644)  # someone loosened it
    old_umask = os.umask(0)
    try:
        second = Path(store.flush().path)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / "quarantine").stat().st_mode) == 0o700
    assert stat.S_IMODE(first.stat().st_mode) == 0o600
    assert stat.S_IMODE(second.stat().st_mode) == 0o600


def test_windows_emits_permissions_not_verified(
    backend: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = persistent_store(backend, tmp_path)
    populate(store, 1)
    monkeypatch.setattr(snapshot.directory, "is_windows", lambda: True)
    result = store.flush()
    assert result.permissions_verified is False
    events = [e for e in store.events(limit=100) if e.reason is ReasonCode.PERMISSIONS_NOT_VERIFIED]
    assert len(events) == 1 and events[0].detail == str(tmp_path / "conversations")
    assert events[0].avatar is None


def test_retention_keeps_newest_generations_that_fit(backend: Any, tmp_path: Path) -> None:
    store = persistent_store(backend, tmp_path)
    populate(store, 4)
    size = store.flush().bytes
    ceiling = int(size * 2.5)  # room for two generations of this size
    store = persistent_store(backend, tmp_path, max_snapshot_bytes=ceiling)
    results = [store.flush() for _ in range(4)]
    gens = snaps(store).generations()
    assert [g.generation for g in gens] == [5, 4]
    assert sum(g.size for g in gens) <= ceiling
    assert results[-1].removed and all(not Path(p).exists() for p in results[-1].removed)


def test_flush_larger_than_the_ceiling_fails_and_keeps_older(backend: Any, tmp_path: Path) -> None:
    store = persistent_store(backend, tmp_path, max_snapshot_bytes=HEADER_BLOCK + 4096)
    populate(store, 2)
    older = store.flush()
    populate(store, 40, start=10)
    with pytest.raises(SnapshotError) as info:
        store.flush()
    assert "max_snapshot_bytes" in info.value.message
    gens = snaps(store).generations()
    assert [g.generation for g in gens] == [older.generation]
    assert isinstance(_verify(store, gens[0]), VerifiedGeneration)
    assert not [n for n in os.listdir(tmp_path / "conversations") if n.startswith(".tmp")]


def test_generations_are_never_overwritten(backend: Any, tmp_path: Path) -> None:
    store = persistent_store(backend, tmp_path)
    populate(store, 1)
    store.flush()
    directory = tmp_path / "conversations"
    squatter = directory / f"{backend.namespace}.00000000000000000002.snapshot"
    squatter.write_bytes(b"published by someone else")
    result = store.flush()
    assert result.generation == 3
    assert squatter.read_bytes() == b"published by someone else"
    verified = _verify(store, snaps(store).generations()[0])
    assert isinstance(verified, VerifiedGeneration) and verified.header["generation"] == 3


def test_stale_temp_files_of_dead_processes_are_removed(backend: Any, tmp_path: Path) -> None:
    store = persistent_store(backend, tmp_path)
    directory = tmp_path / "conversations"
    directory.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = directory / f".tmp.{backend.namespace}.{dead.pid}.abcdef"
    live = directory / f".tmp.{backend.namespace}.{os.getppid()}.abcdef"
    stale.write_bytes(b"partial")
    live.write_bytes(b"being written")
    populate(store, 1)
    store.flush()
    assert not stale.exists() and live.exists()


def test_flush_while_appending_gives_consistent_sessions(
    backend_no_fake: Any, tmp_path: Path
) -> None:
    """Appends from other threads during a flush: every session in the file adds up."""
    store = persistent_store(backend_no_fake, tmp_path)
    populate(store, 200, turns=2)
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        other = persistent_store(backend_no_fake, tmp_path)
        i = 0
        try:
            while not stop.is_set():
                other.append(
                    key(1 + (i * 7 + n) % 200, "im" if n % 2 else "public"),
                    AvatarMessage(text=f"concurrent {i}"),
                )
                i += 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    try:
        results = [store.flush() for _ in range(3)]
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors
    for gen in snaps(store).generations():
        assert isinstance(_verify(store, gen), VerifiedGeneration), gen  # validator: exact sums
    assert all(r.sessions >= 200 for r in results)


# --------------------------------------------------------------------------- damaged files


@pytest.fixture
def small_generation(tmp_path: Path) -> tuple[Any, GenerationFile]:
    import fakeredis

    from memtier import ConversationStore
    from memtier.config import MemtierConfig
    from memtier.memory.persistence import snapshot_dir_for

    config = MemtierConfig.load(
        namespace="small",
        conversation={"persistence_enabled": True, "storage_path": str(tmp_path)},
    )
    store = ConversationStore(
        fakeredis.FakeRedis(), config, clock=Clock(), snapshots=snapshot_dir_for(config)
    )
    populate(store, 2, turns=2)
    store.flush()
    return store, snaps(store).generations()[0]


def test_every_truncation_is_rejected(small_generation: tuple[Any, GenerationFile]) -> None:
    store, gen = small_generation
    data = gen.path.read_bytes()
    probe = gen.path.with_name(gen.path.name)  # same name: the generation number must match
    reasons = set()
    for cut in range(len(data)):
        probe.write_bytes(data[:cut])
        result = _verify(store, GenerationFile(gen.generation, probe, cut))
        assert isinstance(result, Rejection), cut
        reasons.add(result.reason)
    assert reasons <= {"truncated", "bad_magic", "bad_header", "checksum"}
    probe.write_bytes(data)
    assert isinstance(_verify(store, gen), VerifiedGeneration)


def test_every_single_bit_flip_is_rejected(small_generation: tuple[Any, GenerationFile]) -> None:
    store, gen = small_generation
    data = bytearray(gen.path.read_bytes())
    for pos in range(len(data)):
        flipped = bytearray(data)
        flipped[pos] ^= 1 << (pos % 8)
        gen.path.write_bytes(bytes(flipped))
        assert isinstance(_verify(store, gen), Rejection), pos
    gen.path.write_bytes(bytes(data))
    assert isinstance(_verify(store, gen), VerifiedGeneration)


def test_trailing_garbage_and_oversized_files_are_rejected(
    small_generation: tuple[Any, GenerationFile], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, gen = small_generation
    data = gen.path.read_bytes()
    gen.path.write_bytes(data + b"\n")
    assert _verify(store, gen) == Rejection("corrupt", "1 bytes after the payload")
    gen.path.write_bytes(data)
    # A file over today's (lowered) max_snapshot_bytes is still read: integrity is per
    # file, against the hard ceiling; bounds are applied per session when restoring.
    result = verify_generation(gen, "small", store.core.conv, len(data) - 1)
    assert isinstance(result, VerifiedGeneration)
    monkeypatch.setattr(
        limits, "MAX_SNAPSHOT_BYTES", limits.Bound(1024, len(data) - 1, 1024, "bytes")
    )
    result = verify_generation(gen, "small", store.core.conv, len(data) - 1)
    assert isinstance(result, Rejection) and result.reason == "oversized"


GITHUB_TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJlMTIz"


def _secret_in_content(i: int, obj: dict[str, Any]) -> dict[str, Any]:
    """The first record's body becomes a token, with byte counts kept consistent."""
    first = dict(obj["records"][0])
    body = next(k for k in first["f"] if k in ("text", "summary", "outcome"))
    first["f"] = {**first["f"], body: f"my token is {GITHUB_TOKEN}"}
    delta = sum(len(v.encode()) for v in first["f"].values()) - first["bytes"]
    first["bytes"] += delta
    return {**obj, "records": [first, *obj["records"][1:]], "bytes": obj["bytes"] + delta}


def _secret_in_turn_id(i: int, obj: dict[str, Any]) -> dict[str, Any]:
    return {**obj, "records": [{**obj["records"][0], "id": JWT}, *obj["records"][1:]]}


def _duplicate_sequence(i: int, obj: dict[str, Any]) -> dict[str, Any]:
    first = obj["records"][0]
    return {
        **obj,
        "records": [first, first, *obj["records"][2:]],
        "bytes": obj["bytes"] - obj["records"][1]["bytes"] + first["bytes"],
        "tools": obj["tools"] - obj["records"][1]["tool"] + first["tool"],
    }


@pytest.mark.parametrize(
    ("name", "header", "line", "reason"),
    [
        ("schema", lambda h: h.update(schema_version=2), None, "unsupported"),
        ("format", lambda h: h.update(format_version=99), None, "unsupported"),
        ("namespace", lambda h: h.update(namespace="other"), None, "bad_header"),
        ("duplicate seq", None, _duplicate_sequence, "duplicate_sequence"),
        ("secret", None, _secret_in_content, "secret"),
        ("secret turn id", None, _secret_in_turn_id, "secret"),
        ("uuid", None, lambda i, o: {**o, "member": "not-a-uuid:public"}, "invalid_session"),
        ("upper uuid", None, lambda i, o: {**o, "member": o["member"].upper()}, "invalid_session"),
        (
            "channel",
            None,
            lambda i, o: {**o, "member": o["member"].rsplit(":", 1)[0] + ":group"},
            "invalid_session",
        ),
        ("session id", None, lambda i, o: {**o, "id": "x"}, "invalid_session"),
        (
            "role",
            None,
            lambda i, o: {**o, "records": [{**r, "role": "system"} for r in o["records"]]},
            "invalid_record",
        ),
        (
            "kind",
            None,
            lambda i, o: {**o, "records": [{**r, "kind": "system"} for r in o["records"]]},
            "invalid_record",
        ),
        ("bytes", None, lambda i, o: {**o, "bytes": o["bytes"] + 1}, "invalid_session"),
        (
            "record bytes",
            None,
            lambda i, o: {**o, "records": [{**r, "bytes": r["bytes"] + 1} for r in o["records"]]},
            "invalid_record",
        ),
        ("timestamp", None, lambda i, o: {**o, "created_ms": -5}, "invalid_session"),
        ("order", None, lambda i, o: {**o, "created_ms": o["last_ms"] + 1}, "invalid_session"),
        ("bound", None, lambda i, o: {**o, "turns": 10_000}, "invalid_session"),
        ("extra field", None, lambda i, o: {**o, "system_prompt": "obey"}, "invalid_session"),
        (
            # A receipt may name another session id (the one a restored session came
            # from), but never a seq beyond the session's counter.
            "receipt",
            None,
            lambda i, o: {
                **o,
                "receipts": [
                    [t, "|".join([r.split("|")[0], "9999999", *r.split("|")[2:]])]
                    for t, r in o["receipts"]
                ],
            },
            "invalid_session",
        ),
        (
            "duplicate session",
            None,
            lambda i, o: {**o, "member": "00000000-0000-0000-0000-000000000001:public"},
            "duplicate_session",
        ),
    ],
)
def test_forged_generations_with_valid_checksums_are_rejected(
    small_generation: tuple[Any, GenerationFile], name: str, header: Any, line: Any, reason: str
) -> None:
    store, gen = small_generation
    assert isinstance(_verify(store, gen), VerifiedGeneration)
    resign(gen.path, header=header, line=line)
    result = _verify(store, gen)
    assert isinstance(result, Rejection), name
    assert result.reason == reason, (name, result)


# --------------------------------------------------------------------------- crashes and disks


_FLUSH_CHILD = textwrap.dedent(
    """
    import sys
    from memtier import ConversationStore
    from memtier.config import MemtierConfig
    url, ns, path = sys.argv[1:4]
    config = MemtierConfig.load(redis_url=url, namespace=ns, conversation={
        "persistence_enabled": True, "storage_path": path})
    store = ConversationStore.from_config(config, recover=False)
    print("ready", flush=True)
    while True:
        store.flush()
    """
)


@pytest.mark.slow
def test_flush_killed_at_random_points_never_leaves_an_accepted_partial(
    redis_server: Any, tmp_path: Path
) -> None:
    from memtier import ConversationStore
    from memtier.config import MemtierConfig

    namespace = "kill" + os.urandom(4).hex()
    config = MemtierConfig.load(
        redis_url=redis_server.url,
        namespace=namespace,
        conversation={"persistence_enabled": True, "storage_path": str(tmp_path)},
    )
    store = ConversationStore.from_config(config, recover=False)
    try:
        contexts = populate(store, 300, turns=3)
        baseline = store.flush()
        rng = random.Random(20261130)
        interrupted = 0
        for _ in range(8):
            child = subprocess.Popen(
                [sys.executable, "-c", _FLUSH_CHILD, redis_server.url, namespace, str(tmp_path)],
                stdout=subprocess.PIPE,
                cwd=REPO,
            )
            assert child.stdout is not None
            assert child.stdout.readline().strip() == b"ready"
            time.sleep(rng.uniform(0.0, baseline.duration_s * 3))
            child.send_signal(signal.SIGKILL)
            child.wait()
            child.stdout.close()
            # The child flushes in a loop: a kill lands inside a flush and leaves its temp.
            temps = [n for n in os.listdir(tmp_path / "conversations") if n.startswith(".tmp")]
            interrupted += bool(temps)
            for gen in snaps(store).generations():
                # Every published name is a complete generation; partials stay temps.
                assert isinstance(_verify(store, gen), VerifiedGeneration), gen
        assert interrupted >= 1  # at least one kill really cut a flush short
        assert Path(baseline.path).exists()
        assert isinstance(
            _verify(store, GenerationFile(baseline.generation, Path(baseline.path), 0)),
            VerifiedGeneration,
        )
        # Wipe Redis, recover: the newest valid generation comes back.
        store.client.delete(*store.client.keys("*" + namespace + "*"))
        report = store.recover()
        assert report.outcome == "restored" and report.restored == 300
        for k, ctx in contexts.items():
            assert store.context(k).messages == ctx.messages
    finally:
        leftover = store.client.keys("*" + namespace + "*")
        if leftover:
            store.client.delete(*leftover)
        store.close()


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Any:
    """A 64 KiB tmpfs mounted for the test (root only); unmounted at teardown."""
    mount = shutil.which("mount")
    umount = shutil.which("umount")
    if os.geteuid() != 0 or not mount or not umount:
        unavailable("ENOSPC test needs root to mount a tmpfs (not root here)")
    point = tmp_path / "tiny"
    point.mkdir()
    done = subprocess.run(
        [mount, "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(point)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        unavailable(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        yield point
    finally:
        subprocess.run([umount, "-l", str(point)], check=False)


def test_enospc_during_flush_is_a_clear_error_and_keeps_older(
    backend: Any, tiny_disk: Path
) -> None:
    store = persistent_store(backend, tiny_disk)
    populate(store, 3)
    older = store.flush()
    populate(store, 120, turns=6, start=10)
    with pytest.raises(SnapshotError) as info:
        store.flush()
    assert info.value.details["errno"] == errno.ENOSPC
    assert "no space left on device" in info.value.message
    gens = snaps(store).generations()
    assert [g.generation for g in gens] == [older.generation]
    assert isinstance(_verify(store, gens[0]), VerifiedGeneration)
    assert not [n for n in os.listdir(tiny_disk / "conversations") if n.startswith(".tmp")]


def test_snapshot_dir_unit_retention_and_listing(tmp_path: Path) -> None:
    directory = SnapshotDir(tmp_path, "ns", max_bytes=10)
    assert directory.generations() == []
    for gen, size in ((1, 4), (2, 4), (3, 4)):
        (tmp_path / directory.name_of(gen)).write_bytes(b"x" * size)
    (tmp_path / "other.00000000000000000009.snapshot").write_bytes(b"x" * 100)  # other namespace
    removed = directory.retain()
    assert [p.name for p in removed] == [directory.name_of(1)]
    assert [g.generation for g in directory.generations()] == [3, 2]
    assert (tmp_path / "other.00000000000000000009.snapshot").exists()


# --------------------------------------------------------------------------- secret prefilter


def _redaction_corpus() -> list[str]:
    """The positive examples of tests/test_redaction.py (one per secret kind and more)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "redaction_corpus", REPO / "tests" / "test_redaction.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    secrets = list(module.SECRETS)
    assert len(secrets) >= 30
    return secrets


SECRETS = _redaction_corpus()
_pieces = st.one_of(
    st.sampled_from(SECRETS),
    st.text(max_size=40),
    st.builds(
        lambda a, s, b: a + s + b,
        st.text(max_size=12),
        st.sampled_from(SECRETS),
        st.text(max_size=12),
    ),
    st.builds(lambda s: s[: len(s) // 2], st.sampled_from(SECRETS)),
    st.builds(lambda s: s[len(s) // 2 :], st.sampled_from(SECRETS)),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fields=st.lists(_pieces, min_size=1, max_size=6))
def test_secret_prefilter_never_misses_a_field(fields: list[str]) -> None:
    """The validator checks a session's texts joined by a blank line first: that is only
    exact if no pattern can be hidden by joining (a secret in one field must still be
    found in the joined text)."""
    if any(contains_secret(f) for f in fields):
        assert contains_secret(snapshot.validation.SEPARATOR.join(fields))


def test_secret_prefilter_on_every_corpus_secret_between_neighbours() -> None:
    neighbours = [
        "",
        "token",
        "password=",
        "Authorization: Bearer",
        "https://",
        "-----BEGIN",
        "x" * 30,
        "eyJ",
        "AKIA",
        "é",
        "a\\",
        '"',
        "'",
    ]
    for secret in SECRETS:
        assert contains_secret(secret), secret
        for before in neighbours:
            for after in neighbours:
                joined = snapshot.validation.SEPARATOR.join([before, secret, after])
                assert contains_secret(joined), (before, secret, after)
