"""memtier/scripts.py: file names, includes, key counts, SHAs, NOSCRIPT recovery.

The loader's unit tests build tiny Lua trees in ``tmp_path``; the recovery tests
run on fakeredis, a real redis-server and a real Redis Cluster.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import redis
from servers import Backend, RedisClusterServers, RedisServer

from memtier import scripts
from memtier.errors import ScriptError
from memtier.scripts import LuaScript, expand_includes, load_registry, lua_root

REPO = Path(__file__).resolve().parent.parent


def write(root: Path, relative: str, text: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A Lua tree with one include and two scripts in folder ``area``."""
    root = tmp_path / "lua"
    write(root, "includes/common.lua", "local function seven() return 7 end\n")
    write(
        root,
        "area/get_seven-0.lua",
        '-- header\n--- @include "common"\nreturn seven()\n',
    )
    write(
        root,
        "area/bump-2.lua",
        "local a, b = KEYS[1], KEYS[2]\n"
        "return {redis.call('INCR', a), redis.call('INCRBY', b, tonumber(ARGV[1]))}\n",
    )
    return root


# --------------------------------------------------------------------- file names


def test_names_carry_the_key_count(tree: Path) -> None:
    registry = load_registry("area", root=tree)
    assert registry.names() == ["bump", "get_seven"]
    assert registry["bump"].num_keys == 2
    assert registry["get_seven"].num_keys == 0
    assert {s.name for s in registry} == {"bump", "get_seven"}


def test_multi_digit_key_count(tmp_path: Path) -> None:
    path = write(tmp_path, "area/wide-12.lua", "return 1\n")
    assert LuaScript.from_file(path, tmp_path).num_keys == 12


@pytest.mark.parametrize("name", ["helper.lua", "noisy-x.lua", "Upper-1.lua", "two-1-2.lua"])
def test_script_without_key_count_suffix_is_rejected(tree: Path, name: str) -> None:
    write(tree, f"area/{name}", "return 1\n")
    with pytest.raises(ScriptError, match="lacks its -<numkeys> suffix"):
        load_registry("area", root=tree)


def test_two_scripts_with_one_name_are_rejected(tree: Path) -> None:
    write(tree, "area/bump-3.lua", "return 1\n")
    with pytest.raises(ScriptError, match="two Lua scripts named 'bump'"):
        load_registry("area", root=tree)


def test_empty_folder_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "area").mkdir()
    with pytest.raises(ScriptError, match="no Lua scripts"):
        load_registry("area", root=tmp_path)


def test_registry_with_root_is_not_cached(tree: Path) -> None:
    first = load_registry("area", root=tree)
    write(tree, "area/get_seven-0.lua", "return 8\n")
    second = load_registry("area", root=tree)
    assert first["get_seven"].source != second["get_seven"].source
    assert second["get_seven"].source == "return 8\n"


# --------------------------------------------------------------------- includes


def test_include_is_inlined(tree: Path) -> None:
    script = load_registry("area", root=tree)["get_seven"]
    assert "@include" not in script.source
    assert script.source == "-- header\nlocal function seven() return 7 end\n\nreturn seven()\n"


def test_nested_includes_are_inlined(tmp_path: Path) -> None:
    write(tmp_path, "includes/outer.lua", '--- @include "inner"\nlocal function outer() end\n')
    write(tmp_path, "includes/inner.lua", "local function inner() end\n")
    text = expand_includes('--- @include "outer"\nreturn 1\n', tmp_path)
    assert text.index("local function inner()") < text.index("local function outer()")
    assert "@include" not in text


def test_include_in_a_subfolder_of_includes(tmp_path: Path) -> None:
    write(tmp_path, "includes/memory/acct.lua", "local acct = 1\n")
    assert "local acct = 1" in expand_includes('--- @include "memory/acct"\n', tmp_path)


def test_missing_include_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ScriptError, match="missing Lua include 'nowhere'"):
        expand_includes('--- @include "nowhere"\n', tmp_path)


