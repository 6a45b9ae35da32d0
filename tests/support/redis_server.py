"""A private, real redis-server for tests: the same embedded server `arbor up` starts.

    with RedisServer() as server:          # or server = RedisServer().start(); server.stop()
        client = redis.Redis.from_url(server.url)

No TCP port by default (a unix socket in its own temp directory), no persistence. Pass
`tcp=True` for a loopback port instead (`server.url` is then redis://127.0.0.1:N).
"""

from __future__ import annotations

from ops.launch.embedded_redis import EmbeddedRedis as RedisServer
from ops.launch.embedded_redis import redis_server_binary

__all__ = ["RedisServer", "redis_server_binary"]
