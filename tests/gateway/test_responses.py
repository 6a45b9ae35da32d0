"""POST /v1/responses through the real gateway and the openai SDK, against a scripted protocol peer:
what the worker is sent (an ordinary chat job), what comes back (items, events, usage, status)."""

from __future__ import annotations

import json
import time

import openai
import pytest

from shared.openai_schema import ChatCompletionRequest
from shared.protocol import Job
from tests.gateway.conftest import MODEL, GatewayServer
from tests.gateway.protocol_peer import ProtocolPeer, Step, WaitForCancel, delta, error, final
from tests.gateway.responses_scripts import CHAT_WEATHER, WEATHER, call_script
from tests.gateway.test_fleet_endpoints import _sample


def _reasoning_script(job: Job) -> list[Step]:
    return [
        delta(reasoning="The user ", token_ids=[1, 2]),
        delta(reasoning="says hi.", token_ids=[3, 4, 5]),
        delta(token_ids=[6]),  # the close tag: nothing for the client
        delta("Hi!", token_ids=[7]),
        final(completion_tokens=7),
    ]


def _length_script(job: Job) -> list[Step]:
    return [delta("Once upon", token_ids=[1, 2]), final("length", completion_tokens=2)]


def test_create_answers_with_one_message_item(gateway: GatewayServer, peer: ProtocolPeer) -> None:
    response = gateway.openai().responses.create(model=MODEL, input="Hi", instructions="Be brief.")

    assert response.object == "response" and response.id.startswith("resp-")
    assert (response.status, response.model, response.output_text) == ("completed", MODEL, "Hello, world")
    [item] = response.output
    assert (item.type, item.role, item.status, item.id[:4]) == ("message", "assistant", "completed", "msg_")
    assert [part.type for part in item.content] == ["output_text"]
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (7, 3, 10)
    assert (usage.input_tokens_details.cached_tokens, usage.output_tokens_details.reasoning_tokens) == (0, 0)
    [job] = peer.jobs
    assert (job.kind, job.id) == ("chat", response.id)  # one request path: a chat job
    assert json.loads(job.body)["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]


def test_stream_sends_the_responses_event_sequence(gateway: GatewayServer, peer: ProtocolPeer) -> None:
    with gateway.openai().responses.stream(model=MODEL, input="Hi") as stream:
        events = list(stream)
        final_response = stream.get_final_response()

    assert [event.type for event in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert [event.delta for event in events if event.type == "response.output_text.delta"] == ["Hello", ", world"]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert final_response.output_text == "Hello, world" and final_response.status == "completed"
    assert final_response.id == events[0].response.id == peer.jobs[0].id


@pytest.mark.parametrize("stream", [False, True])
def test_a_function_call_is_an_item_and_its_output_goes_back_as_a_tool_message(
    gateway: GatewayServer, make_peer, stream: bool
) -> None:
    peer = make_peer(script=call_script)
    client = gateway.openai()
    ask = {"role": "user", "content": "Weather in Paris?"}
    if stream:
        with client.responses.stream(model=MODEL, input=[ask], tools=[WEATHER]) as events:
            kinds = [event.type for event in events]
            first = events.get_final_response()
        assert kinds[2:5] == [
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
        ]
        assert kinds[5:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    else:
        first = client.responses.create(model=MODEL, input=[ask], tools=[WEATHER])

    [call] = first.output  # the newline before the call made no message item
    assert (call.type, call.call_id, call.name, call.status) == ("function_call", "call_7", "get_weather", "completed")
    assert json.loads(call.arguments) == {"city": "Paris"} and call.id.startswith("fc_")
    output = {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"temp_c": 21})}
    second = client.responses.create(model=MODEL, input=[ask, call.model_dump(), output], tools=[WEATHER])

    assert second.output_text == "It is 21 C."
    body = json.loads(peer.jobs[1].body)
    assert body["tools"] == [CHAT_WEATHER]
    assert body["messages"][1:] == [
        {"role": "assistant", "tool_calls": [{"id": "call_7", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_7", "content": '{"temp_c": 21}'},
    ]  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_is_its_own_item_before_the_answer(gateway: GatewayServer, make_peer, stream: bool) -> None:
    make_peer(script=_reasoning_script)
    client = gateway.openai()
    if stream:
        with client.responses.stream(model=MODEL, input="Hi") as events:
            kinds = [event.type for event in events]
            response = events.get_final_response()
        assert kinds[2:9] == [
            "response.output_item.added",
            "response.content_part.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.content_part.done",
            "response.output_item.done",
        ]
    else:
        response = client.responses.create(model=MODEL, input="Hi")

    reasoning, message = response.output
    assert (reasoning.type, reasoning.summary, reasoning.status) == ("reasoning", [], "completed")
    assert [(part.type, part.text) for part in reasoning.content] == [("reasoning_text", "The user says hi.")]
    assert (message.type, response.output_text) == ("message", "Hi!")
    assert response.usage.output_tokens_details.reasoning_tokens == 5


def test_reasoning_effort_becomes_the_reasoning_budget(gateway: GatewayServer, peer: ProtocolPeer) -> None:
    client = gateway.openai()
    client.responses.create(model=MODEL, input="Hi", reasoning={"effort": "low", "summary": "auto"})
    client.responses.create(model=MODEL, input="Hi", reasoning={"effort": "none"})

    low, none = (json.loads(job.body) for job in peer.jobs)
    assert (low["reasoning_budget"], "chat_template_kwargs" in low) == (1024, False)
    assert (none["reasoning_budget"], none["chat_template_kwargs"]) == (0, {"enable_thinking": False})


@pytest.mark.parametrize("stream", [False, True])
def test_max_output_tokens_reached_is_an_incomplete_response(gateway: GatewayServer, make_peer, stream: bool) -> None:
    peer = make_peer(script=_length_script)
    client = gateway.openai()
    body = {"model": MODEL, "input": "Tell a story", "max_output_tokens": 2}
    if stream:
        with client.responses.stream(**body) as events:
            last = list(events)[-1]
        assert last.type == "response.incomplete"
        response = last.response
    else:
        response = client.responses.create(**body)

    assert (response.status, response.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    assert response.output[0].status == "incomplete" and response.output_text == "Once upon"
    assert json.loads(peer.jobs[0].body)["max_tokens"] == 2


def test_structured_text_format_reaches_the_worker_as_response_format(
    gateway: GatewayServer, peer: ProtocolPeer
) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    text = {"format": {"type": "json_schema", "name": "place", "schema": schema, "strict": True}}
    response = gateway.openai().responses.create(model=MODEL, input="Where?", text=text)

    sent = ChatCompletionRequest.model_validate_json(peer.jobs[0].body).response_format  # as the worker reads it
    assert sent is not None and sent.json_schema is not None
    assert (sent.type, sent.json_schema.name, sent.json_schema.schema_, sent.json_schema.strict) == (
        "json_schema",
        "place",
        schema,
        True,
    )
    assert response.text.format.type == "json_schema" and response.text.format.name == "place"


def test_a_worker_error_fails_the_response(gateway: GatewayServer, make_peer) -> None:
    make_peer(script=lambda job: [delta("Hel", token_ids=[1]), error("boom")])
    client = gateway.openai()

    with client.responses.stream(model=MODEL, input="Hi") as stream:
        events = list(stream)
    with pytest.raises(openai.InternalServerError):
        client.responses.create(model=MODEL, input="Hi")

    assert events[-1].type == "response.failed"
    assert (events[-1].response.status, events[-1].response.error.message) == ("failed", "boom")


def test_a_client_that_leaves_cancels_the_job(gateway: GatewayServer, make_peer) -> None:
    peer = make_peer(script=lambda job: [delta("Hel", token_ids=[1]), WaitForCancel(10), final()])

    with gateway.openai().responses.stream(model=MODEL, input="Hi") as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                break  # leaving the block closes the connection

    deadline = time.monotonic() + 10
    while not peer.cancelled and time.monotonic() < deadline:
        time.sleep(0.02)
    assert peer.cancelled == [peer.jobs[0].id]


def test_sampling_fields_reach_the_worker(gateway: GatewayServer, peer: ProtocolPeer) -> None:
    gateway.openai().responses.create(
        model=MODEL,
        input="Hi",
        temperature=0.3,
        top_p=0.9,
        max_output_tokens=17,
        user="u1",
        parallel_tool_calls=False,
        extra_body={"seed": 5},
    )

    body = json.loads(peer.jobs[0].body)
    sent = {name: body[name] for name in ("temperature", "top_p", "max_tokens", "user", "parallel_tool_calls", "seed")}
    assert sent == {
        "temperature": 0.3,
        "top_p": 0.9,
        "max_tokens": 17,
        "user": "u1",
        "parallel_tool_calls": False,
        "seed": 5,
    }


def test_responses_are_counted_in_the_metrics(gateway: GatewayServer, peer: ProtocolPeer) -> None:
    http = gateway.http()
    http.post("/v1/responses", json={"model": MODEL, "input": "Hi"})
    http.post("/v1/responses", json={"model": MODEL, "input": 5})
    http.get("/v1/responses/resp-unknown")

    text = http.get("/metrics").text

    assert _sample(text, "arbor_http_requests_total", route="/v1/responses", status="200") == 1
    assert _sample(text, "arbor_http_requests_total", route="/v1/responses", status="400") == 1
    assert _sample(text, "arbor_http_requests_total", route="/v1/responses/{response_id}", status="404") == 1
    assert _sample(text, "arbor_request_success_total", finish_reason="stop") == 1
    assert _sample(text, "arbor_generation_tokens_total") == 3
