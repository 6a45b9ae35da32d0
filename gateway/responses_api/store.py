"""Stored responses: what GET /v1/responses/{id} returns and previous_response_id continues.

One Redis string per response, `keys.stored_response(id)`, set with a TTL
(`ARBOR_RESPONSES_TTL_S`, one hour by default):

    {"response": <the response object, as returned>, "input": [<the conversation's input items>]}

`input` is the whole conversation up to this response (the previous response's input and output,
then this request's input), so continuing a response reads one key however long the chain is.
A response is stored when it finished (completed or incomplete) and before its terminal event
goes out, so a client that continues it the moment it has the answer finds it. Failed and
cancelled responses are not stored. Instructions are kept only in the response object, as
OpenAI does: they do not carry over to a continuation.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway import errors
from gateway.errors import ApiError
from gateway.responses_api.objects import ResponseObject, dump_response
from shared import keys

_REDIS_FAILURES = (RedisError, OSError, TimeoutError)


@dataclass(frozen=True, slots=True)
class StoredResponse:
    response: dict[str, Any]
    input_items: list[dict[str, Any]]

    def conversation(self) -> list[dict[str, Any]]:
        """What a continuation starts from: the input items, then this response's output."""
        output: list[dict[str, Any]] = self.response.get("output", [])
        return self.input_items + output


class ResponseStore:
    def __init__(self, redis: Redis, ttl_s: int, timeout_s: float) -> None:
        self._redis = redis
        self._ttl_s = ttl_s
        self._timeout_s = timeout_s

    async def save(self, response: ResponseObject, input_items: list[dict[str, Any]]) -> None:
        value = json.dumps({"response": dump_response(response), "input": input_items}, separators=(",", ":"))
        await self._call(self._redis.set(keys.stored_response(response.id), value, ex=self._ttl_s))

    async def load(self, response_id: str) -> StoredResponse | None:
        raw = await self._call(self._redis.get(keys.stored_response(response_id)))
        if raw is None:
            return None
        stored = json.loads(raw)
        return StoredResponse(stored["response"], stored["input"])

    async def delete(self, response_id: str) -> bool:
        removed = await self._call(self._redis.delete(keys.stored_response(response_id)))
        return bool(removed)

    async def _call(self, command: Any) -> Any:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await command
        except _REDIS_FAILURES as exc:
            raise errors.redis_unavailable(exc) from exc


def previous_response_not_found(response_id: str) -> ApiError:
    message = f"Previous response with id '{response_id}' not found (never stored, deleted, or expired)."
    return ApiError(404, message, "previous_response_not_found", "previous_response_id")


def response_not_found(response_id: str) -> ApiError:
    message = f"Response with id '{response_id}' not found (never stored, deleted, or expired)."
    return ApiError(404, message, "response_not_found")
