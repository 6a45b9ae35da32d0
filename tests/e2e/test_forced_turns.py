"""The default model (SmolLM2-135M-Instruct), asked for a forced call with parallel calls left on,
writes its call and then the very same call again, and again: the turn ends at the repeat with
`finish_reason` "tool_calls", streamed and not the same, through the openai SDK's stream helper
(which raises on "length"), through /v1/messages (`tool_choice` any, `stop_reason` tool_use) and
/v1/responses (status completed).
A `json_schema` answer with an unbounded integer ends as valid JSON before `max_tokens`."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import pytest

from shared.settings import GatewaySettings
from tests.gateway.conftest import GatewayServer
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_for
from tests.worker.service.harness import InProcessWorker, service_config
from worker.serving_model import load_serving_model

MODEL = "smollm2-135m"
PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}]
REQUEST = dict(
    model=MODEL,
    messages=[{"role": "user", "content": "What is the weather in Paris?"}],
    tools=TOOLS,
    tool_choice="required",  # parallel_tool_calls left at its default: true
    max_tokens=200,
    temperature=0,
)


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayServer]:
    served = load_serving_model(None, "ngram", max_context=2048)  # ngram drafts the repeat: several tokens a step
    with RedisServer() as redis_server:
        worker_config = service_config(redis_server.url, model_name=MODEL, speculation="ngram", max_context=2048)
        with InProcessWorker(worker_config, served):
            settings = GatewaySettings(redis_url=redis_server.url, request_timeout_s=120.0)
            server = GatewayServer(settings).start()
            health = server.http()
            wait_for(lambda: health.get("/health").status_code == 200, 60, "the gateway to see the worker")
            yield server
            server.stop()


def distinct_calls(calls: list) -> list[tuple[str, dict]]:
    named = [(call.function.name, json.loads(call.function.arguments)) for call in calls]
    assert named and all(name == "get_weather" for name, _ in named)
    assert len({json.dumps(call) for call in named}) == len(named), f"a call repeats: {named}"
    return named


def test_a_forced_turn_ends_at_the_repeated_call(gateway: GatewayServer) -> None:
    choice = gateway.openai().chat.completions.create(**REQUEST).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content in (None, "")
    distinct_calls(choice.message.tool_calls)


def test_the_sdk_stream_helper_finishes_with_the_non_streamed_calls(gateway: GatewayServer) -> None:
    client = gateway.openai()
    whole = distinct_calls(client.chat.completions.create(**REQUEST).choices[0].message.tool_calls)
    with client.chat.completions.stream(**REQUEST) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion().choices[0]  # LengthFinishReasonError on "length"
    assert final.finish_reason == "tool_calls"
    assert final.message.content in (None, "")
    assert distinct_calls(final.message.tool_calls) == whole


def test_a_streamed_forced_tool_use_on_messages_ends_at_the_repeat(gateway: GatewayServer) -> None:
    with anthropic.Anthropic(base_url=gateway.base_url, api_key="x", max_retries=0, timeout=60) as client:
        body = dict(
            model=MODEL,
            max_tokens=200,
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            tools=[{"name": "get_weather", "input_schema": PARAMETERS}],
            tool_choice={"type": "any"},
            extra_body={"temperature": 0},  # this SDK no longer sends it as a keyword
        )
        with client.messages.stream(**body) as events:  # the SDK's accumulator rebuilds the message
            message = events.get_final_message()
    assert message.stop_reason == "tool_use"
    uses = [(block.name, block.input) for block in message.content if block.type == "tool_use"]
    assert uses and len({json.dumps(use) for use in uses}) == len(uses), f"a call repeats: {uses}"


def test_a_forced_call_on_responses_ends_at_the_repeat(gateway: GatewayServer) -> None:
    response = gateway.openai().responses.create(
        model=MODEL,
        input="What is the weather in Paris?",
        tools=[{"type": "function", "name": "get_weather", "parameters": PARAMETERS, "strict": False}],
        tool_choice="required",
        max_output_tokens=200,
        temperature=0,
    )
    assert response.status == "completed", response.incomplete_details
    calls = [(item.name, json.loads(item.arguments)) for item in response.output if item.type == "function_call"]
    assert calls and len({json.dumps(call) for call in calls}) == len(calls), f"a call repeats: {calls}"
    assert not [item for item in response.output if item.type == "message"], "no content besides the calls"


CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}


def test_a_json_schema_answer_with_an_unbounded_integer_ends_before_max_tokens(gateway: GatewayServer) -> None:
    choice = (
        gateway.openai()
        .chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "What is the population of Paris? Answer in JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}},
            max_tokens=60,
            temperature=0,
        )
        .choices[0]
    )
    assert choice.finish_reason == "stop", choice.message.content
    answer = json.loads(choice.message.content)
    assert type(answer["population"]) is int and len(str(abs(answer["population"]))) <= 19
