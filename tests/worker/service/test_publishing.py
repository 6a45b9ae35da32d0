"""Publishing from the owner thread: one fenced, idempotent script call per batch, sent without
waiting, resent after Redis goes away, merged while Redis is behind."""

from __future__ import annotations

import contextlib
import time

import pytest
import redis

from shared import keys
from shared.protocol import DeltaEvent, FinalEvent, JobState, Usage, parse_event
from tests.support.redis_server import RedisServer
from tests.worker.service.harness import (
    MODEL,
    InProcessWorker,
    chat_body,
    service_config,
    submit,
    text_of,
    token_ids_of,
    wait_done,
    wait_for,
)
from tests.worker.service.test_service import reference
from worker.redis_side.publisher import MAX_STRETCHED_INTERVAL_S, Publisher, stretched_interval
from worker.redis_side.redis_io import BATCH_SCRIPT, PublishResult, batch_call
from worker.serving.handoff import JobDone, JobRef, Publication
from worker.serving.step_delta import StepDelta

STREAM = keys.request_stream(MODEL)


def read_entries(client: redis.Redis, consumer: str, count: int) -> list[str]:
    with contextlib.suppress(redis.ResponseError):
        client.xgroup_create(STREAM, keys.CONSUMER_GROUP, id="0", mkstream=True)
    [[_, entries]] = client.xreadgroup(keys.CONSUMER_GROUP, consumer, {STREAM: ">"}, count=count)
    return [entry_id for entry_id, _ in entries]


def delta(ref: JobRef, seq: int, token: int, first_output: bool = False) -> Publication:
    event = StepDelta(id=ref.request_id, attempt=ref.attempt, seq=seq, text=f"t{token} ", token_ids=[token])
    return Publication(ref, event, first_output)


def final_of(ref: JobRef, seq: int) -> Publication:
    event = FinalEvent(
        id=ref.request_id,
        attempt=ref.attempt,
        seq=seq,
        finish_reason="stop",
        usage=Usage(prompt_tokens=1, completion_tokens=1),
    )
    return Publication(ref, event)


def run_batch(client: redis.Redis, items: list, worker_id: str = "w1") -> list[PublishResult]:
    script_keys, args = batch_call(items, worker_id)
    return [PublishResult(int(r)) for r in client.register_script(BATCH_SCRIPT)(script_keys, args)]


class Recorder:
    """A publisher's callbacks, written down."""

    def __init__(self) -> None:
        self.lost: list[str] = []
        self.done: list[JobRef] = []


def publisher(url: str, recorder: Recorder, worker_id: str = "w1", **options) -> Publisher:
    pool = redis.ConnectionPool.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    return Publisher(pool, worker_id, STREAM, 2.0, recorder.lost.append, recorder.done.append, **options)


def read_job_a(client: redis.Redis) -> JobRef:
    """Job "a", read by w1, nothing published yet."""
    client.xadd(STREAM, {"id": "a"})
    [entry] = read_entries(client, "w1", 1)
    return JobRef("a", STREAM, entry, 1)


def started_job(client: redis.Redis, url: str) -> tuple[JobRef, Recorder, Publisher]:
    """Job "a", read by w1, with its publisher, whose first event has landed."""
    ref, recorder = read_job_a(client), Recorder()
    sink = publisher(url, recorder)
    sink.put(delta(ref, 0, 0))
    assert wait_for(lambda: not sink.pump(0.01), 10, "the first event to land")
    return ref, recorder, sink


def test_a_batch_is_fenced_event_by_event_and_a_retry_lands_nothing_twice(client) -> None:
    for name in ("a", "b"):
        client.xadd(STREAM, {"id": name})
    [ours] = read_entries(client, "w1", 1)
    [theirs] = read_entries(client, "ghost", 1)
    a, b = JobRef("a", STREAM, ours, 1), JobRef("b", STREAM, theirs, 1)
    pubsub = client.pubsub()
    pubsub.subscribe(keys.events_channel("a"))
    assert pubsub.get_message(timeout=5)["type"] == "subscribe"
    batch = [delta(a, 0, 0), delta(b, 0, 0), delta(a, 1, 1)]

    assert run_batch(client, batch) == [PublishResult.APPLIED, PublishResult.FENCED, PublishResult.APPLIED]
    assert run_batch(client, batch) == [PublishResult.DUPLICATE, PublishResult.FENCED, PublishResult.DUPLICATE]

    logged = [parse_event(raw) for raw in client.lrange(keys.event_log("a"), 0, -1)]
    assert [(e.seq, e.token_ids) for e in logged] == [(0, [0]), (1, [1])]
    assert not client.exists(keys.event_log("b")), "a worker that does not own the entry writes nothing"
    state = JobState.from_fields(client.hgetall(keys.job_state("a")), client.lrange(keys.event_log("a"), 0, -1))
    assert (state.next_seq, state.emitted_token_ids, state.worker) == (2, [[0, 1]], "w1")
    assert set(client.hkeys(keys.job_state("a"))) == {"worker", "attempt", "next_seq"}, "no O(tokens) state"
    heard = [parse_event(m["data"]).seq for m in iter(lambda: pubsub.get_message(timeout=1), None)]
    assert heard == [0, 1], "published once each, in order"
    pubsub.close()


