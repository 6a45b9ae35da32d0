"""A real worker service over a real Redis with a tiny random model: jobs in, protocol events out."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import uuid

import pytest

from shared import keys
from shared.heartbeat import Heartbeat
from shared.openai_schema import ChatCompletionRequest, CompletionRequest, to_sampling_params
from shared.protocol import CancelMessage, DeltaEvent, ErrorEvent, FinalEvent
from tests.worker.service.harness import (
    MODEL,
    InProcessWorker,
    chat_body,
    completion_body,
    events_of,
    queue_is_clean,
    service_config,
    submit,
    text_of,
    token_ids_of,
    wait_done,
    wait_for,
)
from worker.engine.generate import generate
from worker.redis_side.service import READ_BLOCK_MS, WorkerService
from worker.serving_model import ServingModel

SYSTEM = "You are a terse assistant. Answer in one short sentence, and never apologise. " * 3


def reference(served: ServingModel, body: dict, kind: str = "chat"):
    """What `arbor generate` produces for the same request: the oracle for every stream."""
    if kind == "chat":
        request = ChatCompletionRequest.model_validate(body)
        prompt_ids = served.encode_chat([m.model_dump(exclude_none=True) for m in request.messages])
    else:
        request = CompletionRequest.model_validate(body)
        prompt_ids = served.encode_text(request.prompt_value())
    return prompt_ids, generate(served.runner, served.tokenizer, prompt_ids, to_sampling_params(request))


def heartbeat_of(client, worker_id: str) -> Heartbeat:
    return Heartbeat.from_fields(client.hgetall(keys.worker_heartbeat(worker_id)))


def test_a_chat_job_streams_exactly_what_generate_produces(redis_server, client, served_ngram):
    body = chat_body("Hello world, how are you?", max_tokens=20)
    config = service_config(redis_server.url, speculation="ngram")
    with InProcessWorker(config, served_ngram):
        request_id = submit(client, body)
        events = wait_done(client, request_id)
        wait_for(lambda: queue_is_clean(client, request_id), 5, "the ack")
        num_tokens = len(token_ids_of(events))
        beat = wait_for(
            lambda: (b := heartbeat_of(client, config.worker_id)).tokens >= num_tokens and b, 5, "a beat after the job"
        )
    prompt_ids, expected = reference(served_ngram, body)
    assert text_of(events) == expected.text
    assert token_ids_of(events) == expected.token_ids
    final = events[-1]
    assert isinstance(final, FinalEvent) and final.finish_reason == expected.finish_reason
    assert final.usage.prompt_tokens == len(prompt_ids) and final.usage.completion_tokens == len(expected.token_ids)
    assert final.stats.speculation == "ngram" and final.stats.target_forwards == expected.stats.target_forwards
    deltas = [event for event in events if isinstance(event, DeltaEvent)]
    # The first delta says how long the prompt is (Anthropic's message_start), and only the first
    assert [delta.prompt_tokens for delta in deltas] == [len(prompt_ids)] + [None] * (len(deltas) - 1)
    assert deltas[0].cached_tokens == final.usage.cached_tokens
    assert all(e.attempt == 1 and e.id == request_id for e in events)
    assert beat.ready and beat.model == MODEL and beat.speculation == "ngram"
    assert beat.tokens >= len(expected.token_ids) and beat.steps > 0 and beat.lanes_total == config.max_lanes
    assert not client.exists(keys.worker_heartbeat(config.worker_id)), "a clean exit removes the heartbeat"


def test_a_completion_with_a_stop_string_and_logprobs(redis_server, client, served_none):
    probe = completion_body("The quick brown fox", max_tokens=24)
    full = reference(served_none, probe, "completion")[1].text
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop.strip(), f"need visible text to stop on, got {full!r}"
    body = completion_body("The quick brown fox", max_tokens=24, stop=[stop], logprobs=2)
    with InProcessWorker(service_config(redis_server.url), served_none):
        events = wait_done(client, submit(client, body, kind="completion"))
    expected = reference(served_none, body, "completion")[1]
    assert text_of(events) == expected.text and stop not in text_of(events)
    assert events[-1].finish_reason == "stop" and events[-1].stop_sequence == stop
    for delta in (e for e in events if isinstance(e, DeltaEvent)):
        assert delta.logprobs is not None and len(delta.logprobs) == len(delta.token_ids)
        assert all(len(entry.top_logprobs) == 2 for entry in delta.logprobs)


def test_a_count_job_reports_its_prompt_tokens_and_generates_nothing(redis_server, client, served_none):
    body = chat_body([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Count me."}], max_tokens=1)
    with InProcessWorker(service_config(redis_server.url), served_none):
        request_id = submit(client, body, kind="count")
        events = wait_done(client, request_id)
        wait_for(lambda: queue_is_clean(client, request_id), 5, "the ack")
    prompt_ids, _ = reference(served_none, body)
    (final,) = events
    assert isinstance(final, FinalEvent) and final.finish_reason == "stop"
    assert (final.usage.prompt_tokens, final.usage.completion_tokens) == (len(prompt_ids), 0)


def test_n_choices_run_as_separate_lanes(redis_server, client, served_none):
    body = chat_body("Count with me", max_tokens=10, n=2)
    with InProcessWorker(service_config(redis_server.url), served_none):
        events = wait_done(client, submit(client, body), num_choices=2)
    expected = reference(served_none, body)[1].text
    assert text_of(events, 0) == text_of(events, 1) == expected
    assert sorted(e.choice for e in events if isinstance(e, FinalEvent)) == [0, 1]


@pytest.mark.parametrize("served_name", ["served_ngram", "served_hybrid_ngram"])
def test_a_second_request_with_the_same_system_prompt_hits_the_prefill_cache(
    redis_server, client, request, served_name
):
    served = request.getfixturevalue(served_name)
    first = chat_body([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a colour."}])
    second = chat_body([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a fruit, please."}])
    config = service_config(redis_server.url, speculation="ngram")
    with InProcessWorker(config, served):
        cold_events = wait_done(client, submit(client, first))
        events = wait_done(client, submit(client, second))
        wait_for(lambda: heartbeat_of(client, config.worker_id).prefix_cache_hits == 1, 5, "the hit in the heartbeat")
        beat = heartbeat_of(client, config.worker_id)
    assert beat.prefix_cache_queries == 2
    assert events[-1].stats.model_extra["prefix_cache_tokens"] >= 32
    assert events[-1].usage.cached_tokens == events[-1].stats.model_extra["prefix_cache_tokens"]
    assert cold_events[-1].usage.cached_tokens == 0
    cold = reference(served, second)[1]
    assert text_of(events) == cold.text and token_ids_of(events) == cold.token_ids
    assert events[-1].stats.accepted_tokens == cold.stats.accepted_tokens  # the drafter lost nothing


@pytest.mark.parametrize("served_name", ["served_none", "served_hybrid"])
def test_cancel_mid_generation_stops_the_lane_and_frees_it(redis_server, client, request, served_name):
    served = request.getfixturevalue(served_name)
    # "Before its next step" is pinned without timing in test_owner/test_scheduler; here the cancel
    # travels through Redis, so how many steps run meanwhile depends on the machine's load.
    with InProcessWorker(service_config(redis_server.url), served) as worker:
        request_id = submit(client, chat_body("Tell me a long story", max_tokens=400, ignore_eos=True))
        wait_for(lambda: len(events_of(client, request_id)) >= 3, 30, "a few deltas")
        client.set(keys.cancel_key(request_id), "1", ex=60)
        client.publish(keys.CONTROL_CHANNEL, CancelMessage(id=request_id).model_dump_json())
        events = wait_done(client, request_id, timeout_s=30)
        wait_for(lambda: queue_is_clean(client, request_id), 5, "the ack")
        assert worker.service.capacity.held == 0
        assert events[-1].finish_reason == "cancelled"
        assert len(token_ids_of(events)) < 400
        after = submit(client, chat_body("Still there?", max_tokens=4))
        assert isinstance(wait_done(client, after)[-1], FinalEvent)


def test_a_job_cancelled_before_any_worker_read_it_ends_cancelled_and_is_acknowledged(
    redis_server, client, served_none, monkeypatch
):
    monkeypatch.setattr("worker.redis_side.service.CANCEL_POLL_S", 600.0)  # only the read at hand-over can see it
    with InProcessWorker(service_config(redis_server.url), served_none) as worker:
        wait_done(client, submit(client, chat_body("Hi", max_tokens=2)))  # up, subscribed, polled once
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        # The client left while the job waited: its cancel key is set, its message went out before
        # any worker held the job, so nobody heard it.
        client.set(keys.cancel_key(request_id), "1", ex=60)
        submit(client, chat_body("Tell me a long story", max_tokens=400, ignore_eos=True), request_id=request_id)
        events = wait_done(client, request_id, timeout_s=30)
        wait_for(lambda: queue_is_clean(client, request_id), 5, "the ack")
        assert worker.service.capacity.held == 0
    assert events[-1].finish_reason == "cancelled"
    assert len(token_ids_of(events)) < 400


def test_poison_jobs_are_dead_lettered_and_the_worker_keeps_serving(redis_server, client, served_none):
    stream = keys.request_stream(MODEL)
    with InProcessWorker(service_config(redis_server.url), served_none):
        bad_body = submit(client, {"model": MODEL, "messages": "not a list"})
        client.xadd(stream, {"garbage": "1"})  # not even a job: no id to answer
        events = wait_done(client, bad_body)
        good = submit(client, chat_body("Hello", max_tokens=4))
        assert isinstance(wait_done(client, good)[-1], FinalEvent)
        letters = wait_for(
            lambda: len(client.xrange(keys.DEAD_LETTER_STREAM)) == 2, 5, "two dead letters"
        ) and client.xrange(keys.DEAD_LETTER_STREAM)
    assert [type(e) for e in events] == [ErrorEvent] and events[0].code == "invalid_request"
    assert "messages" in events[0].message
    reasons = {fields.get("id", "<none>"): fields["reason"] for _, fields in letters}
    assert set(reasons) == {bad_body, "<none>"}
    assert client.xpending(stream, keys.CONSUMER_GROUP)["pending"] == 0


def test_a_job_past_its_deadline_and_one_too_long_get_error_events(redis_server, client, served_none):
    with InProcessWorker(service_config(redis_server.url), served_none):
        late = submit(client, chat_body("Hi"), deadline_s=-1)
        too_long = submit(client, chat_body("Hi " * 600))  # the tiny model's context is 512
        late_events, long_events = wait_done(client, late), wait_done(client, too_long)
    assert late_events[0].code == "deadline_exceeded"
    assert long_events[0].code == "context_length_exceeded"
    assert "maximum context length is 512" in long_events[0].message


def test_a_worker_drains_on_stop_finishing_its_lanes_and_reading_nothing_new(redis_server, client, served_none):
    worker = InProcessWorker(service_config(redis_server.url), served_none).__enter__()
    running = submit(client, chat_body("Keep going", max_tokens=200, ignore_eos=True))
    wait_for(lambda: events_of(client, running), 30, "the first delta")
    worker.request_stop()
    num_before_stop = len(events_of(client, running))
    wait_for(lambda: worker.service.draining, 5, "draining")
    time.sleep(READ_BLOCK_MS / 1000 + 0.2)  # a read already under way may still deliver; none after it
    queued = submit(client, chat_body("Too late", max_tokens=4))
    worker.stop()
    events = wait_done(client, running, timeout_s=1)
    assert len(events) > num_before_stop + 1 and events[-1].finish_reason == "length"
    assert events_of(client, queued) == []
    assert client.xpending(keys.request_stream(MODEL), keys.CONSUMER_GROUP)["pending"] == 0
    assert client.xlen(keys.request_stream(MODEL)) == 1  # the queued job waits for another worker


@pytest.mark.parametrize("served_name", ["served_none", "served_hybrid"])
def test_the_reasoning_budget_closes_the_think_tag_in_a_real_stream(redis_server, client, request, served_name):
    served = request.getfixturevalue(served_name)
    from worker.chat.template import ChatTemplate
    from worker.redis_side.jobs import FORCED_CLOSE
    from worker.serving_model import ServingModel as Model

    thinking = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "<|im_start|>assistant\n<think>\n"
    )
    model = Model(
        served.name,
        "none",
        served.loaded,
        served.runner,
        ChatTemplate(thinking, served.loaded.checkpoint.special_tokens),
    )
    body = chat_body("Think briefly", max_tokens=30, reasoning_budget=5, ignore_eos=True)
    with InProcessWorker(service_config(redis_server.url), model):
        events = wait_done(client, submit(client, body))
    close_ids = model.tokenizer.encode(FORCED_CLOSE, add_special_tokens=False).ids
    token_ids = token_ids_of(events)
    assert token_ids[5 : 5 + len(close_ids)] == close_ids
    reasoning = "".join(e.reasoning for e in events if isinstance(e, DeltaEvent))
    assert reasoning == model.tokenizer.decode(token_ids[:5])
    assert "</think>" not in text_of(events) and text_of(events).startswith("\n\n")
    assert events[-1].usage.completion_tokens == 30


def test_a_worker_stopped_while_loading_its_model_stops_at_once(redis_server, client, served_none):
    # Loading cannot be interrupted, and big models take minutes: the worker must not wait for it
    loading, release = threading.Event(), threading.Event()

    def slow_load():
        loading.set()
        release.wait(60)
        return served_none

    config = service_config(redis_server.url)
    worker = InProcessWorker(config, slow_load)
    worker.start()
    try:
        assert loading.wait(30)
        wait_for(lambda: client.exists(keys.worker_heartbeat(config.worker_id)), 10, "a loading worker's heartbeat")
        started = time.monotonic()
        worker.stop(timeout_s=10)
        assert time.monotonic() - started < 5, "stopped without waiting for the load"
        assert worker.error is None and worker.service.abandoned_loading
        assert not client.exists(keys.worker_heartbeat(config.worker_id)), "it retired its heartbeat"
    finally:
        release.set()


def test_a_loop_whose_body_swallows_a_cancel_still_ends(redis_server):
    # redis-py has had bugs that swallow a task's CancelledError; shutting down must not hang on one
    service = WorkerService(service_config(redis_server.url), lambda: None)
    turns = 0

    async def swallowing_body() -> None:
        nonlocal turns
        turns += 1
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            if turns > 1:
                raise  # only the first is swallowed, so that without the check the test fails, not hangs

    async def cancel_it() -> None:
        task = asyncio.create_task(service._forever("swallower", swallowing_body))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)

    asyncio.run(cancel_it())
    assert turns == 1


def test_a_worker_process_freezes_its_loaded_heap_before_serving(redis_server, client, served_none):
    """`arbor worker` freezes what loading allocated: a full collection then walks only what serving
    allocates (on SmolLM2 it walked ~330,000 objects, a ~150 ms pause in some stream)."""
    body = chat_body("Count with me", max_tokens=6)
    worker = InProcessWorker(service_config(redis_server.url), served_none)
    worker.service.freeze_heap = True
    assert gc.get_freeze_count() == 0
    try:
        with worker:
            assert gc.get_freeze_count() > 1000, "frozen once the model is loaded, before the first job"
            events = wait_done(client, submit(client, body))
    finally:
        gc.unfreeze()  # this process is the test run, not a worker
    assert text_of(events) == reference(served_none, body)[1].text
