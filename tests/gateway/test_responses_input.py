"""What /v1/responses accepts and refuses: a recorded Codex request, its probe, and bad input (a 400
in the OpenAI envelope naming the field, with nothing queued)."""

from __future__ import annotations

import json

import httpx
import pytest
import redis

from shared import keys
from tests.gateway.conftest import MODEL, GatewayServer
from tests.gateway.protocol_peer import ProtocolPeer
from tests.gateway.responses_scripts import CHAT_WEATHER, WEATHER
from tests.support.codex_request import codex_body, codex_probe


def _events(reply: httpx.Response) -> list[dict]:
    """Each SSE frame's data; its `event:` line must name the same type."""
    events = []
    for frame in reply.text.strip().split("\n\n"):
        kind, data = frame.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        events.append(event)
    return events


def test_a_codex_request_is_served_with_hosted_tools_skipped_and_warned(
    gateway: GatewayServer, peer: ProtocolPeer
) -> None:
    reply = gateway.http().post("/v1/responses", json=codex_body(MODEL))

    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
    events = _events(reply)
    assert (events[0]["type"], events[-1]["type"]) == ("response.created", "response.completed")
    warnings = events[0]["response"]["warnings"]
    assert [w["param"] for w in warnings] == ["input[6]", "input[7]", "input[8]", "tools[1]", "tools[2]", "tools[3]"]
    assert "'web_search'" in warnings[4]["message"]
    body = json.loads(peer.jobs[0].body)
    assert [tool["function"]["name"] for tool in body["tools"]] == ["shell"]
    assert (body["parallel_tool_calls"], body["reasoning_budget"]) == (False, 4096)
    assert [m["role"] for m in body["messages"]] == [
        "system",
        "developer",
        "user",
        "user",
        "assistant",  # the shell call (the reasoning summary and encrypted content are not text to replay)
        "tool",
        "assistant",  # "Two files."
        "user",
    ]
    assert "reasoning_content" not in body["messages"][4]


@pytest.mark.parametrize("empty", ["", []])
def test_the_codex_probe_with_empty_input_is_answered(gateway: GatewayServer, peer: ProtocolPeer, empty) -> None:
    probe = codex_probe(MODEL) | {"input": empty}

    reply = gateway.http().post("/v1/responses", json=probe)

    assert reply.status_code == 200 and reply.json()["status"] == "completed"
    body = json.loads(peer.jobs[0].body)
    assert (body["messages"], body["max_tokens"]) == ([{"role": "user", "content": ""}], 1)


def test_a_replayed_reasoning_item_with_text_is_the_turns_reasoning(gateway: GatewayServer, peer) -> None:
    items = [
        {"role": "user", "content": "Hi"},  # no "type": an easy input message
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Greet."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Bye"}]},
    ]
    gateway.openai().responses.create(model=MODEL, input=items)

    assert json.loads(peer.jobs[0].body)["messages"] == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello", "reasoning_content": "Greet."},
        {"role": "user", "content": "Bye"},
    ]


def test_tools_and_a_named_tool_choice_take_the_chat_form(gateway: GatewayServer, peer: ProtocolPeer) -> None:
    tools = [{"type": "web_search"}, WEATHER]
    response = gateway.openai().responses.create(
        model=MODEL, input="x", tools=tools, tool_choice={"type": "function", "name": "get_weather"}
    )

    body = json.loads(peer.jobs[0].body)
    assert body["tools"] == [CHAT_WEATHER]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert response.tool_choice.name == "get_weather" and [tool.name for tool in response.tools] == ["get_weather"]
    assert response.warnings == [
        {"param": "tools[0]", "message": "tool type 'web_search' is not supported by Arbor; skipped"}
    ]


BAD_SCHEMA = {"type": "json_schema", "name": "s", "schema": {"type": "array", "uniqueItems": True}}


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"input": 5}, "input"),
        ({"model": ""}, "model"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"reasoning": {"effort": "maximum"}}, "reasoning.effort"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input.0.function_call.call_id"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}, "input.0.message"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        ({"tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}}, "tool_choice"),
        ({"tools": [WEATHER | {"name": "bad name"}]}, "tools.0.function.name"),
        ({"text": {"format": BAD_SCHEMA}}, "text.format.schema"),
        ({"text": {"format": {"type": "json_object"}}, "tools": [WEATHER]}, "text.format"),
    ],
)
def test_bad_input_is_400_naming_the_field_and_queues_nothing(
    gateway: GatewayServer, peer: ProtocolPeer, redis_client: redis.Redis, change: dict, param: str
) -> None:
    reply = gateway.http().post("/v1/responses", json={"model": MODEL, "input": "hi"} | change)

    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_request")
    assert error["param"].startswith(param), error
    assert peer.jobs == [] and redis_client.xlen(keys.request_stream(MODEL)) == 0


def test_a_misspelt_field_is_400_naming_it_under_the_strict_setting(make_gateway, peer: ProtocolPeer) -> None:
    gateway = make_gateway(strict_request_fields=True)

    reply = gateway.http().post("/v1/responses", json={"model": MODEL, "input": "hi", "max_tokens": 5})

    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "max_tokens" and peer.jobs == []


def test_an_unknown_model_is_404_and_queues_nothing(gateway: GatewayServer, peer: ProtocolPeer) -> None:
    reply = gateway.http().post("/v1/responses", json={"model": "no-such-model", "input": "hi"})

    assert (reply.status_code, reply.json()["error"]["code"]) == (404, "model_not_found")
    assert peer.jobs == []


def test_responses_need_the_api_key(make_gateway, peer: ProtocolPeer) -> None:
    gateway = make_gateway(api_keys=("k1",))
    http = gateway.http()

    for method, path in (("POST", "/v1/responses"), ("GET", "/v1/responses/r"), ("DELETE", "/v1/responses/r")):
        assert http.request(method, path, json={"model": MODEL, "input": "hi"}).status_code == 401
    authorized = http.post(
        "/v1/responses", json={"model": MODEL, "input": "hi"}, headers={"Authorization": "Bearer k1"}
    )
    assert authorized.status_code == 200 and peer.jobs


def test_openapi_describes_the_responses_routes(gateway: GatewayServer) -> None:
    spec = gateway.http().get("/openapi.json").json()

    assert set(spec["paths"]["/v1/responses/{response_id}"]) == {"get", "delete"}
    request = spec["components"]["schemas"]["ResponsesRequest"]
    assert {"input", "instructions", "tools", "previous_response_id", "store"} <= set(request["properties"])
    assert request["additionalProperties"] is True  # unknown fields are ignored (and counted)