def test_circular_include_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, "includes/a.lua", '--- @include "b"\n')
    write(tmp_path, "includes/b.lua", '--- @include "a"\n')
    with pytest.raises(ScriptError, match="circular Lua include: a -> b -> a"):
        expand_includes('--- @include "a"\n', tmp_path)


def test_self_include_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, "includes/a.lua", '--- @include "a"\n')
    with pytest.raises(ScriptError, match="circular"):
        expand_includes('--- @include "a"\n', tmp_path)


def test_duplicate_include_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, "includes/a.lua", "local x = 1\n")
    with pytest.raises(ScriptError, match="duplicate Lua include 'a'"):
        expand_includes('--- @include "a"\n--- @include "a"\n', tmp_path)


def test_include_depth_is_bounded(tmp_path: Path) -> None:
    depth = scripts._MAX_INCLUDE_DEPTH
    for i in range(depth + 1):
        write(tmp_path, f"includes/i{i}.lua", f'--- @include "i{i + 1}"\n' if i < depth else "")
    # includes i1 .. i<depth> under the top-level one: exactly at the bound, accepted
    write(tmp_path, f"includes/i{depth}.lua", "local deepest = 1\n")
    assert "local deepest = 1" in expand_includes('--- @include "i1"\n', tmp_path)
    # one level more is refused
    with pytest.raises(ScriptError, match="nested too deeply"):
        expand_includes('--- @include "i0"\n', tmp_path)


def test_include_line_must_be_the_marker_form(tmp_path: Path) -> None:
    """Only ``--- @include "name"`` on its own line is a directive; prose is left alone."""
    text = '-- see @include "x" for details\nlocal s = \'--- @include "x"\'\n'
    assert expand_includes(text, tmp_path) == text


# --------------------------------------------------------------------- SHA and key count


def test_sha_is_over_the_expanded_text(tree: Path) -> None:
    script = load_registry("area", root=tree)["get_seven"]
    raw = (tree / "area/get_seven-0.lua").read_text()
    assert script.sha == hashlib.sha1(script.source.encode()).hexdigest()
    assert script.sha != hashlib.sha1(raw.encode()).hexdigest()