def test_a_stale_attempt_is_fenced(client) -> None:
    ref = read_job_a(client)
    client.hset(keys.job_state("a"), mapping={"attempt": "2", "next_seq": "0"})  # reclaimed meanwhile
    assert run_batch(client, [delta(ref, 0, 0)]) == [PublishResult.FENCED]
    assert not client.exists(keys.event_log("a"))


def test_an_ack_in_a_batch_lands_after_the_events_before_it_and_only_for_its_owner(client) -> None:
    ref = read_job_a(client)
    batch = [delta(ref, 0, 0), JobDone(ref)]

    assert run_batch(client, batch) == [PublishResult.UNHEARD, PublishResult.APPLIED], "nobody subscribed"
    assert client.xlen(STREAM) == 0 and client.xpending(STREAM, keys.CONSUMER_GROUP)["pending"] == 0
    assert not client.exists(keys.job_state("a"))
    assert client.llen(keys.event_log("a")) == 1, "the event landed before the ack"
    assert run_batch(client, [JobDone(ref)]) == [PublishResult.FENCED], "acknowledged once"


def test_pump_sends_without_waiting_and_takes_the_reply_at_a_later_pump(redis_server, client) -> None:
    for name in ("a", "b"):
        client.xadd(STREAM, {"id": name})
    [ours] = read_entries(client, "w1", 1)
    [theirs] = read_entries(client, "ghost", 1)
    a, b = JobRef("a", STREAM, ours, 1), JobRef("b", STREAM, theirs, 1)
    recorder = Recorder()
    sink = publisher(redis_server.url, recorder)
    try:
        assert not sink.put(delta(a, 0, 0))
        assert not sink.put(delta(b, 0, 0))
        assert sink.pump(0.0), "sent, not yet answered"
        assert not sink.put(delta(a, 1, 1)), "a batch in flight is never merged into"
        assert sink.put(delta(a, 2, 2)), "while it waits, the next step merges into the pending delta"
        sink.put(JobDone(a))
        assert wait_for(lambda: not sink.pump(0.01), 10, "the publisher to finish")
    finally:
        sink.close()
    assert recorder.lost == ["b"] and recorder.done == [a]
    logged = [parse_event(raw) for raw in client.lrange(keys.event_log("a"), 0, -1)]
    assert [(e.seq, e.token_ids) for e in logged] == [(0, [0]), (1, [1, 2])]
    assert client.xpending(STREAM, keys.CONSUMER_GROUP)["pending"] == 1, "only the ghost's entry is left"


def test_redis_gone_mid_stream_the_batch_is_resent_and_nothing_lands_twice() -> None:
    with RedisServer(persist=True) as server:
        client = server.client(decode_responses=True)
        ref, recorder, sink = started_job(client, server.url)
        try:
            client.close()
            server.stop(keep_data=True)
            sink.put(delta(ref, 1, 1))
            assert sink.pump(0.01) and sink.pump(0.01), "unsent: redis is down, the owner goes on"
            server.start()
            sink.put(delta(ref, 2, 2))
            sink.put(JobDone(ref))
            assert wait_for(lambda: not sink.pump(0.05), 20, "the publisher to catch up")
        finally:
            sink.close()
        client = server.client(decode_responses=True)
        logged = [parse_event(raw) for raw in client.lrange(keys.event_log("a"), 0, -1)]
        assert [(e.seq, e.token_ids) for e in logged] == [(0, [0]), (1, [1]), (2, [2])]
        assert recorder.done == [ref] and not recorder.lost
        assert client.xlen(STREAM) == 0
        client.close()


def test_the_publisher_reconnects_however_often_its_connection_is_lost(redis_server, client) -> None:
    """Each lost connection is replaced by a new one: none is counted against the pool's limit, or
    a worker would stop publishing for good after that many Redis outages (100 by default)."""
    ref, recorder = read_job_a(client), Recorder()
    pool = redis.ConnectionPool.from_url(
        redis_server.url, socket_timeout=2, socket_connect_timeout=2, max_connections=2
    )
    sink = Publisher(pool, "w1", STREAM, 2.0, recorder.lost.append, recorder.done.append)
    try:
        for seq in range(5):
            sink.put(delta(ref, seq, seq))
            assert wait_for(lambda: not sink.pump(0.01), 10, f"event {seq} to land"), seq
            client.client_kill_filter(_type="normal", skipme=True)  # the publisher's connection, and only it
    finally:
        sink.close()
    assert client.llen(keys.event_log("a")) == 5 and not recorder.lost


