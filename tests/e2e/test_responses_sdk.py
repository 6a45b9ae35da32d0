"""The live stack through the `openai` SDK's Responses client (workers speculate with ngram).

Exact texts and calls come from the scripted model (tests/support/scripted_model.py); forced calls
and JSON schemas from the random tiny Qwen3, greedy, checked against their schemas.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tests.e2e.live_stack import SCRIPTED_MODEL, TINY_MODEL, Stack
from tests.e2e.test_openai_sdk import CITY_TOOLS, COLOR_SCHEMA
from tests.support.codex_request import codex_body, codex_probe
from tests.support.scripted_model import PLAIN, STEPS, TOOLS

QUESTION = "What is the weather in Paris?"
FLAT_TOOLS = [{"type": "function", **tool["function"]} for tool in TOOLS]
FLAT_CITY_TOOLS = [{"type": "function", **tool["function"]} for tool in CITY_TOOLS]


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    return stack.openai()


def _calls(response) -> list[tuple[str, dict]]:
    return [(item.name, json.loads(item.arguments)) for item in response.output if item.type == "function_call"]


def _declared(step: int) -> list[tuple[str, dict]]:
    return [(call.name, call.arguments) for call in STEPS[step].calls]


def _outputs(response, results: dict[str, str]) -> list[dict]:
    return [
        {"type": "function_call_output", "call_id": item.call_id, "output": results[item.name]}
        for item in response.output
        if item.type == "function_call"
    ]


def test_create_returns_the_scripted_answer(client: openai.OpenAI) -> None:
    response = client.responses.create(model=SCRIPTED_MODEL, input=QUESTION)

    assert (response.status, response.output_text, response.model) == ("completed", PLAIN.text, SCRIPTED_MODEL)
    assert response.usage.output_tokens == len(PLAIN.pieces) + 1  # the pieces and the eos
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens


def test_stream_sends_the_events_in_order_and_the_same_text(client: openai.OpenAI) -> None:
    with client.responses.stream(model=SCRIPTED_MODEL, input=QUESTION) as stream:
        events = list(stream)
        final = stream.get_final_response()

    kinds = [event.type for event in events]
    opening = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    closing = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert kinds[:4] == opening and kinds[-4:] == [*closing, "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}  # how many depends on timing
    assert "".join(event.delta for event in events[4:-4]) == PLAIN.text == final.output_text
    assert [event.sequence_number for event in events] == list(range(len(events)))


@pytest.mark.parametrize("stream", [False, True])
def test_function_call_then_its_output_continues_the_script(client: openai.OpenAI, stream: bool) -> None:
    user = {"role": "user", "content": QUESTION}
    if stream:
        with client.responses.stream(model=SCRIPTED_MODEL, input=[user], tools=FLAT_TOOLS) as events:
            kinds = [event.type for event in events]
            first = events.get_final_response()
        assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
    else:
        first = client.responses.create(model=SCRIPTED_MODEL, input=[user], tools=FLAT_TOOLS)
    assert first.output_text == STEPS[0].content and _calls(first) == _declared(0)

    replayed = [item.model_dump() for item in first.output]
    second = client.responses.create(
        model=SCRIPTED_MODEL,
        input=[user, *replayed, *_outputs(first, {"get_weather": "sunny"})],
        tools=FLAT_TOOLS,
    )
    assert _calls(second) == _declared(1)  # the script moved on: the call and its output went in


def test_previous_response_id_continues_a_stored_conversation(client: openai.OpenAI) -> None:
    first = client.responses.create(model=SCRIPTED_MODEL, input=QUESTION, tools=FLAT_TOOLS)
    second = client.responses.create(
        model=SCRIPTED_MODEL,
        previous_response_id=first.id,
        input=_outputs(first, {"get_weather": "sunny"}),
        tools=FLAT_TOOLS,
    )
    third = client.responses.create(
        model=SCRIPTED_MODEL,
        previous_response_id=second.id,
        input=_outputs(second, {"get_time": "noon"}),
        tools=FLAT_TOOLS,
    )

    assert (_calls(first), _calls(second)) == (_declared(0), _declared(1))
    assert third.output_text == STEPS[2].content and _calls(third) == []
    assert client.responses.retrieve(third.id).output_text == STEPS[2].content


def test_get_and_delete_a_stored_response(client: openai.OpenAI) -> None:
    response = client.responses.create(model=SCRIPTED_MODEL, input=QUESTION)

    assert client.responses.retrieve(response.id).output_text == PLAIN.text
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model=SCRIPTED_MODEL, input="more", previous_response_id=response.id)
    assert caught.value.body["code"] == "previous_response_not_found"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "name": "get_time"}])
def test_a_forced_call_is_a_function_call_item_valid_for_its_schema(
    client: openai.OpenAI, stream: bool, tool_choice
) -> None:
    body = dict(
        model=TINY_MODEL,
        input=QUESTION,
        tools=FLAT_CITY_TOOLS,
        tool_choice=tool_choice,
        parallel_tool_calls=False,
        max_output_tokens=120,
        temperature=1.0,
        extra_body={"seed": 4},  # the chat test's request, which closes its call
    )
    if stream:
        with client.responses.stream(**body) as events:
            response = events.get_final_response()
    else:
        response = client.responses.create(**body)

    assert response.status == "completed", response.output
    [call] = [item for item in response.output if item.type == "function_call"]
    assert call.name in ({"get_time"} if isinstance(tool_choice, dict) else {"get_weather", "get_time"})
    jsonschema.validate(json.loads(call.arguments), FLAT_CITY_TOOLS[0]["parameters"])


@pytest.mark.parametrize("stream", [False, True])
def test_a_json_schema_text_format_answer_validates(client: openai.OpenAI, stream: bool) -> None:
    text = {"format": {"type": "json_schema", "name": "color", "schema": COLOR_SCHEMA, "strict": True}}
    body = dict(model=TINY_MODEL, input=QUESTION, text=text, max_output_tokens=80, temperature=1.0)
    body |= {"extra_body": {"seed": 0}}
    if stream:
        with client.responses.stream(**body) as events:
            response = events.get_final_response()
    else:
        response = client.responses.create(**body)

    assert response.status == "completed", response.output_text
    jsonschema.validate(json.loads(response.output_text), COLOR_SCHEMA)


def test_a_codex_session_request_and_its_probe_are_answered(stack: Stack) -> None:
    with httpx.Client(base_url=stack.base_url, timeout=60) as http:
        session = http.post("/v1/responses", json=codex_body(TINY_MODEL) | {"max_output_tokens": 8})
        probe = http.post("/v1/responses", json=codex_probe(TINY_MODEL))

    assert session.status_code == 200, session.text
    last = json.loads(session.text.strip().split("\n\n")[-1].split("\n")[1].removeprefix("data: "))
    assert last["type"] in ("response.completed", "response.incomplete")
    assert [warning["param"] for warning in last["response"]["warnings"]][-3:] == ["tools[1]", "tools[2]", "tools[3]"]
    assert probe.status_code == 200, probe.text
    assert probe.json()["usage"]["output_tokens"] == 1
