"""API-key auth. No keys configured: everything is open.

With keys, every path needs `Authorization: Bearer <key>` or `x-api-key: <key>` (Anthropic's
header, what its SDK and Claude Code send) except /health, /metrics and /openapi.json, which need
it only when `auth_health_metrics` is set, and the probes /livez and /readyz, which never do.
Keys are compared with `hmac.compare_digest`, against every configured key, so timing reveals
nothing. A refusal on a /v1/messages path is sent in
Anthropic's envelope, elsewhere in OpenAI's.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway import errors
from gateway.messages_api import errors as messages_errors

API_KEY_STATE = "api_key"  # request.state attribute: the key the request was made with
OPS_PATHS = frozenset({"/health", "/metrics", "/openapi.json"})
PROBE_PATHS = frozenset({"/livez", "/readyz"})  # a kubelet sends no key; they say only ok or not


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
        self._public = PROBE_PATHS | (frozenset() if protect_ops else OPS_PATHS)
        self._on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._keys or scope["path"] in self._public:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        key = self._accepted_key(headers)
        if key is not None:
            scope.setdefault("state", {})[API_KEY_STATE] = key  # its priority policy (`shared.priority`)
            await self.app(scope, receive, send)
            return
        error = errors.unauthorized()
        self._on_reject(error.code)
        if messages_errors.is_messages_path(scope["path"]):
            await messages_errors.response(error)(scope, receive, send)
        else:
            await error.response()(scope, receive, send)

    def _accepted_key(self, headers: Headers) -> str | None:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and self._accepts(token):
            return token.strip()
        token = headers.get("x-api-key", "")
        return token.strip() if self._accepts(token) else None

    def _accepts(self, token: str) -> bool:
        candidate = token.strip().encode()
        if not candidate:
            return False
        matched = False
        for key in self._keys:  # no early exit
            matched |= hmac.compare_digest(candidate, key)
        return matched