def test_a_script_redis_forgot_is_loaded_again(redis_server, client) -> None:
    ref, recorder, sink = started_job(client, redis_server.url)
    try:
        client.script_flush()
        sink.put(delta(ref, 1, 1))
        assert wait_for(lambda: not sink.pump(0.01), 10, "the second event to land")
    finally:
        sink.close()
    assert client.llen(keys.event_log("a")) == 2 and not recorder.lost


def test_a_publisher_far_behind_the_model_merges_steps_and_loses_nothing(
    redis_server, client, served_none, monkeypatch: pytest.MonkeyPatch
):
    take_reply = Publisher._take_reply
    calls = []

    def slow_reply(self, wait_s):  # the first round trip takes a second, the others 30 ms
        if time.monotonic() - self._sent_at < (0.03 if calls else 1.0):
            time.sleep(wait_s)
            return
        calls.append(1)
        take_reply(self, wait_s)

    monkeypatch.setattr(Publisher, "_take_reply", slow_reply)
    body = chat_body("Tell me a story about a fox", max_tokens=40)
    with InProcessWorker(service_config(redis_server.url), served_none):
        events = wait_done(client, submit(client, body), timeout_s=60)  # also checks seq == log index
    _, expected = reference(served_none, body)
    assert token_ids_of(events) == expected.token_ids
    assert text_of(events) == expected.text
    deltas = [event for event in events if isinstance(event, DeltaEvent)]
    assert len(deltas) < len(expected.token_ids), "steps that waited for the publisher went out merged"


def test_a_stream_interval_sends_the_first_token_at_once_then_deltas_of_that_many_tokens(
    redis_server, client, served_none
):
    body = chat_body("Tell me a story about a fox", max_tokens=40)
    with InProcessWorker(service_config(redis_server.url, stream_interval=4), served_none):
        events = wait_done(client, submit(client, body), timeout_s=60)
    _, expected = reference(served_none, body)
    assert token_ids_of(events) == expected.token_ids
    assert text_of(events) == expected.text
    deltas = [event for event in events if isinstance(event, DeltaEvent)]
    shown = next(index for index, event in enumerate(deltas) if event.text)
    sizes = [len(event.token_ids) for event in deltas]
    assert sizes[: shown + 1] == [1] * (shown + 1), "nothing up to the first visible text is held back"
    assert all(size >= 4 for size in sizes[shown + 1 : -1]), sizes
    assert len(sizes) <= shown + 2 + (len(expected.token_ids) - shown - 1) // 4


def test_a_job_nobody_hears_for_the_orphan_timeout_is_reported_once(redis_server, client) -> None:
    for name in ("heard", "orphan"):
        client.xadd(STREAM, {"id": name})
    heard, orphan = (
        JobRef(name, STREAM, entry, 1) for name, entry in zip(("heard", "orphan"), read_entries(client, "w1", 2))
    )
    pubsub = client.pubsub()
    pubsub.subscribe(keys.events_channel("heard"))
    assert pubsub.get_message(timeout=5)["type"] == "subscribe"
    orphaned: list[str] = []
    recorder = Recorder()
    sink = publisher(redis_server.url, recorder, orphan_timeout_s=0.3, on_orphaned=orphaned.append)
    try:
        for seq in range(8):  # 8 steps 0.1 s apart: the orphan's events go unheard for 0.7 s
            sink.put(delta(heard, seq, seq))
            sink.put(delta(orphan, seq, seq))
            assert wait_for(lambda: not sink.pump(0.01), 10, "the step's events to land")
            time.sleep(0.1)
    finally:
        sink.close()
        pubsub.close()
    assert orphaned == ["orphan"], "reported once, and only the job nobody hears"
    assert not recorder.lost


def test_a_publish_interval_holds_later_deltas_back_but_never_a_first_output_or_a_final(redis_server, client):
    ref = read_job_a(client)
    pubsub = client.pubsub()
    pubsub.subscribe(keys.events_channel("a"))
    assert pubsub.get_message(timeout=5)["type"] == "subscribe"
    sink = publisher(redis_server.url, Recorder(), publish_interval_s=3600.0)  # never due by time here

    def heard() -> list[tuple[int, list[int] | None]]:  # (seq, token ids; None for a final) of each message
        events = [parse_event(message["data"]) for message in iter(lambda: pubsub.get_message(timeout=0.5), None)]
        return [(event.seq, getattr(event, "token_ids", None)) for event in events]

    try:
        sink.put(delta(ref, 0, 0, first_output=True))
        assert wait_for(lambda: not sink.pump(0.0), 10, "the first output to land")
        assert heard() == [(0, [0])], "a first output goes at once"
        sink.put(delta(ref, 1, 1))
        for token in (2, 3):
            assert sink.put(delta(ref, 2, token)), "held deltas merge"
        for _ in range(20):
            assert sink.pump(0.0), "held: the owner still has steps to run"
        assert heard() == []
        sink.put(final_of(ref, 2))
        assert wait_for(lambda: not sink.pump(0.0), 10, "the final to land")
        assert heard() == [(1, [1, 2, 3]), (2, None)], "a final takes the held delta along"
        sink.put(delta(ref, 3, 4))
        assert sink.pump(0.0) and heard() == []
        assert wait_for(lambda: not sink.pump(0.01), 10, "an idle owner's flush")
        assert heard() == [(3, [4])], "an owner with no step to run sends at once"
    finally:
        sink.close()
        pubsub.close()


