"""The logging proxy in front of a real Starlette upstream: answers pass through byte for byte,
and each exchange's record says what was sent and how the answer went."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ops.agent_capture.proxy import create_proxy_app, route_name
from ops.agent_capture.sse_names import SseNames, squeeze

MESSAGES_STREAM = (
    b'event: message_start\ndata: {"type":"message_start"}\n\n'
    + b'event: content_block_delta\ndata: {"i":1}\n\n' * 3
    + b'event: error\r\ndata: {"type":"error","error":{"message":"context full"}}\r\n\r\n'
)
CHAT_STREAM = (
    b'data: {"object":"chat.completion.chunk"}\n\ndata: {"object":"chat.completion.chunk"}\n\ndata: [DONE]\n\n'
)


async def _messages(request: Request) -> Response:
    assert request.headers["x-api-key"] == "secret"  # forwarded, though never recorded
    return StreamingResponse(iter([MESSAGES_STREAM[:50], MESSAGES_STREAM[50:]]), media_type="text/event-stream")


async def _chat(request: Request) -> Response:
    body = await request.json()
    if body.get("max_tokens", 0) > 8192:
        return JSONResponse({"error": {"message": "max_tokens too large", "param": "max_tokens"}}, status_code=400)
    return StreamingResponse(iter([CHAT_STREAM]), media_type="text/event-stream")


UPSTREAM = Starlette(
    routes=[Route("/v1/messages", _messages, methods=["POST"]), Route("/v1/chat/completions", _chat, methods=["POST"])]
)


def _through_proxy(log_dir: Path, requests: list[tuple[str, dict, dict[str, str]]]) -> list[httpx.Response]:
    """Each (path, body, headers) POSTed in turn through one proxy app."""
    proxy = create_proxy_app("http://upstream", log_dir, transport=httpx.ASGITransport(app=UPSTREAM))

    async def send() -> list[httpx.Response]:
        responses = []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=proxy), base_url="http://proxy") as client:
            for path, body, headers in requests:
                responses.append(await client.post(path, json=body, headers=headers))
                await responses[-1].aread()
        return responses

    return asyncio.run(send())


def test_proxy_passes_stream_unchanged_and_records_event_names_without_secrets(tmp_path: Path) -> None:
    headers = {"x-api-key": "secret", "Authorization": "Bearer secret", "anthropic-version": "2023-06-01"}
    [response] = _through_proxy(tmp_path, [("/v1/messages?beta=true", {"model": "m", "max_tokens": 5}, headers)])
    assert response.status_code == 200 and response.content == MESSAGES_STREAM
    record = json.loads((tmp_path / "01-messages.json").read_text())
    assert record["path"] == "/v1/messages?beta=true" and record["body"] == {"model": "m", "max_tokens": 5}
    assert record["headers"]["anthropic-version"] == "2023-06-01"
    assert "secret" not in json.dumps(record)
    assert record["events"] == ["message_start", "content_block_delta x3", "error"]
    assert "context full" in record["error"]  # a 200 stream that broke off says why


def test_proxy_records_refusal_and_chat_done(tmp_path: Path) -> None:
    chat = "/v1/chat/completions"
    refused, served = _through_proxy(tmp_path, [(chat, {"max_tokens": 32000}, {}), (chat, {"max_tokens": 16}, {})])
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"
    assert served.content == CHAT_STREAM
    first = json.loads((tmp_path / "01-chat-completions.json").read_text())
    assert first["status"] == 400 and "max_tokens too large" in first["error"] and first["events"] == []
    second = json.loads((tmp_path / "02-chat-completions.json").read_text())
    assert second["status"] == 200 and second["events"] == ["message x2", "[DONE]"] and "error" not in second


def test_sse_names_across_chunk_boundaries() -> None:
    names = SseNames()
    for start in range(0, len(CHAT_STREAM), 7):
        names.feed(CHAT_STREAM[start : start + 7])
    assert names.names == ["message", "message", "[DONE]"] and names.errors == []


def test_squeeze_counts_runs_of_one_name() -> None:
    assert squeeze(["a", "b", "b", "b", "a"]) == ["a", "b x3", "a"]
    assert squeeze([]) == []


def test_route_names() -> None:
    assert route_name("/v1/chat/completions") == "chat-completions"
    assert route_name("/v1/messages/count_tokens") == "messages-count_tokens"
    assert route_name("/") == "root"
