"""Malformed and out-of-range requests: a 4xx in the OpenAI envelope, and the server carries on."""

from __future__ import annotations

import pytest

from tests.gateway.conftest import MODEL, GatewayServer
from tests.gateway.protocol_peer import ProtocolPeer

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def _assert_envelope(response, status: int, code: str, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    if param is not None:
        assert body["error"]["param"] == param
    return body["error"]


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"{not json", "Invalid JSON"),
        (b"", "Invalid JSON"),
        (b"[1, 2]", "JSON object"),
    ],
)
def test_unparseable_bodies_are_400(gateway: GatewayServer, peer: ProtocolPeer, content: bytes, fragment: str) -> None:
    response = gateway.http().post(
        "/v1/chat/completions", content=content, headers={"content-type": "application/json"}
    )

    error = _assert_envelope(response, 400, "invalid_request")
    assert fragment in error["message"]
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"max_tokens": "many"}, "max_tokens"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"n": 1000}, "n"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"stream": "yes please"}, "stream"),
        ({"logit_bias": {"eos": -100}}, "logit_bias"),
        ({"store": True}, "store"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
            "response_format.json_schema.schema",
        ),
        ({"guided_regex": "(unclosed"}, "guided_regex"),
        ({"guided_grammar": "root ::= nowhere"}, "guided_grammar"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"response_format": {"type": "json_object"}, "min_tokens": 2}, "min_tokens"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_wrong_values_are_400_naming_the_field(
    gateway: GatewayServer, peer: ProtocolPeer, change: dict, param: str
) -> None:
    response = gateway.http().post("/v1/chat/completions", json=CHAT | change)

    error = _assert_envelope(response, 400, "invalid_request")
    assert error["param"] == param
    assert param in error["message"]
    assert peer.jobs == []


def test_unknown_fields_are_named_under_the_strict_setting(make_gateway, peer: ProtocolPeer) -> None:
    gateway = make_gateway(strict_request_fields=True)
    response = gateway.http().post("/v1/chat/completions", json=CHAT | {"frobnicate": 1, "best_of_luck": True})

    error = _assert_envelope(response, 400, "invalid_request", param="frobnicate")
    assert "'frobnicate'" in error["message"] and "'best_of_luck'" in error["message"]


def test_unknown_field_inside_a_message_is_named_under_the_strict_setting(make_gateway, peer: ProtocolPeer) -> None:
    gateway = make_gateway(strict_request_fields=True)
    messages = [{"role": "user", "content": "hi", "mood": "curious"}]

    response = gateway.http().post("/v1/chat/completions", json=CHAT | {"messages": messages})

    error = _assert_envelope(response, 400, "invalid_request")
    assert error["param"].startswith("messages.0") and error["param"].endswith("mood")


def test_image_parts_are_refused(gateway: GatewayServer, peer: ProtocolPeer) -> None:
    content = [{"type": "image_url", "image_url": {"url": "data:,"}}]

    response = gateway.http().post(
        "/v1/chat/completions", json=CHAT | {"messages": [{"role": "user", "content": content}]}
    )

    error = _assert_envelope(response, 400, "invalid_request")
    # One error naming the part's type, not three about the fields an image part has.
    assert error["message"].endswith(": content part type 'image_url' is not supported; only 'text' parts are")
    assert "Field required" not in error["message"] and "Unknown field" not in error["message"]


def test_unknown_model_is_404_model_not_found(gateway: GatewayServer, peer: ProtocolPeer) -> None:
    response = gateway.http().post("/v1/chat/completions", json=CHAT | {"model": "no-such-model"})

    error = _assert_envelope(response, 404, "model_not_found", param="model")
    assert "no-such-model" in error["message"]


def test_oversized_body_is_413(make_gateway, peer: ProtocolPeer) -> None:
    gateway = make_gateway(max_body_bytes=4096)
    big = CHAT | {"messages": [{"role": "user", "content": "x" * 10_000}]}

    response = gateway.http().post("/v1/chat/completions", json=big)

    _assert_envelope(response, 413, "request_too_large")


def test_oversized_chunked_body_is_413(make_gateway, peer: ProtocolPeer) -> None:
    gateway = make_gateway(max_body_bytes=4096)

    def body():
        yield b'{"model": "tiny-model", "messages": [{"role": "user", "content": "'
        for _ in range(20):
            yield b"x" * 1000
        yield b'"}]}'

    response = gateway.http().post("/v1/chat/completions", content=body(), headers={"content-type": "application/json"})

    _assert_envelope(response, 413, "request_too_large")


def test_unknown_path_and_method_use_the_envelope(gateway: GatewayServer) -> None:
    http = gateway.http()
    _assert_envelope(http.get("/v1/nothing-here"), 404, "not_found")
    _assert_envelope(http.get("/v1/chat/completions"), 405, "method_not_allowed")


def test_server_stays_healthy_after_bad_input(gateway: GatewayServer, peer: ProtocolPeer) -> None:
    http = gateway.http()
    for content in (b"{", b"null", b'{"model": 5}', b"\xff\xfe", b'{"messages": [{"role": "x"}]}'):
        assert http.post("/v1/chat/completions", content=content).status_code == 400

    assert http.get("/health").status_code == 200
    reply = gateway.openai().chat.completions.create(model=MODEL, messages=CHAT["messages"])
    assert reply.choices[0].message.content == "Hello, world"