def test_a_publish_interval_spaces_batches_out(redis_server, client) -> None:
    ref = read_job_a(client)
    sink = publisher(redis_server.url, Recorder(), publish_interval_s=0.05)
    try:
        sink.put(delta(ref, 0, 0, first_output=True))
        seq, token, deadline = 1, 1, time.monotonic() + 0.5
        while time.monotonic() < deadline:  # a 1 ms "step", then a pump, for half a second
            time.sleep(0.001)
            if not sink.put(delta(ref, seq, token)):
                seq += 1  # its own event (True: merged into the held one)
            token += 1
            sink.pump(0.0)
        assert sink.flush(5)
    finally:
        sink.close()
    events = [parse_event(raw) for raw in client.lrange(keys.event_log("a"), 0, -1)]
    assert [event.seq for event in events] == list(range(seq))
    assert [t for event in events for t in event.token_ids] == list(range(token)), "every token once, in order"
    assert token > 100 and 4 <= len(events) <= 13, f"~11 batches in 0.5 s, not one per step: {len(events)}"


def test_a_publish_budget_stretches_the_interval_to_what_batches_cost_up_to_a_cap() -> None:
    assert stretched_interval(0.005, 0.000_020, 0.01) == 0.005, "cheap batches: the interval stands"
    assert stretched_interval(0.005, 0.000_150, 0.01) == pytest.approx(0.015), "150 µs a batch, 1%: 15 ms"
    assert stretched_interval(0.005, 0.010, 0.01) == MAX_STRETCHED_INTERVAL_S, "capped: streams stay lively"
    assert stretched_interval(0.2, 0.010, 0.01) == 0.2, "a longer interval asked for is kept"
    assert stretched_interval(0.0, 0.010, 0.01) == 0.0, "0 asks for every step: kept"


def test_a_publisher_over_its_budget_spaces_batches_further_and_loses_nothing(redis_server, client) -> None:
    """Any batch costs far more than a millionth of the time between batches: the interval
    stretches to the cap, and a second's 1 ms steps go out in ~20 batches, not ~200."""
    ref = read_job_a(client)
    sink = publisher(redis_server.url, Recorder(), publish_interval_s=0.005, publish_budget=1e-6)
    try:
        sink.put(delta(ref, 0, 0, first_output=True))
        seq, token, deadline = 1, 1, time.monotonic() + 1.0
        while time.monotonic() < deadline:
            time.sleep(0.001)
            if not sink.put(delta(ref, seq, token)):
                seq += 1
            token += 1
            sink.pump(0.0)
        assert sink.flush(5)
        assert sink.interval_s == MAX_STRETCHED_INTERVAL_S
    finally:
        sink.close()
    events = [parse_event(raw) for raw in client.lrange(keys.event_log("a"), 0, -1)]
    assert [event.seq for event in events] == list(range(seq))
    assert [t for event in events for t in event.token_ids] == list(range(token)), "every token once, in order"
    assert token > 200 and len(events) <= 30, f"~20 batches in 1 s at the cap: {len(events)}"


def test_with_steps_longer_than_the_interval_every_step_goes_out(redis_server, client) -> None:
    """The owner asks `due` after each step, before its `pump`. After a step longer than the
    publish interval the last batch's reply has come, unread: `due` takes it and says yes, so each
    step goes out at its end (not every other step)."""
    ref = read_job_a(client)
    sink = publisher(redis_server.url, Recorder(), publish_interval_s=0.005)
    try:
        sink.put(delta(ref, 0, 0, first_output=True))
        sink.pump(0.0)
        for seq in range(1, 6):
            time.sleep(0.02)  # a 20 ms step: the reply to the last batch has come meanwhile, unread
            assert sink.due(), f"step {seq}"
            assert not sink.put(delta(ref, seq, seq))
            sink.pump(0.0)
        assert sink.flush(5)
    finally:
        sink.close()
    events = [parse_event(raw) for raw in client.lrange(keys.event_log("a"), 0, -1)]
    assert [event.token_ids for event in events] == [[token] for token in range(6)], "one event a step"