class NoIO:
    """A client that fails the test on any use: proves a check happens before I/O."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"client.{name} used")


@pytest.mark.parametrize("keys", [[], ["k1"], ["k1", "k2", "k3"]])
def test_wrong_key_count_raises_before_any_io(tree: Path, keys: list[str]) -> None:
    bump = load_registry("area", root=tree)["bump"]
    with pytest.raises(ScriptError, match="bump takes 2 keys, got"):
        bump(NoIO(), keys, [1])


async def test_wrong_key_count_raises_before_any_io_async(tree: Path) -> None:
    bump = load_registry("area", root=tree)["bump"]
    with pytest.raises(ScriptError, match="bump takes 2 keys, got 1"):
        await bump.call_async(NoIO(), ["k1"], [1])


def test_redis_computes_the_same_sha(backend: Backend, tree: Path) -> None:
    registry = load_registry("area", root=tree)
    client = backend.sync_client()
    for script in registry:
        assert client.script_load(script.source) == script.sha


# --------------------------------------------------------------------- calls and NOSCRIPT


def _keys(backend: Backend) -> list[str]:
    tag = "{" + backend.namespace + ":m:0}"
    return [f"{tag}:a", f"{tag}:b"]


def _script_flush(backend: Backend, client: Any) -> None:
    if isinstance(backend.server, RedisClusterServers | RedisServer):
        backend.server.script_flush()  # every node, replicas included
    else:
        client.script_flush()


def test_noscript_recovery_after_script_flush(backend: Backend, tree: Path) -> None:
    bump = load_registry("area", root=tree)["bump"]
    client = backend.sync_client()
    keys = _keys(backend)
    _script_flush(backend, client)
    assert client.script_exists(bump.sha) == [False]
    assert bump(client, keys, [10]) == [1, 10]  # NOSCRIPT -> SCRIPT LOAD -> EVALSHA
    assert client.script_exists(bump.sha) == [True]
    _script_flush(backend, client)
    assert client.script_exists(bump.sha) == [False]
    assert bump(client, keys, [5]) == [2, 15]  # ran exactly once more
    assert client.script_exists(bump.sha) == [True]


async def test_noscript_recovery_after_script_flush_async(backend: Backend, tree: Path) -> None:
    bump = load_registry("area", root=tree)["bump"]
    client = backend.async_client()
    keys = _keys(backend)
    _script_flush(backend, backend.sync_client())
    assert await bump.call_async(client, keys, [10]) == [1, 10]
    _script_flush(backend, backend.sync_client())
    assert await client.script_exists(bump.sha) == [False]
    assert await bump.call_async(client, keys, [5]) == [2, 15]
    assert await client.script_exists(bump.sha) == [True]


@pytest.mark.real
def test_noscript_recovery_after_redis_restart(redis_server: RedisServer, tree: Path) -> None:
    """A restart empties the script cache (and, without persistence, the data)."""
    bump = load_registry("area", root=tree)["bump"]
    client = redis.Redis.from_url(redis_server.url)  # redis-py's default reconnect retry
    try:
        keys = ["{tloaderrestart}:a", "{tloaderrestart}:b"]
        assert bump(client, keys, [3]) == [1, 3]
        redis_server.restart()
        assert bump(client, keys, [3]) == [1, 3]  # a fresh server: NOSCRIPT, reload, run
        assert client.script_exists(bump.sha) == [True]
        client.delete(*keys)
    finally:
        client.close()


@pytest.mark.cluster
def test_load_all_reaches_every_primary(redis_cluster: RedisClusterServers, tree: Path) -> None:
    from redis.cluster import RedisCluster

    registry = load_registry("area", root=tree)
    redis_cluster.script_flush()
    client = RedisCluster.from_url(redis_cluster.node_url)
    try:
        registry.load_all(client)
    finally:
        client.close()
    for port in redis_cluster.primaries():
        with redis_cluster.node_client(port) as node:
            assert node.script_exists(*(s.sha for s in registry)) == [True, True]


@pytest.mark.cluster
async def test_load_all_async_reaches_every_primary(
    redis_cluster: RedisClusterServers, tree: Path
) -> None:
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    registry = load_registry("area", root=tree)
    redis_cluster.script_flush()
    client = AsyncRedisCluster.from_url(redis_cluster.node_url)
    try:
        await registry.load_all_async(client)
    finally:
        await client.aclose()
    for port in redis_cluster.primaries():
        with redis_cluster.node_client(port) as node:
            assert node.script_exists(*(s.sha for s in registry)) == [True, True]


def test_memtier_error_reply_becomes_script_error(backend: Backend, tmp_path: Path) -> None:
    path = write(tmp_path, "area/reject-1.lua", "return redis.error_reply('memtier: bad ARGV')\n")
    reject = LuaScript.from_file(path, tmp_path)
    with pytest.raises(ScriptError, match="script reject rejected its arguments") as info:
        reject(backend.sync_client(), _keys(backend)[:1], [])
    assert info.value.code == "script_error"


async def test_memtier_error_reply_becomes_script_error_async(
    backend: Backend, tmp_path: Path
) -> None:
    path = write(tmp_path, "area/reject-1.lua", "return redis.error_reply('memtier: bad ARGV')\n")
    reject = LuaScript.from_file(path, tmp_path)
    with pytest.raises(ScriptError, match="rejected its arguments"):
        await reject.call_async(backend.async_client(), _keys(backend)[:1], [])


def test_other_redis_errors_are_not_script_errors(backend: Backend, tmp_path: Path) -> None:
    """WRONGTYPE and friends stay redis errors, for the retry/translate boundary to judge."""
    path = write(tmp_path, "area/lpush-1.lua", "return redis.call('LPUSH', KEYS[1], 'x')\n")
    lpush = LuaScript.from_file(path, tmp_path)
    client = backend.sync_client()
    key = _keys(backend)[0]
    client.set(key, "a string")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE") as info:
        lpush(client, [key], [])
    assert not isinstance(info.value, ScriptError)


# --------------------------------------------------------------------- the shipped tree


def test_lua_root_is_the_checkout_or_the_packaged_copy() -> None:
    root = lua_root()
    assert root.is_dir()
    if root.parts[-2:] == ("memtier", "_lua"):
        return  # installed from a wheel: tests/test_packaging.py checks the contents
    assert root == REPO / "lua"


def _shipped_folders() -> list[str]:
    root = lua_root()
    return sorted(
        p.name
        for p in root.iterdir()
        if p.is_dir() and p.name != "includes" and any(p.glob("*.lua"))
    )


def test_every_shipped_script_loads() -> None:
    root = lua_root()
    for folder in _shipped_folders():
        registry = load_registry(folder)
        assert len(registry.names()) == len(list((root / folder).glob("*.lua")))
        for script in registry:
            assert "@include" not in script.source, f"{folder}/{script.name}"


@pytest.mark.real
def test_every_shipped_script_compiles_on_redis(redis_server: RedisServer) -> None:
    """SCRIPT LOAD compiles: a Lua syntax error fails here, and the SHAs agree with Redis."""
    with redis_server.client() as client:
        for folder in _shipped_folders():
            for script in load_registry(folder):
                assert client.script_load(script.source) == script.sha, script.name


def test_diamond_include_is_inlined_once(tmp_path: Path) -> None:
    """a -> b, a -> c, b -> d, c -> d: d's text appears exactly once."""
    from memtier.scripts import expand_includes

    inc = tmp_path / "includes"
    inc.mkdir()
    (inc / "b.lua").write_text('--- @include "d"\nlocal function b() end\n')
    (inc / "c.lua").write_text('--- @include "d"\nlocal function c() end\n')
    (inc / "d.lua").write_text("local function d_marker() end\n")
    text = expand_includes('--- @include "b"\n--- @include "c"\nreturn 1\n', tmp_path)
    assert text.count("d_marker") == 1
    assert "function b()" in text and "function c()" in text


