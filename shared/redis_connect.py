"""Every Redis client Arbor makes comes from here, built from one `REDIS_URL`.

    redis://[[user]:password@]host:port[/db]          a plain server (rediss:// for TLS)
    unix://[[user]:password@]/path/to/redis.sock      a local socket
    redis+sentinel://[[user]:password@]HOST:PORT[,HOST:PORT...]/MASTER_NAME[/DB]
    rediss+sentinel://...                             the same, TLS to the master and replicas
        ?sentinel_password=P                          the sentinels' own AUTH (default: none)
        ?sentinel_ssl=true                            TLS to the sentinels too

The password in a Sentinel URL is the master's (and its replicas'); sentinels usually have none.

A Sentinel client asks the sentinels for the master on every new connection (redis-py's
`SentinelConnectionPool`), so after a failover each connection that breaks reconnects to the new
master, and pub/sub subscribes again there. Two ways a write could still go to a master that has
been demoted, and what closes them:

- the old master came back (a partition, a SIGSTOP) and was made a replica: it answers writes
  with READONLY, and redis-py drops the connection and asks the sentinels again;
- it came back and has not been made a replica yet: with `min-replicas-to-write` set on the
  servers (the compose and Kubernetes sets do) it refuses writes with NOREPLICAS, since its
  replicas follow the new master. `_ReplicaAware` connections treat that reply as the master's
  loss too: the connection is dropped, the next one asks the sentinels, and the caller sees
  `NoReplica`, a `ConnectionError`, so every reconnect-and-retry path already in place applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.exceptions
import redis.sentinel

SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}  # scheme -> TLS
DEFAULT_SENTINEL_PORT = 26379


class NoReplica(redis.exceptions.ConnectionError):
    """The master refused a write for want of a replica in sync (NOREPLICAS), or a write was not
    confirmed by the replicas required (`WAIT`)."""


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    sentinels: tuple[tuple[str, int], ...]
    master_name: str
    db: int = 0
    username: str | None = None
    password: str | None = None  # the master's and replicas'
    ssl: bool = False
    sentinel_password: str | None = None
    sentinel_ssl: bool = False


def parse_sentinel_url(url: str) -> SentinelTarget | None:
    """The Sentinel set a `redis+sentinel://` URL names; None for any other URL.
    Raises ValueError naming what is wrong."""
    parts = urlsplit(url)
    if parts.scheme not in SENTINEL_SCHEMES:
        return None
    credentials, _, hosts = parts.netloc.rpartition("@")
    username, _, password = credentials.partition(":")
    path = [piece for piece in parts.path.split("/") if piece]
    if not hosts or not 1 <= len(path) <= 2:
        raise ValueError(f"REDIS_URL: a Sentinel URL is {_SHAPE}, not {_redacted(url)!r}")
    if len(path) == 2 and not path[1].isdigit():
        raise ValueError(f"REDIS_URL: the database in a Sentinel URL is a number, not {path[1]!r}")
    query = parse_qs(parts.query)
    return SentinelTarget(
        sentinels=tuple(_host_port(item) for item in hosts.split(",")),
        master_name=unquote(path[0]),
        db=int(path[1]) if len(path) == 2 else 0,
        username=unquote(username) or None,
        password=unquote(password) if credentials and password else None,
        ssl=SENTINEL_SCHEMES[parts.scheme],
        sentinel_password=query.get("sentinel_password", [None])[0],
        sentinel_ssl=query.get("sentinel_ssl", ["false"])[0].lower() in ("1", "true", "yes"),
    )


_SHAPE = "redis+sentinel://[[user]:password@]HOST:PORT[,HOST:PORT...]/MASTER_NAME[/DB]"


def _host_port(item: str) -> tuple[str, int]:
    host, _, port = item.rpartition(":") if ":" in item else (item, "", str(DEFAULT_SENTINEL_PORT))
    if not host or not port.isdigit():
        raise ValueError(f"REDIS_URL: a sentinel is HOST:PORT, not {item!r}")
    return host.strip("[]"), int(port)


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    return url.replace(parts.netloc, parts.netloc.rpartition("@")[2])


def is_no_replicas(error: redis.exceptions.ResponseError) -> bool:
    """A write refused for `min-replicas-to-write` (also when a script's write was)."""
    return "NOREPLICAS" in str(error)


# -- asyncio clients (gateway, worker service, `arbor top`) ---------------------------------


class _AsyncReplicaAware(redis.asyncio.sentinel.SentinelManagedConnection):
    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except redis.exceptions.ResponseError as error:
            if not is_no_replicas(error):
                raise
            await self.disconnect()  # the next connection asks the sentinels for the master
            raise NoReplica(f"the master has no replica in sync: {error}") from error


class _AsyncReplicaAwareSSL(_AsyncReplicaAware, redis.asyncio.connection.SSLConnection):
    pass


class _BlockingSentinelPool(redis.asyncio.sentinel.SentinelConnectionPool, redis.asyncio.BlockingConnectionPool):
    """A Sentinel pool that waits for a free connection (as the gateway's plain pool does)."""


def async_client(
    url: str, timeout_s: float, *, decode_responses: bool = True, max_connections: int | None = None
) -> redis.asyncio.Redis:
    """A client for `url`. With `max_connections`, a command waits up to `timeout_s` for a free
    connection instead of failing at once when all are out (the gateway's case)."""
    options: dict[str, Any] = {
        "decode_responses": decode_responses,
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
    }
    target = parse_sentinel_url(url)
    if target is None:
        if max_connections is None:
            return redis.asyncio.Redis.from_url(url, **options)
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=timeout_s, **options
        )
        return redis.asyncio.Redis.from_pool(pool)
    manager = redis.asyncio.sentinel.Sentinel(target.sentinels, sentinel_kwargs=_sentinel_options(target, timeout_s))
    connection_class = _AsyncReplicaAwareSSL if target.ssl else _AsyncReplicaAware
    pool_class: Any = redis.asyncio.sentinel.SentinelConnectionPool  # redis-py's own signature is untyped
    if max_connections is not None:
        pool_class = _BlockingSentinelPool
        options |= {"max_connections": max_connections, "timeout": timeout_s}
    pool = pool_class(
        target.master_name,
        manager,
        connection_class=connection_class,
        **_master_options(target, with_ssl=False),
        **options,
    )
    return redis.asyncio.Redis.from_pool(pool)


