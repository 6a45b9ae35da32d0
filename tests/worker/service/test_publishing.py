"""Publishing events: one fenced, idempotent script call per batch, and a publisher that falls behind."""

from __future__ import annotations

import time

import pytest
import redis

from shared import keys
from shared.protocol import DeltaEvent, JobState, parse_event
from tests.worker.service.harness import (
    MODEL,
    InProcessWorker,
    chat_body,
    service_config,
    submit,
    text_of,
    token_ids_of,
    wait_done,
)
from tests.worker.service.test_service import reference
from worker.redis_io import BlockingEventIO, JobRef, Publication, PublishResult

STREAM = keys.request_stream(MODEL)


def read_entries(client: redis.Redis, consumer: str, count: int) -> list[str]:
    try:
        client.xgroup_create(STREAM, keys.CONSUMER_GROUP, id="0", mkstream=True)
    except redis.ResponseError:
        pass
    [[_, entries]] = client.xreadgroup(keys.CONSUMER_GROUP, consumer, {STREAM: ">"}, count=count)
    return [entry_id for entry_id, _ in entries]


def delta(ref: JobRef, seq: int, token: int) -> Publication:
    event = DeltaEvent(id=ref.request_id, attempt=ref.attempt, seq=seq, text=f"t{token} ", token_ids=[token])
    return Publication(ref, event, [list(range(seq + 1))], [])


def test_a_batch_is_fenced_event_by_event_and_a_retry_lands_nothing_twice(client) -> None:
    for name in ("a", "b"):
        client.xadd(STREAM, {"id": name})
    [ours] = read_entries(client, "w1", 1)
    [theirs] = read_entries(client, "ghost", 1)
    a, b = JobRef("a", STREAM, ours, 1), JobRef("b", STREAM, theirs, 1)
    io = BlockingEventIO(client, "w1")
    pubsub = client.pubsub()
    pubsub.subscribe(keys.events_channel("a"))
    assert pubsub.get_message(timeout=5)["type"] == "subscribe"
    batch = [delta(a, 0, 0), delta(b, 0, 0), delta(a, 1, 1)]

    assert io.publish(batch) == [PublishResult.APPLIED, PublishResult.FENCED, PublishResult.APPLIED]
    assert io.publish(batch) == [PublishResult.DUPLICATE, PublishResult.FENCED, PublishResult.DUPLICATE]

    logged = [parse_event(raw) for raw in client.lrange(keys.event_log("a"), 0, -1)]
    assert [(e.seq, e.token_ids) for e in logged] == [(0, [0]), (1, [1])]
    assert not client.exists(keys.event_log("b")), "a worker that does not own the entry writes nothing"
    state = JobState.from_fields(client.hgetall(keys.job_state("a")))
    assert (state.next_seq, state.emitted_token_ids, state.worker) == (2, [[0, 1]], "w1")
    heard = [parse_event(m["data"]).seq for m in iter(lambda: pubsub.get_message(timeout=1), None)]
    assert heard == [0, 1], "published once each, in order"
    pubsub.close()


def test_a_stale_attempt_is_fenced(client) -> None:
    client.xadd(STREAM, {"id": "a"})
    [entry] = read_entries(client, "w1", 1)
    client.hset(keys.job_state("a"), mapping={"attempt": "2", "next_seq": "0"})  # reclaimed meanwhile
    io = BlockingEventIO(client, "w1")
    assert io.publish([delta(JobRef("a", STREAM, entry, 1), 0, 0)]) == [PublishResult.FENCED]
    assert not client.exists(keys.event_log("a"))


def test_a_publisher_far_behind_the_model_merges_steps_and_loses_nothing(redis_server, client, served_none,
                                                                        monkeypatch: pytest.MonkeyPatch):
    publish = BlockingEventIO.publish
    calls = []

    def slow_publish(self, publications):  # the first round trip takes a second, the others 30 ms
        time.sleep(0.03 if calls else 1.0)
        calls.append(len(publications))
        return publish(self, publications)

    monkeypatch.setattr(BlockingEventIO, "publish", slow_publish)
    body = chat_body("Tell me a story about a fox", max_tokens=40)
    with InProcessWorker(service_config(redis_server.url), served_none):
        events = wait_done(client, submit(client, body), timeout_s=60)  # also checks seq == log index
    _, expected = reference(served_none, body)
    assert token_ids_of(events) == expected.token_ids
    assert text_of(events) == expected.text
    deltas = [event for event in events if isinstance(event, DeltaEvent)]
    assert len(deltas) < len(expected.token_ids), "steps that waited for the publisher went out merged"
