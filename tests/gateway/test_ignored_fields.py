"""Unknown request fields on every route: accepted, kept out of the job, counted once per request
in /metrics; with ARBOR_STRICT_REQUEST_FIELDS a 400 naming the field, nothing queued. The real
OpenAI and Anthropic SDKs are the clients where a route has one."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from gateway.request_body import MAX_FIELD_LABELS, OTHER_FIELDS
from shared.protocol import Job
from tests.gateway.conftest import MODEL, GatewayServer
from tests.gateway.protocol_peer import ProtocolPeer, Step, delta, final
from tests.gateway.test_fleet_endpoints import _sample  # labels in name order: field, route

USER = {"role": "user", "content": "hi"}
TOKENIZED = {"count": 1, "max_model_len": 64, "tokens": [5], "token_strs": None}
IGNORED = "arbor_ignored_request_fields_total"


def _answering(job: Job) -> list[Step]:
    if job.kind == "tokenize":
        result = TOKENIZED if job.request()["op"] == "tokenize" else {"prompt": "hi"}
        return [final(prompt_tokens=0, completion_tokens=0, result=result)]
    return [delta("Hello", token_ids=[1]), final("stop", prompt_tokens=5, completion_tokens=1)]


def _openai(gateway: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0)


def _anthropic(gateway: GatewayServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.base_url, api_key="unused", max_retries=0)


def _every_route(gateway: GatewayServer) -> None:
    """One request per route, each with an unknown top-level field and an unknown nested one."""
    client = _openai(gateway)
    message = USER | {"mood": "curious"}
    client.chat.completions.create(model=MODEL, messages=[message], extra_body={"frobnicate": 1})  # type: ignore[list-item]
    client.completions.create(
        model=MODEL, prompt="hi", extra_body={"frobnicate": 1, "response_format": {"type": "text", "hint": 2}}
    )
    client.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": "hi"}],
        extra_body={"frobnicate": {"x": "1"}, "text": {"verbosity": "low", "colour": "blue"}},
    )
    claude = _anthropic(gateway)
    thinking: Any = {"type": "adaptive", "future_knob": "on"}
    claude.messages.create(model=MODEL, max_tokens=8, messages=[USER], thinking=thinking, extra_body={"frobnicate": 1})
    claude.messages.count_tokens(model=MODEL, messages=[USER], thinking=thinking, extra_body={"frobnicate": 1})
    http = gateway.http()
    assert http.post("/tokenize", json={"prompt": "hi", "frobnicate": 1}).status_code == 200
    assert http.post("/detokenize", json={"tokens": [5], "frobnicate": 1}).status_code == 200


COUNTED = [
    ("/v1/chat/completions", "frobnicate"),
    ("/v1/chat/completions", "messages.*.mood"),
    ("/v1/completions", "frobnicate"),
    ("/v1/completions", "response_format.hint"),
    ("/v1/responses", "frobnicate"),
    ("/v1/responses", "text.colour"),
    ("/v1/messages", "frobnicate"),
    ("/v1/messages", "thinking.future_knob"),
    ("/v1/messages/count_tokens", "frobnicate"),
    ("/v1/messages/count_tokens", "thinking.future_knob"),
    ("/tokenize", "frobnicate"),
    ("/detokenize", "frobnicate"),
]


def test_unknown_fields_on_every_route_are_accepted_and_counted_once(gateway: GatewayServer, make_peer) -> None:
    peer: ProtocolPeer = make_peer(script=_answering)

    _every_route(gateway)

    metrics = gateway.http().get("/metrics").text
    for route, field in COUNTED:
        assert _sample(metrics, IGNORED, field=field, route=route) == 1, (route, field)
    assert len(peer.jobs) == 7
    assert all("frobnicate" not in job.body and "mood" not in job.body for job in peer.jobs)


def test_a_field_repeated_in_every_turn_is_one_label_counted_once(gateway: GatewayServer, make_peer) -> None:
    make_peer(script=_answering)
    turns = [USER | {"mood": 1}, {"role": "assistant", "content": "yes", "mood": 2}, USER | {"mood": 3}]

    reply = gateway.http().post("/v1/chat/completions", json={"model": MODEL, "messages": turns})

    assert reply.status_code == 200, reply.text
    metrics = gateway.http().get("/metrics").text
    assert _sample(metrics, IGNORED, field="messages.*.mood", route="/v1/chat/completions") == 1


def test_replayed_sdk_blocks_with_null_fields_are_accepted(gateway: GatewayServer, make_peer) -> None:
    """The anthropic SDK's own blocks, replayed with `model_dump()`: `caller: null`, `citations`..."""
    make_peer(script=_answering)
    blocks = [
        anthropic.types.TextBlock(type="text", text="Let me look."),
        anthropic.types.ToolUseBlock(type="tool_use", id="toolu_1", name="get_weather", input={"city": "Paris"}),
    ]
    replayed = [block.model_dump() for block in blocks]
    assert "caller" in replayed[1]  # what made strict validation refuse the replay
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}
    messages: Any = [USER, {"role": "assistant", "content": replayed}, {"role": "user", "content": [result]}]

    reply = _anthropic(gateway).messages.create(model=MODEL, max_tokens=8, messages=messages)

    assert reply.content[0].type == "text"
    metrics = gateway.http().get("/metrics").text
    assert _sample(metrics, IGNORED, field="messages.*.content.*.caller", route="/v1/messages") == 1


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"model": MODEL, "messages": [USER | {"mood": 1}]}, "messages.0.mood"),
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "frobnicate": 1}, "frobnicate"),
        ("/v1/responses", {"model": MODEL, "input": "hi", "frobnicate": {}}, "frobnicate"),
        (
            "/v1/messages",
            {"model": MODEL, "max_tokens": 8, "messages": [USER], "thinking": {"type": "adaptive", "knob": 1}},
            "thinking.knob",
        ),
        ("/v1/messages/count_tokens", {"model": MODEL, "messages": [USER | {"mood": 1}]}, "messages.0.mood"),
        ("/tokenize", {"prompt": "hi", "frobnicate": 1}, "frobnicate"),
        ("/detokenize", {"tokens": [5], "frobnicate": 1}, "frobnicate"),
    ],
)
def test_the_strict_setting_refuses_unknown_fields_by_name(
    make_gateway, peer: ProtocolPeer, path: str, body: dict, param: str
) -> None:
    gateway = make_gateway(strict_request_fields=True)

    reply = gateway.http().post(path, json=body)

    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert f"Unknown field {param!r}" in error["message"], error
    assert peer.jobs == []


