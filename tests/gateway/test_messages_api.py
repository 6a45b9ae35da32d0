"""/v1/messages and /v1/messages/count_tokens against a scripted peer: the job they enqueue, the
body and the exact event sequence they send back, Anthropic's error envelope, x-api-key."""

from __future__ import annotations

import json
import time
from typing import Any

import anthropic
import pytest

from shared.openai_schema import ChatCompletionRequest
from shared.protocol import Job
from tests.gateway.conftest import MODEL, GatewayServer
from tests.gateway.protocol_peer import ProtocolPeer, Step, WaitForCancel, delta, error, final
from worker.chat.template import flatten_text_parts

API_KEY = "sk-arbor-messages"
USER = {"role": "user", "content": "hi"}
BODY: dict[str, Any] = {"model": MODEL, "max_tokens": 16, "messages": [USER]}
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def _script_with_cache(job: Job) -> list[Step]:
    """Reasoning, then text in the same step, then a tool call; 32 of the 40 prompt tokens cached."""
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    end = final("tool_calls", prompt_tokens=40, completion_tokens=5)
    end.event["usage"]["cached_tokens"] = 32
    return [
        delta(reasoning="Let me", token_ids=[1]),
        delta(reasoning=" look.", text="Sure.", token_ids=[2, 3]),
        delta(tool_calls=[call], token_ids=[4]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": '{"city": "Paris"}'}}], token_ids=[5]),
        end,
    ]


def _stopped_by_sequence(job: Job) -> list[Step]:
    return [delta("The answer is 4", token_ids=[1, 2]), final("stop", stop_sequence="\n\nHuman:")]


def _failing(job: Job) -> list[Step]:
    return [delta("partial", token_ids=[1]), error("the lane crashed", "internal_error")]


def _sse(gateway: GatewayServer, body: dict, **headers: str) -> list[tuple[str, dict]]:
    with gateway.http().stream("POST", "/v1/messages", json=body | {"stream": True}, headers=headers) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = []
    for frame in raw.split("\n\n")[:-1]:
        name_line, data_line = frame.split("\n")
        name, data = name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name, frame
        events.append((name, data))
    return events


def test_a_message_becomes_the_chat_job_the_chat_route_would_enqueue(
    gateway: GatewayServer, peer: ProtocolPeer
) -> None:
    body = BODY | {
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            USER,
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "They greet.", "signature": "sig=="},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "Snow"}]},
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
        ],
        "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "thinking": {"type": "enabled", "budget_tokens": 12},
        "stop_sequences": ["END"],
        "temperature": 0.5,
        "top_k": 5,
        "metadata": {"user_id": "u-1"},
    }

    response = gateway.http().post("/v1/messages", json=body)

    assert response.status_code == 200, response.text
    (job,) = peer.jobs
    assert job.kind == "chat" and job.model == MODEL
    chat = ChatCompletionRequest.model_validate_json(job.body)
    assert [message.model_dump(exclude_none=True) for message in chat.messages] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "They greet.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "content": "Snow", "tool_call_id": "toolu_1"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    assert chat.tools is not None and chat.tools[0].function.parameters == WEATHER_TOOL["input_schema"]
    assert (chat.tool_choice, chat.parallel_tool_calls) == ("required", False)
    assert (chat.reasoning_budget, chat.chat_template_kwargs) == (12, {"enable_thinking": True})
    assert (chat.stop, chat.temperature, chat.top_k, chat.max_tokens) == (["END"], 0.5, 5, 16)


