"""Prefix placement through the real stack: a gateway, two `arbor worker` processes, the OpenAI SDK.

A ten-turn conversation: every turn after the first is served by the worker that served the
first (its prefill cache holds the conversation: cached tokens counted), and each turn's tokens
are what in-process generation makes of the same messages. Then that worker is SIGKILLed while
its heartbeat still looks alive: the next turn is offered to it, taken back after the offer wait,
and served by the other worker.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from shared import keys
from shared.openai_schema import ChatCompletionRequest, to_sampling_params
from shared.settings import GatewaySettings
from tests.gateway.conftest import GatewayServer
from tests.worker.service.harness import MODEL, events_of, token_ids_of, wait_for
from tests.worker.service.test_kill_reclaim import WorkerProcess, all_ready
from worker.engine.generate import generate
from worker.serving_model import ServingModel

SYSTEM = "You answer questions about forest animals, briefly."
MAX_TOKENS = 8
NUM_TURNS = 10


@pytest.fixture
def workers(redis_server, tiny_model_dir, tmp_path) -> Iterator[dict[str, WorkerProcess]]:
    # A heartbeat that outlives a SIGKILL by far: the gateway still takes the killed worker for live.
    started = {
        name: WorkerProcess(name, tiny_model_dir, redis_server.url, tmp_path, ARBOR_HEARTBEAT_TTL_S="60")
        for name in ("w-a", "w-b")
    }
    yield started
    for worker in started.values():
        worker.stop()


@pytest.fixture
def gateway(redis_server) -> Iterator[GatewayServer]:
    server = GatewayServer(GatewaySettings(redis_url=redis_server.url, offer_wait_s=0.5)).start()
    yield server
    server.stop()


def served_by(client, request_id: str) -> tuple[str, list[int]]:
    """The worker that published the request's final event, and the tokens it streamed."""
    events = events_of(client, request_id)
    return events[-1].stats.model_extra["worker_id"], token_ids_of(events)


def reference_ids(served: ServingModel, messages: list[dict]) -> list[int]:
    request = ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0}
    )
    prompt_ids = served.encode_chat([m.model_dump(exclude_none=True) for m in request.messages])
    return generate(served.runner, served.tokenizer, prompt_ids, to_sampling_params(request)).token_ids


@pytest.mark.timeout(240)
def test_turns_follow_their_prefix_and_a_dead_holder_loses_the_next_turn(client, workers, gateway, served_none):
    wait_for(lambda: all_ready(client, workers), 90, "both workers to be ready")
    openai = gateway.openai()
    messages: list[dict] = [{"role": "system", "content": SYSTEM}]
    turns = []  # (messages sent, worker, token ids, cached tokens)
    for turn in range(NUM_TURNS + 1):
        if turn == NUM_TURNS:  # the holder dies before the last turn
            holder = workers[turns[0][1]]
            holder.process.send_signal(signal.SIGKILL)
            holder.process.wait(10)
        messages.append({"role": "user", "content": f"Animal {turn}?"})
        reply = openai.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX_TOKENS, temperature=0)
        worker, token_ids = served_by(client, reply.id)
        details = reply.usage.prompt_tokens_details
        turns.append((list(messages), worker, token_ids, details.cached_tokens if details else 0))
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})

    first_worker = turns[0][1]
    assert [worker for _, worker, _, _ in turns[1:NUM_TURNS]] == [first_worker] * (NUM_TURNS - 1)
    assert all(cached > 0 for *_, cached in turns[1:NUM_TURNS]), [cached for *_, cached in turns]
    survivor = turns[NUM_TURNS][1]
    assert survivor != first_worker
    counts = client.hgetall(keys.placement_counts(MODEL))
    assert int(counts["routed"]) == NUM_TURNS  # turns 2..10, and the last one, offered to the holder
    assert int(counts["moved"]) == 1  # the last, unread by the dead holder, went to the shared stream
    for sent, _, token_ids, _ in turns:
        assert token_ids == reference_ids(served_none, sent)