def test_made_up_field_names_cannot_grow_the_metrics_without_end(make_gateway, make_peer) -> None:
    gateway = make_gateway()
    make_peer(script=_answering)
    http = gateway.http()
    for batch in range(3):
        names = {f"made_up_{batch}_{index}": 1 for index in range(100)}
        assert http.post("/tokenize", json={"prompt": "hi"} | names).status_code == 200

    ignored = [line for line in http.get("/metrics").text.splitlines() if line.startswith(IGNORED + "{")]

    assert len(ignored) == MAX_FIELD_LABELS + 1
    assert _sample("\n".join(ignored), IGNORED, field=OTHER_FIELDS, route="/tokenize") == 1  # one request past it


def test_a_field_name_with_line_breaks_is_one_metrics_line(gateway: GatewayServer, make_peer) -> None:
    make_peer(script=_answering)
    http = gateway.http()
    odd = "odd\u2028name\x1c\x85\nend"  # separators str.splitlines() breaks on; Prometheus escapes \n only
    assert http.post("/tokenize", json={"prompt": "hi", odd: 1}).status_code == 200
    lines = http.get("/metrics").text.splitlines()
    assert _sample("\n".join(lines), IGNORED, field="odd?name???end", route="/tokenize") == 1
    assert all(line.startswith("#") or " " in line for line in lines if line)