def test_several_text_blocks_join_as_the_worker_joins_openai_text_parts(
    gateway: GatewayServer, peer: ProtocolPeer
) -> None:
    """Claude Code sends a turn as <system-reminder> blocks and then the user's text: glued with
    nothing between, the tag ran into the text; the chat route's text parts get a newline."""
    reminder, question = "<system-reminder>Today is Monday.</system-reminder>", "What day is it?"
    body = BODY | {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": reminder}, {"type": "text", "text": question}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Monday."}, {"type": "text", "text": "Why?"}]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "line 1"}, {"type": "text", "text": "line 2"}],
                    }
                ],
            },
        ]
    }

    assert gateway.http().post("/v1/messages", json=body).status_code == 200
    (job,) = peer.jobs
    chat = ChatCompletionRequest.model_validate_json(job.body)
    as_parts = [
        {"role": "user", "content": [{"type": "text", "text": reminder}, {"type": "text", "text": question}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Monday."}, {"type": "text", "text": "Why?"}]},
    ]
    joined = [message["content"] for message in flatten_text_parts(as_parts)]
    assert [message.content for message in chat.messages] == [*joined, "line 1\nline 2"]
    assert joined == [f"{reminder}\n{question}", "Monday.\nWhy?"]


def test_the_body_has_thinking_text_and_tool_use_blocks(gateway: GatewayServer, make_peer) -> None:
    make_peer(script=_script_with_cache)

    message = gateway.http().post("/v1/messages", json=BODY | {"tools": [WEATHER_TOOL]}).json()

    assert message["id"].startswith("msg_") and message["type"] == "message" and message["role"] == "assistant"
    assert message["model"] == MODEL
    assert message["content"] == [
        {"type": "thinking", "thinking": "Let me look.", "signature": ""},
        {"type": "text", "text": "Sure."},
        {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
    ]
    assert (message["stop_reason"], message["stop_sequence"]) == ("tool_use", None)
    assert message["usage"] == {
        "input_tokens": 8,  # computed; the 32 read from the prefill cache are counted apart
        "output_tokens": 5,
        "cache_read_input_tokens": 32,
        "cache_creation_input_tokens": 0,
    }


def test_the_stream_is_anthropics_event_sequence(gateway: GatewayServer, make_peer) -> None:
    make_peer(script=_script_with_cache)

    events = _sse(gateway, BODY | {"tools": [WEATHER_TOOL]})

    names = [name for name, _ in events]
    assert names == [
        "message_start",
        "ping",
        "content_block_start",  # 0: thinking
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",  # its signature
        "content_block_stop",
        "content_block_start",  # 1: text
        "content_block_delta",
        "content_block_stop",
        "content_block_start",  # 2: tool_use
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    data = [data for _, data in events]
    assert data[0]["message"]["content"] == [] and data[0]["message"]["stop_reason"] is None
    assert data[2] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "thinking", "thinking": "", "signature": ""},
    }
    assert [d["delta"] for d in data[3:6]] == [
        {"type": "thinking_delta", "thinking": "Let me"},
        {"type": "thinking_delta", "thinking": " look."},
        {"type": "signature_delta", "signature": ""},
    ]
    assert data[7]["content_block"] == {"type": "text", "text": ""} and data[7]["index"] == 1
    assert data[8]["delta"] == {"type": "text_delta", "text": "Sure."}
    assert data[10]["content_block"] == {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}}
    assert data[11]["delta"] == {"type": "input_json_delta", "partial_json": '{"city": "Paris"}'}
    assert [d["index"] for d in data if d["type"] == "content_block_stop"] == [0, 1, 2]
    assert data[13]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert data[13]["usage"]["output_tokens"] == 5 and data[13]["usage"]["cache_read_input_tokens"] == 32


def test_a_stop_sequence_is_the_stop_reason_and_named(gateway: GatewayServer, make_peer) -> None:
    make_peer(script=_stopped_by_sequence)

    message = gateway.http().post("/v1/messages", json=BODY | {"stop_sequences": ["\n\nHuman:"]}).json()
    events = _sse(gateway, BODY | {"stop_sequences": ["\n\nHuman:"]})

    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "\n\nHuman:")
    assert message["content"] == [{"type": "text", "text": "The answer is 4"}]
    (message_delta,) = [data for name, data in events if name == "message_delta"]
    assert message_delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "\n\nHuman:"}


