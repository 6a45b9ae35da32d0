"""A request's `priority`: the key's default when it names none, never better than the key's cap,
the job on its class's stream (listed among the model's classes), and refused when malformed."""

from __future__ import annotations

import openai
import pytest

from shared import keys
from tests.gateway.conftest import MODEL

CLASSES = (-3, 0, 5, 10, 20)


@pytest.fixture
def priority_gateway(make_gateway, make_peer):
    peer = make_peer(priorities=CLASSES)
    gateway = make_gateway(api_keys=("batch-key", "open-key"), key_priorities="batch-key=10:5")
    return gateway, peer


@pytest.mark.parametrize(
    ("key", "requested", "expected"),
    [
        ("batch-key", None, 10),  # the key's default
        ("batch-key", 0, 5),  # capped at the best it may claim
        ("batch-key", 20, 20),  # a worse class is anyone's to take
        ("open-key", None, 0),  # no policy: default 0
        ("open-key", -3, -3),  # and no cap
    ],
)
def test_priority_resolves_against_the_key_and_picks_the_class_stream(
    priority_gateway, redis_client, key, requested, expected
):
    gateway, peer = priority_gateway
    extra = {} if requested is None else {"extra_body": {"priority": requested}}
    reply = gateway.openai(api_key=key).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, **extra
    )
    assert reply.choices[0].message.content == "Hello, world"
    (job,) = [job for job in peer.jobs if job.id == reply.id]
    assert job.priority == expected
    assert str(expected) in redis_client.zrange(keys.priority_classes(MODEL), 0, -1)


def test_a_malformed_priority_is_refused_naming_the_field(priority_gateway):
    gateway, _ = priority_gateway
    client = gateway.openai(api_key="open-key")
    for bad in ("soon", 2**40):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], extra_body={"priority": bad}
            )
        assert caught.value.body["param"] == "priority"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/responses", {"input": "hi", "store": False}),
    ],
)
def test_the_other_apis_carry_priority_to_the_job(priority_gateway, path, body):
    gateway, peer = priority_gateway
    reply = gateway.http(headers={"x-api-key": "batch-key"}).post(path, json={"model": MODEL, "priority": 0, **body})
    assert reply.status_code == 200, reply.text
    assert [job.priority for job in peer.jobs] == [5]  # asked for 0, capped at the key's 5
