"""A tiny random Qwen3.5 whose chat template asks for the released XML tool-call format, served by
a real worker (ngram speculation: several tokens a step) behind the real gateway, asked through
the openai SDK: a forced call comes back as `tool_calls` with schema-typed arguments, streamed
and not, and the SDK's stream accumulator rebuilds the non-streamed call. The same model with a
Hermes template too: Hermes streams arguments token by token, so a step of several tokens must
still put one entry per tool index in its chunk."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from shared.settings import GatewaySettings
from tests.gateway.conftest import GatewayServer
from tests.support.redis_server import RedisServer
from tests.support.tiny_hybrid_models import make_tiny_hybrid_model
from tests.support.waiting import wait_for
from tests.worker.service.harness import InProcessWorker, service_config
from worker.serving_model import load_serving_model

TEMPLATES = Path(__file__).parents[1] / "worker" / "chat" / "templates"
FORMATS = {"qwen3_xml": TEMPLATES / "qwen3_5_xml.jinja", "hermes": TEMPLATES / "qwen3.jinja"}
MODEL = "tiny-qwen3.5-xml"
PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 6},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
        "celsius": {"type": "boolean"},
        "unit": {"type": "string", "enum": ["metric", "imperial"]},
    },
    "required": ["city", "days", "celsius", "unit"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}]
REQUEST = dict(
    model=MODEL,
    messages=[{"role": "user", "content": "Weather in Lisbon for two days?"}],
    tools=TOOLS,
    tool_choice="required",
    parallel_tool_calls=False,
    max_tokens=300,
    temperature=0,
)


@pytest.fixture(scope="module", params=sorted(FORMATS))
def gateway(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    folder = tmp_path_factory.mktemp(request.param) / MODEL
    make_tiny_hybrid_model(folder, "qwen3_5_text", max_position_embeddings=4096)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = FORMATS[request.param].read_text()
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    served = load_serving_model(folder, "ngram", max_context=2048)
    assert served.tool_parser == request.param  # chosen from the template
    with RedisServer() as redis_server:
        worker_config = service_config(redis_server.url, model_name=MODEL, speculation="ngram", max_context=2048)
        with InProcessWorker(worker_config, served):
            settings = GatewaySettings(redis_url=redis_server.url, request_timeout_s=120.0)
            server = GatewayServer(settings).start()
            health = server.http()
            wait_for(lambda: health.get("/health").status_code == 200, 60, "the gateway to see the worker")
            yield server
            server.stop()


def typed_arguments(arguments: str) -> dict:
    value = json.loads(arguments)
    assert set(value) == {"city", "days", "celsius", "unit"}
    assert isinstance(value["city"], str) and len(value["city"]) <= 6
    assert type(value["days"]) is int and 1 <= value["days"] <= 9
    assert type(value["celsius"]) is bool
    assert value["unit"] in ("metric", "imperial")
    return value


def test_a_forced_call_comes_back_as_a_typed_tool_call(gateway: GatewayServer) -> None:
    reply = gateway.openai().chat.completions.create(**REQUEST)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content in (None, "")
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    typed_arguments(call.function.arguments)


def test_a_streamed_forced_call_rebuilds_in_the_sdk_as_the_non_streamed_one(gateway: GatewayServer) -> None:
    client = gateway.openai()
    whole = client.chat.completions.create(**REQUEST).choices[0].message.tool_calls
    state = ChatCompletionStreamState(input_tools=TOOLS)
    for chunk in client.chat.completions.create(**REQUEST, stream=True):
        for choice in chunk.choices:
            indices = [delta.index for delta in choice.delta.tool_calls or []]
            assert len(indices) == len(set(indices)), f"one entry per tool index in a chunk: {indices}"
        state.handle_chunk(chunk)
    final = state.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls"
    [streamed] = final.message.tool_calls
    assert streamed.function.name == whole[0].function.name
    assert streamed.function.arguments == whole[0].function.arguments
    assert typed_arguments(streamed.function.arguments) == json.loads(whole[0].function.arguments)


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_call_cut_short_is_length_never_tool_calls_without_a_call(gateway: GatewayServer, stream) -> None:
    client = gateway.openai()
    body = REQUEST | {"max_tokens": 8}
    if stream:
        choices = [c for chunk in client.chat.completions.create(**body, stream=True) for c in chunk.choices]
        assert not any(choice.delta.tool_calls for choice in choices)
        assert [choice.finish_reason for choice in choices if choice.finish_reason] == ["length"]
        return
    choice = client.chat.completions.create(**body).choices[0]
    assert choice.finish_reason == "length"
    assert not choice.message.tool_calls