def test_a_plain_end_is_end_turn_and_length_is_max_tokens(gateway: GatewayServer, make_peer) -> None:
    make_peer(script=lambda job: [delta("Hi", token_ids=[1]), final("length" if "long" in job.body else "stop")])

    ended = gateway.http().post("/v1/messages", json=BODY).json()
    cut = gateway.http().post("/v1/messages", json=BODY | {"messages": [{"role": "user", "content": "long"}]}).json()

    assert (ended["stop_reason"], cut["stop_reason"]) == ("end_turn", "max_tokens")


def test_a_worker_error_mid_stream_is_an_error_event(gateway: GatewayServer, make_peer) -> None:
    make_peer(script=_failing)

    events = _sse(gateway, BODY)

    assert events[-1] == ("error", {"type": "error", "error": {"type": "api_error", "message": "the lane crashed"}})
    assert (
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "partial"}},
    ) in events


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages.0.content"),
        ({"messages": [{"role": "user", "content": [{"type": "audio"}]}]}, "messages.0.content"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
        ({"tools": [{"name": "bad name!", "input_schema": {}}]}, "tools.0.name"),
        ({"tool_choice": {"type": "tool"}}, "tool_choice"),
        ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
        ({"thinking": {"type": "enabled"}}, "thinking"),
        ({"temperature": "hot"}, "temperature"),
        ({"stop_sequences": "END"}, "stop_sequences"),
        ({"stop_sequences": [""]}, "stop_sequences.0"),
    ],
)
def test_bad_input_is_anthropics_400_naming_the_field_and_queues_nothing(
    gateway: GatewayServer, peer: ProtocolPeer, change: dict, field: str
) -> None:
    body = {key: value for key, value in (BODY | change).items() if value is not None}

    response = gateway.http().post("/v1/messages", json=body)

    assert response.status_code == 400, response.text
    envelope = response.json()
    assert envelope["type"] == "error" and envelope["error"]["type"] == "invalid_request_error", envelope
    assert field in envelope["error"]["message"], envelope
    assert peer.jobs == []


def test_an_image_is_refused_by_name(gateway: GatewayServer, peer: ProtocolPeer) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    body = BODY | {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is it?"}, image]}]}

    error = gateway.http().post("/v1/messages", json=body).json()["error"]

    assert error["message"].startswith("messages.0.content.1: image blocks are not supported"), error
    assert peer.jobs == []


def test_an_unknown_model_is_not_found_error(gateway: GatewayServer, peer: ProtocolPeer) -> None:
    response = gateway.http().post("/v1/messages", json=BODY | {"model": "claude-opus-4-1"})

    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found_error"
    assert peer.jobs == []


def test_x_api_key_is_accepted_beside_bearer(make_gateway, peer: ProtocolPeer) -> None:
    gateway = make_gateway(api_keys=API_KEY)
    http = gateway.http()

    with_header = http.post("/v1/messages", json=BODY, headers={"x-api-key": API_KEY})
    with_bearer = http.post("/v1/messages", json=BODY, headers={"authorization": f"Bearer {API_KEY}"})
    wrong = http.post("/v1/messages", json=BODY, headers={"x-api-key": API_KEY + "x"})
    chat = http.post("/v1/chat/completions", json={"model": MODEL, "messages": [USER]}, headers={"x-api-key": API_KEY})

    assert (with_header.status_code, with_bearer.status_code, chat.status_code) == (200, 200, 200)
    assert wrong.status_code == 401
    assert wrong.json() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": wrong.json()["error"]["message"]},
    }
    assert len(peer.jobs) == 3


def test_claude_codes_extras_are_accepted(gateway: GatewayServer, peer: ProtocolPeer) -> None:
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219,some-future-beta-2031"}
    body = BODY | {
        "service_tier": "auto",
        "container": None,
        "mcp_servers": [],
        "context_management": {"edits": []},
        "tools": [WEATHER_TOOL, {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}],
        "messages": [
            USER,
            {
                "role": "assistant",
                "content": [{"type": "redacted_thinking", "data": "opaque"}, {"type": "text", "text": "Hi"}],
            },
            {"role": "user", "content": [{"type": "text", "text": "Again", "cache_control": {"type": "ephemeral"}}]},
        ],
    }

    response = gateway.http().post("/v1/messages?beta=true", json=body, headers=headers)

    assert response.status_code == 200, response.text
    chat = ChatCompletionRequest.model_validate_json(peer.jobs[0].body)
    assert [tool.function.name for tool in chat.tools or []] == ["get_weather"]  # the server tool is Anthropic's


