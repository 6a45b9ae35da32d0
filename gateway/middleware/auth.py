"""Bearer-token auth. No keys configured: everything is open.

With keys, every path needs `Authorization: Bearer <key>` except /health, /metrics and
/openapi.json, which need it only when `auth_health_metrics` is set. Keys are compared with
`hmac.compare_digest`, against every configured key, so timing reveals nothing.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway import errors

OPS_PATHS = frozenset({"/health", "/metrics", "/openapi.json"})


class AuthMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        api_keys: tuple[str, ...],
        protect_ops: bool,
        on_reject: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self.app = app
        self._keys = [key.encode() for key in api_keys]
        self._public = frozenset() if protect_ops else OPS_PATHS
        self._on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._keys or scope["path"] in self._public:
            await self.app(scope, receive, send)
            return
        if self._accepts(Headers(scope=scope).get("authorization", "")):
            await self.app(scope, receive, send)
            return
        error = errors.unauthorized()
        self._on_reject(error.code)
        await error.response()(scope, receive, send)

    def _accepts(self, header: str) -> bool:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return False
        candidate = token.strip().encode()
        matched = False
        for key in self._keys:  # no early exit
            matched |= hmac.compare_digest(candidate, key)
        return matched
