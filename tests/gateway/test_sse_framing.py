"""The raw bytes of a stream, field by field, against OpenAI's chunk format."""

from __future__ import annotations

import json

from shared.protocol import Job
from tests.gateway.conftest import MODEL, GatewayServer
from tests.gateway.protocol_peer import ProtocolPeer, Step, delta, error, final

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}


def _events(gateway: GatewayServer, path: str, body: dict) -> tuple[str, list[str]]:
    with gateway.http().stream("POST", path, json=body) as response:
        assert response.status_code == 200
        raw = response.read().decode()
    assert raw.endswith("\n\n")
    frames = raw.split("\n\n")[:-1]
    assert all(frame.startswith("data: ") and "\n" not in frame for frame in frames), frames
    return response.headers["content-type"], [frame.removeprefix("data: ") for frame in frames]


def test_chat_chunks_match_the_openai_format(gateway: GatewayServer, peer: ProtocolPeer) -> None:
    content_type, frames = _events(gateway, "/v1/chat/completions", CHAT)

    assert content_type.startswith("text/event-stream")
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(frame) for frame in frames[:-1]]
    for chunk in chunks:
        assert set(chunk) == {"id", "object", "created", "model", "choices"}
        assert chunk["object"] == "chat.completion.chunk"
        assert chunk["id"] == chunks[0]["id"] and chunk["model"] == MODEL
        assert isinstance(chunk["created"], int)
        [choice] = chunk["choices"]
        assert set(choice) == {"index", "delta", "logprobs", "finish_reason"}
        assert choice["index"] == 0 and choice["logprobs"] is None
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"] for c in chunks[1:-1]] == [{"content": "Hello"}, {"content": ", world"}]
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_include_usage_puts_null_usage_on_every_chunk_and_totals_last(
    gateway: GatewayServer, peer: ProtocolPeer
) -> None:
    _, frames = _events(gateway, "/v1/chat/completions", CHAT | {"stream_options": {"include_usage": True}})

    chunks = [json.loads(frame) for frame in frames[:-1]]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 7,
        "completion_tokens": 3,
        "total_tokens": 10,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def _tool_script(job: Job) -> list[Step]:
    first = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    return [
        delta(tool_calls=[first]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": '{"city": '}}]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": '"Paris"}'}}]),
        final("tool_calls"),
    ]


def test_tool_call_deltas_are_streamed_verbatim(gateway: GatewayServer, make_peer) -> None:
    make_peer(script=_tool_script)

    _, frames = _events(gateway, "/v1/chat/completions", CHAT)

    deltas = [json.loads(frame)["choices"][0]["delta"] for frame in frames[1:-2]]
    assert deltas[0] == {
        "tool_calls": [
            {
                "index": 0,
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": ""},
            }
        ]
    }
    assert deltas[1] == {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}
    assert json.loads(frames[-2])["choices"][0]["finish_reason"] == "tool_calls"


def _failing_script(job: Job) -> list[Step]:
    return [delta("partial"), error("the lane crashed", "internal_error")]


def test_worker_error_mid_stream_is_an_error_event_then_done(gateway: GatewayServer, make_peer) -> None:
    make_peer(script=_failing_script)

    _, frames = _events(gateway, "/v1/chat/completions", CHAT)

    assert frames[-1] == "[DONE]"
    assert json.loads(frames[-2]) == {
        "error": {
            "message": "the lane crashed",
            "type": "server_error",
            "param": None,
            "code": "internal_error",
        }
    }
    assert json.loads(frames[1])["choices"][0]["delta"] == {"content": "partial"}


def test_completion_chunks_match_the_legacy_format(gateway: GatewayServer, peer: ProtocolPeer) -> None:
    _, frames = _events(gateway, "/v1/completions", {"model": MODEL, "prompt": "Once", "stream": True})

    assert frames[-1] == "[DONE]"
    chunks = [json.loads(frame) for frame in frames[:-1]]
    assert all(c["object"] == "text_completion" and c["id"].startswith("cmpl-") for c in chunks)
    assert [c["choices"][0]["text"] for c in chunks] == ["Hello", ", world", ""]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "stop"]
    assert all(set(c["choices"][0]) == {"index", "text", "logprobs", "finish_reason"} for c in chunks)