def test_count_tokens_is_a_count_job_answered_with_its_prompt_tokens(gateway: GatewayServer, make_peer) -> None:
    peer = make_peer(script=lambda job: [final("stop", prompt_tokens=23, completion_tokens=0)])
    body = {"model": MODEL, "messages": [USER], "system": "Be brief.", "tools": [WEATHER_TOOL]}

    response = gateway.http().post("/v1/messages/count_tokens", json=body)

    assert response.status_code == 200, response.text
    assert response.json() == {"input_tokens": 23}
    (job,) = peer.jobs
    assert job.kind == "count"
    chat = ChatCompletionRequest.model_validate_json(job.body)
    assert [m.role for m in chat.messages] == ["system", "user"] and chat.tools is not None


def test_an_alias_reaches_its_model_and_is_listed(gateway: GatewayServer, make_peer) -> None:
    peer = make_peer(aliases=("claude-sonnet-4-5", "gpt-5"))

    message = gateway.http().post("/v1/messages", json=BODY | {"model": "claude-sonnet-4-5"})
    chat = gateway.http().post("/v1/chat/completions", json={"model": "gpt-5", "messages": [USER]})
    models = gateway.http().get("/v1/models").json()["data"]

    assert (message.status_code, chat.status_code) == (200, 200)
    assert [job.model for job in peer.jobs] == [MODEL, MODEL]  # the model's own stream
    assert message.json()["model"] == chat.json()["model"] == MODEL
    assert {card["id"]: card["root"] for card in models} == {
        MODEL: None,
        "claude-sonnet-4-5": MODEL,
        "gpt-5": MODEL,
    }


def test_the_anthropic_sdk_authenticates_with_its_x_api_key(make_gateway, peer: ProtocolPeer) -> None:
    gateway = make_gateway(api_keys=API_KEY)

    with anthropic.Anthropic(base_url=gateway.base_url, api_key=API_KEY, max_retries=0, timeout=20) as sdk:
        message = sdk.messages.create(model=MODEL, max_tokens=16, messages=[USER])
    wrong = anthropic.Anthropic(base_url=gateway.base_url, api_key="wrong", max_retries=0, timeout=20)
    with wrong, pytest.raises(anthropic.AuthenticationError) as refused:
        wrong.messages.create(model=MODEL, max_tokens=16, messages=[USER])

    assert [block.text for block in message.content] == ["Hello, world"]
    assert refused.value.body["error"]["type"] == "authentication_error"
    assert len(peer.jobs) == 1


def _first_then_wait(job: Job) -> list[Step]:
    return [delta("first", token_ids=[1]), WaitForCancel(timeout_s=10)]


def _wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_a_client_gone_mid_stream_cancels_the_job(gateway: GatewayServer, make_peer) -> None:
    peer = make_peer(script=_first_then_wait)

    with gateway.http().stream("POST", "/v1/messages", json=BODY | {"stream": True}) as response:
        lines = response.iter_lines()
        seen = [next(lines) for _ in range(12)]  # message_start, ping, the text block's start and first delta
        # leaving the block closes the connection mid-stream

    assert any('"text":"first"' in line for line in seen), seen
    _wait_for(lambda: peer.cancelled == [peer.jobs[0].id])


def test_a_deadline_ends_the_message_with_an_api_error(make_gateway, make_peer) -> None:
    gateway = make_gateway(request_timeout_s=1.0)
    peer = make_peer(script=_first_then_wait)

    whole = gateway.http().post("/v1/messages", json=BODY)
    events = _sse(gateway, BODY)

    assert whole.status_code == 504 and whole.json()["error"]["type"] == "api_error"
    assert events[-1][0] == "error" and "did not finish within" in events[-1][1]["error"]["message"]
    _wait_for(lambda: len(peer.cancelled) == 2)