# -- blocking clients (the worker's publisher, `arbor up`, benchmarks, tests) ----------------


class _ReplicaAware(redis.sentinel.SentinelManagedConnection):
    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)
        except redis.exceptions.ResponseError as error:
            if not is_no_replicas(error):
                raise
            self.disconnect()  # type: ignore[no-untyped-call]
            raise NoReplica(f"the master has no replica in sync: {error}") from error


class _ReplicaAwareSSL(_ReplicaAware, redis.connection.SSLConnection):
    pass


def sync_pool(url: str, timeout_s: float, *, decode_responses: bool = False) -> redis.ConnectionPool:
    """A blocking connection pool for `url` (its `connection_class(**connection_kwargs)` makes a
    connection of its own, which is how the worker's publisher keeps one outside the pool)."""
    options: dict[str, Any] = {
        "decode_responses": decode_responses,
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
    }
    target = parse_sentinel_url(url)
    if target is None:
        return redis.ConnectionPool.from_url(url, **options)
    manager = redis.sentinel.Sentinel(target.sentinels, sentinel_kwargs=_sentinel_options(target, timeout_s))
    return redis.sentinel.SentinelConnectionPool(
        target.master_name,
        manager,
        connection_class=_ReplicaAwareSSL if target.ssl else _ReplicaAware,
        **_master_options(target, with_ssl=False),
        **options,
    )


def sync_client(url: str, timeout_s: float, *, decode_responses: bool = False) -> redis.Redis:
    return redis.Redis(connection_pool=sync_pool(url, timeout_s, decode_responses=decode_responses))


def _master_options(target: SentinelTarget, with_ssl: bool = True) -> dict[str, Any]:
    options: dict[str, Any] = {"db": target.db, "username": target.username, "password": target.password}
    if with_ssl and target.ssl:
        options["ssl"] = True
    return options


def _sentinel_options(target: SentinelTarget, timeout_s: float) -> dict[str, Any]:
    options: dict[str, Any] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    if target.sentinel_password is not None:
        options["password"] = target.sentinel_password
    if target.sentinel_ssl:
        options["ssl"] = True
    return options
