"""Stored responses: GET and DELETE /v1/responses/{id}, and previous_response_id continuing one."""

from __future__ import annotations

import json

import openai
import pytest
import redis

from shared import keys
from shared.protocol import Job
from tests.gateway.conftest import MODEL, GatewayServer
from tests.gateway.protocol_peer import ProtocolPeer
from tests.gateway.responses_scripts import WEATHER, call_script


def _messages(job: Job) -> list[dict]:
    return json.loads(job.body)["messages"]


def test_get_returns_the_stored_response_and_delete_removes_it(
    make_gateway, peer: ProtocolPeer, redis_client: redis.Redis
) -> None:
    gateway = make_gateway(responses_ttl_s=120)
    client, http = gateway.openai(), gateway.http()
    created = client.responses.create(model=MODEL, input="Hi", metadata={"session": "s1"})

    fetched = client.responses.retrieve(created.id)
    assert fetched.model_dump() == created.model_dump()
    assert fetched.metadata == {"session": "s1"} and fetched.store is True
    assert 0 < redis_client.ttl(keys.stored_response(created.id)) <= 120

    deleted = http.delete(f"/v1/responses/{created.id}")
    assert (deleted.status_code, deleted.json()) == (
        200,
        {"id": created.id, "object": "response.deleted", "deleted": True},
    )
    for method in ("GET", "DELETE"):
        gone = http.request(method, f"/v1/responses/{created.id}")
        assert (gone.status_code, gone.json()["error"]["code"]) == (404, "response_not_found")


def test_previous_response_id_replays_its_input_and_output(gateway: GatewayServer, peer: ProtocolPeer) -> None:
    client = gateway.openai()
    first = client.responses.create(model=MODEL, input="Hi", instructions="Old rules.")
    second = client.responses.create(model=MODEL, input="More", previous_response_id=first.id, instructions="New.")
    client.responses.create(model=MODEL, input="Again", previous_response_id=second.id)

    assert second.previous_response_id == first.id
    assert _messages(peer.jobs[1]) == [
        {"role": "system", "content": "New."},  # instructions do not carry over; these are the new ones
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello, world"},
        {"role": "user", "content": "More"},
    ]
    assert _messages(peer.jobs[2])[1:] == [
        {"role": "assistant", "content": "Hello, world"},
        {"role": "user", "content": "More"},
        {"role": "assistant", "content": "Hello, world"},
        {"role": "user", "content": "Again"},
    ]
    assert _messages(peer.jobs[2])[0] == {"role": "user", "content": "Hi"}


def test_a_function_call_continues_from_the_stored_response(gateway: GatewayServer, make_peer) -> None:
    peer = make_peer(script=call_script)
    client = gateway.openai()
    first = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER])
    [call] = first.output

    output = {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"temp_c": 19})}
    second = client.responses.create(model=MODEL, input=[output], previous_response_id=first.id, tools=[WEATHER])

    assert second.output_text == "It is 19 C."
    assert [message["role"] for message in _messages(peer.jobs[1])] == ["user", "assistant", "tool"]
    assert _messages(peer.jobs[1])[1]["tool_calls"][0]["id"] == call.call_id


def test_a_streamed_response_is_stored_before_its_last_event(gateway: GatewayServer, peer: ProtocolPeer) -> None:
    client = gateway.openai()
    with client.responses.stream(model=MODEL, input="Hi") as stream:
        for event in stream:
            if event.type == "response.completed":
                stored = client.responses.retrieve(event.response.id)  # while the stream is still open

    assert stored.output_text == "Hello, world" and stored.status == "completed"


def test_store_false_keeps_nothing(gateway: GatewayServer, peer: ProtocolPeer, redis_client: redis.Redis) -> None:
    client = gateway.openai()
    response = client.responses.create(model=MODEL, input="Hi", store=False)

    assert response.store is False and response.output_text == "Hello, world"
    assert redis_client.exists(keys.stored_response(response.id)) == 0
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_a_missing_previous_response_is_404_and_queues_nothing(
    gateway: GatewayServer, peer: ProtocolPeer, redis_client: redis.Redis
) -> None:
    reply = gateway.http().post(
        "/v1/responses", json={"model": MODEL, "input": "Hi", "previous_response_id": "resp-nothing"}
    )

    assert reply.status_code == 404
    assert reply.json()["error"] | {"message": ""} == {
        "message": "",
        "type": "not_found_error",
        "param": "previous_response_id",
        "code": "previous_response_not_found",
    }
    assert "resp-nothing" in reply.json()["error"]["message"]
    assert peer.jobs == [] and redis_client.xlen(keys.request_stream(MODEL)) == 0


def test_a_long_chain_is_capped_by_the_body_limit(make_gateway, peer: ProtocolPeer) -> None:
    gateway = make_gateway(max_body_bytes=2048)
    client = gateway.openai()
    first = client.responses.create(model=MODEL, input="x" * 1500)

    with pytest.raises(openai.APIStatusError) as caught:
        client.responses.create(model=MODEL, input="y" * 1500, previous_response_id=first.id)

    assert caught.value.status_code == 413 and caught.value.body["param"] == "previous_response_id"
    assert len(peer.jobs) == 1
