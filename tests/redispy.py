"""Which redis-py the tests run on, and the ``redis_py`` marker.

memtier supports redis-py from the floor in ``pyproject.toml`` on.  Some of its fast
paths read redis-py internals that only newer releases have (the lean Cluster path needs
``NodesManager.initialize(last_failed_node_name=...)``, redis-py >= 8.0); on an older
release memtier takes redis-py's own path instead.  A test of such a path is marked
``@pytest.mark.redis_py("8.0")``.

The main run installs the newest redis-py, and there every marked test runs (and fails
if its path is not taken).  ``tests/run.sh`` then runs the Redis-facing tests again on
the floor release, with ``MEMTIER_REDIS_PY_FLOOR`` set to its version: only there are
the tests marked for a newer release deselected -- pytest reports them as deselected,
never as passed -- and that run stops at once if another redis-py was imported.
"""

from __future__ import annotations

import os
import re

import pytest
import redis

FLOOR_RUN_VARIABLE = "MEMTIER_REDIS_PY_FLOOR"

# memtier.leancluster / memtier.aioleancluster: the slot map refresh they ask for after a
# connection error (``NodesManager.initialize(last_failed_node_name=...)``).
LEAN_CLUSTER = "8.0"
# redis-py paces the slot-map refreshes its asyncio cluster client asks for.
PACED_REFRESH = "8.2"


def version_tuple(text: str) -> tuple[int, ...]:
    """``"8.0"`` / ``"8.2.0"`` -> ``(8, 0)`` / ``(8, 2, 0)``; anything else is an error."""
    parts = text.split(".")
    if not 1 <= len(parts) <= 3 or not all(part.isdigit() for part in parts):
        raise ValueError(f"not a redis-py release number: {text!r}")
    return tuple(int(part) for part in parts)


# The release number redis-py's version starts with ("6.3.0", "8.0.0b1" -> (8, 0, 0)).
_RELEASE = re.match(r"[0-9]+(\.[0-9]+){0,2}", redis.__version__)
INSTALLED = version_tuple(_RELEASE.group(0) if _RELEASE else "0")


def at_least(version: str) -> bool:
    """The installed redis-py is ``version`` or newer."""
    wanted = version_tuple(version)
    return INSTALLED[: len(wanted)] >= wanted


def deselect_newer(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In the floor run, deselect the tests marked for a newer redis-py than installed."""
    floor = os.environ.get(FLOOR_RUN_VARIABLE, "")
    if not floor:
        return
    if version_tuple(floor) != INSTALLED[: len(version_tuple(floor))]:
        raise pytest.UsageError(
            f"{FLOOR_RUN_VARIABLE}={floor} but redis-py {redis.__version__} was imported"
            f" from {redis.__file__}"
        )
    keep: list[pytest.Item] = []
    newer: list[pytest.Item] = []
    for item in items:
        marker = item.get_closest_marker("redis_py")
        if marker is not None and (len(marker.args) != 1 or not isinstance(marker.args[0], str)):
            raise pytest.UsageError(f"{item.nodeid}: use @pytest.mark.redis_py('8.0')")
        (newer if marker is not None and not at_least(marker.args[0]) else keep).append(item)
    if newer:
        config.hook.pytest_deselected(items=newer)
        items[:] = keep