# --- shebang flags of the shipped scripts ------------------------------------------------------

# The scripts that only read.  Redis itself enforces the flag (a write command inside a
# no-writes script is an error), so the suite on real Redis shows none of these writes;
# tests/faults shows that reads run during CLIENT PAUSE WRITE.
READ_ONLY_SCRIPTS = {
    "memory": {
        "context_head",
        "list_metadata",
        "partition_stats",
        "read_context",
        "read_session",
        "snapshot_page",
    },
    "threads": {"read_events"},
    "langgraph": {"checkpoint_read", "thread_dump"},
}


@pytest.mark.parametrize("folder", sorted(READ_ONLY_SCRIPTS))
def test_every_shipped_script_declares_its_flags(folder: str) -> None:
    """A shebang on every script: a write script is refused whole under OOM/MISCONF
    (``#!lua``), and exactly the read-only ones say ``no-writes``."""
    registry = load_registry(folder)
    for script in registry:
        first_line = script.source.split("\n", 1)[0]
        assert first_line in ("#!lua", "#!lua flags=no-writes"), (script.name, first_line)
    assert {s.name for s in registry if s.read_only} == READ_ONLY_SCRIPTS[folder]


def test_embedded_text_drops_the_shebang_only() -> None:
    script = load_registry("memory")["read_context"]
    assert script.embedded is not None
    assert script.embedded.source == "--" + script.source[2:]
    assert script.embedded.sha != script.sha
    assert script.source.count("\n") == script.embedded.source.count("\n")
