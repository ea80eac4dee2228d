"""Builds redis-py clients from a :class:`~memtier.config.MemtierConfig`.

``redis://`` / ``rediss://`` / ``unix://`` give a standalone client,
``redis+cluster://`` / ``rediss+cluster://`` a :class:`redis.cluster.RedisCluster`,
and no URL the embedded in-process Redis (fakeredis with Lua), which is for
the demo and tests: it lives in this process only.

redis-py's own command retries are switched off (``Retry(NoBackoff(), 0)``):
memtier retries once, in :mod:`memtier.retry`.
"""

from __future__ import annotations

import logging
from typing import Any

from redis.backoff import NoBackoff

from memtier.config import MemtierConfig, parse_redis_url
from memtier.errors import ConfigurationError

__all__ = ["EMBEDDED_NOTICE", "connect_async", "connect_sync", "embedded_server"]

log = logging.getLogger("memtier")

EMBEDDED_NOTICE = (
    "memtier: no Redis URL configured (MEMTIER_REDIS_URL); using the embedded in-process "
    "Redis (fakeredis). Data lives in this process only."
)

_EMBEDDED: Any = None


def embedded_server() -> Any:
    """The process-wide fakeredis server (created on first use)."""
    global _EMBEDDED
    if _EMBEDDED is None:
        try:
            import fakeredis
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ConfigurationError(
                "no Redis URL configured and the embedded Redis is not installed:"
                " set MEMTIER_REDIS_URL or `pip install 'memtier[embedded]'`"
            ) from exc
        _EMBEDDED = fakeredis.FakeServer()
    return _EMBEDDED


def connect_sync(config: MemtierConfig) -> tuple[Any, bool]:
    """Return ``(client, embedded)`` for the configured Redis."""
    from redis import Redis
    from redis.cluster import RedisCluster
    from redis.retry import Retry

    if config.redis_url is None:
        import fakeredis

        log.warning(EMBEDDED_NOTICE)
        return fakeredis.FakeRedis(server=embedded_server()), True
    is_cluster, url = parse_redis_url(config.redis_url)
    if is_cluster:
        return RedisCluster.from_url(url, retry=Retry(NoBackoff(), 0)), False
    return Redis.from_url(url, retry=Retry(NoBackoff(), 0), retry_on_error=[]), False


def connect_async(config: MemtierConfig) -> tuple[Any, bool]:
    """Asyncio twin of :func:`connect_sync`."""
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster
    from redis.asyncio.retry import Retry

    if config.redis_url is None:
        import fakeredis

        log.warning(EMBEDDED_NOTICE)
        return fakeredis.FakeAsyncRedis(server=embedded_server()), True
    is_cluster, url = parse_redis_url(config.redis_url)
    if is_cluster:
        return RedisCluster.from_url(url, retry=Retry(NoBackoff(), 0)), False
    return Redis.from_url(url, retry=Retry(NoBackoff(), 0), retry_on_error=[]), False
