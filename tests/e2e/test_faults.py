"""Faults injected into a live stack (tests/e2e/fault_stack.py), judged by a real HTTP client.

Every stream either ends complete and correct — the same text as the same request served without
a fault (greedy decoding is deterministic, and the prefill cache is off, so both runs compute the
same thing) — or ends with an error in the OpenAI envelope. A stream still open after its bound
is a hang and fails the test; the bounds only detect hangs, they measure nothing. Afterwards the
stack is idle (no lane busy, nothing waiting or pending, no job state, nothing in flight in the
gateway) and serves a normal request.

Worker SIGKILL mid-decode is tested at the worker level in tests/worker/service/test_kill_reclaim.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from shared import keys
from shared.protocol import DeltaEvent, FinalEvent, parse_event
from tests.e2e.chat_stream import BackgroundStream
from tests.e2e.fault_stack import CONTEXT, MODEL, FaultStack, wait_until
from tests.support.tiny_models import make_tiny_model

HANG_S = 60.0  # no byte for this long on a stream that should be flowing: a hang
END_S = 180.0  # a whole stream, on two cores shared with other jobs
LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 355  # ~3,560 tokens: a second or more of prefill
SHORT = "Say something."


@pytest.fixture(scope="module")
def fault_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultStack]:
    model_dir = make_tiny_model(tmp_path_factory.mktemp("fault-models") / MODEL, max_position_embeddings=CONTEXT)
    stack = FaultStack(model_dir, tmp_path_factory.mktemp("fault-logs"))
    try:
        yield stack.start()
    finally:
        statuses = stack.stop()
    # uvicorn shuts down on SIGTERM, then re-raises the signal: the gateway's clean exit is -SIGTERM.
    clean = {name: -signal.SIGTERM if name == "gateway" else 0 for name in statuses}
    assert statuses == clean, f"unclean exit: {statuses}\n{stack.logs()}"


@pytest.fixture
def faults(fault_stack: FaultStack) -> FaultStack:
    """The fault stack with every part up and serving (whatever the previous test broke)."""
    fault_stack.heal()
    return fault_stack


def chat(content: str, max_tokens: int) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }


def answer(stack: FaultStack, body: dict) -> tuple[str, str]:
    """(text, request id) of the request served whole, without streaming."""
    response = httpx.post(f"{stack.base_url}/v1/chat/completions", json=body, timeout=END_S)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"], response.json()["id"]


def answers(stack: FaultStack, bodies: list[dict]) -> list[str]:
    with ThreadPoolExecutor(len(bodies)) as pool:
        return [text for text, _ in pool.map(lambda body: answer(stack, body), bodies)]


def logged_events(stack: FaultStack, request_id: str) -> list:
    with stack.redis() as client:
        return [parse_event(raw) for raw in client.lrange(keys.event_log(request_id), 0, -1)]


def token_ids(events: list) -> list[int]:
    return [token for event in events if isinstance(event, DeltaEvent) for token in event.token_ids]


def assert_serves_and_goes_idle(stack: FaultStack, body: dict, expected_text: str) -> None:
    stack.wait_healthy(END_S)
    assert answer(stack, body)[0] == expected_text
    wait_until(stack.idle, END_S, f"the stack to go idle\n{stack.logs()}")


@pytest.mark.timeout(600)
def test_a_job_redelivered_while_its_first_worker_still_runs_is_streamed_once(faults: FaultStack) -> None:
    # The first worker freezes (SIGSTOP: a long GC pause, a stalled VM) past its heartbeat TTL,
    # the other reclaims the entry, then the first wakes up still holding the job. The fence
    # (entry ownership + attempt + seq) must keep it from writing, and it must drop the job.
    # long enough that the batched tiny model is still streaming when the worker is frozen
    body, short = chat("Tell me everything about foxes.", max_tokens=1200), chat(SHORT, 16)
    reference, reference_id = answer(faults, body)
    short_reference = answer(faults, short)[0]
    client = BackgroundStream(faults.base_url, body, HANG_S)
    client.start()
    wait_until(lambda: client.stream.num_chunks >= 5 or not client.is_alive(), END_S, "the stream to start")
    request_id = client.stream.request_id
    with faults.redis() as redis_client:
        first = redis_client.hget(keys.job_state(request_id), "worker")
        assert first in faults.workers, "the job is running"
        zombie = faults.workers[first]
        os.kill(zombie.pid, signal.SIGSTOP)
        try:
            wait_until(
                lambda: redis_client.hget(keys.job_state(request_id), "worker") not in (None, first),
                END_S,
                "the other worker to reclaim the job",
            )
        finally:
            os.kill(zombie.pid, signal.SIGCONT)

    stream = client.finish(END_S)
    assert stream.complete and stream.text == reference, stream
    events = logged_events(faults, request_id)
    assert [event.seq for event in events] == list(range(len(events))), "every seq was written exactly once"
    assert token_ids(events) == token_ids(logged_events(faults, reference_id))
    attempts = [event.attempt for event in events]
    assert attempts == sorted(attempts) and set(attempts) == {1, 2}, "the first worker wrote nothing after the takeover"
    assert events[-1].stats.model_extra["worker_id"] != first
    read_zombie_log = (faults.log_dir / faults.log_names[first]).read_text
    wait_until(
        lambda: f"job {request_id} is no longer ours" in read_zombie_log(), END_S, "the first worker to drop the job"
    )
    assert_serves_and_goes_idle(faults, short, short_reference)


@pytest.mark.timeout(600)
def test_a_cancel_storm_leaves_no_lane_busy_and_no_job_behind(faults: FaultStack) -> None:
    short = chat(SHORT, 16)
    reference = answer(faults, short)[0]
    seed = random.randrange(2**32)
    outcomes = asyncio.run(_cancel_storm(faults.base_url, random.Random(seed), num_clients=60))
    assert outcomes.count("refused") == 0, f"seed {seed}: {outcomes}"
    assert_serves_and_goes_idle(faults, short, reference)


async def _cancel_storm(base_url: str, rng: random.Random, num_clients: int) -> list[str]:
    """Clients that each start within 2 s and give up at a random moment: before the reply, or
    after a few chunks of a stream. Every request asks for far more tokens than it waits for."""
    limits = httpx.Limits(max_connections=num_clients)
    async with httpx.AsyncClient(base_url=base_url, timeout=HANG_S, limits=limits) as http:
        plans = [
            (
                rng.uniform(0, 2),
                rng.choice(["abandon", "abandon_stream", "mid_stream"]),
                rng.uniform(0, 1.5),
                rng.randint(1, 30),
            )
            for _ in range(num_clients)
        ]
        return await asyncio.gather(*(_give_up(http, *plan) for plan in plans))


async def _give_up(http: httpx.AsyncClient, start_s: float, kind: str, patience_s: float, num_chunks: int) -> str:
    await asyncio.sleep(start_s)
    body = chat(f"Storm {start_s:.3f}: go on and on.", max_tokens=2000)
    if kind != "mid_stream":
        with contextlib.suppress(TimeoutError):
            response = await asyncio.wait_for(
                http.post("/v1/chat/completions", json=body | {"stream": kind == "abandon_stream"}), patience_s
            )
            return "refused" if response.status_code != 200 else "finished"
        return "abandoned"
    async with http.stream("POST", "/v1/chat/completions", json=body | {"stream": True}) as response:
        if response.status_code != 200:
            return "refused"
        seen = 0
        async for line in response.aiter_lines():
            seen += line.startswith("data: ")
            if seen >= num_chunks:
                break
    return "left mid-stream"


@pytest.mark.timeout(600)
def test_a_gateway_killed_mid_stream_ends_the_stream_its_job_is_cancelled_and_a_new_one_serves(
    faults: FaultStack,
) -> None:
    short = chat(SHORT, 16)
    reference = answer(faults, short)[0]
    client = BackgroundStream(faults.base_url, chat("Tell me a long story.", max_tokens=3000), HANG_S)
    client.start()
    wait_until(lambda: client.stream.num_chunks >= 5 or not client.is_alive(), END_S, "the stream to start")
    request_id = client.stream.request_id
    faults.kill_gateway()

    stream = client.finish(END_S)
    assert not stream.done, "the kill came mid-stream"
    assert isinstance(client.failure, httpx.TransportError), f"the connection broke: {client.failure!r}"
    # Nobody hears the orphaned job any more: its worker cancels it instead of running 3000 tokens.
    final = wait_until(
        lambda: next((e for e in logged_events(faults, request_id) if isinstance(e, FinalEvent)), None),
        END_S,
        "the orphaned job to end",
    )
    assert final.finish_reason == "cancelled" and final.usage.completion_tokens < 3000
    faults.start_gateway()
    assert_serves_and_goes_idle(faults, short, reference)


@pytest.mark.timeout(600)
def test_a_redis_restart_under_load_ends_every_stream_cleanly(faults: FaultStack) -> None:
    # The restarted Redis is empty (like the embedded one of `arbor up`): queued and running jobs,
    # event logs and the consumer group are gone. Streams may end in an error, never hang.
    short = chat(SHORT, 16)
    bodies = [chat(f"Story {i}: once upon a time", max_tokens=400) for i in range(2)]
    *references, short_reference = answers(faults, [*bodies, short])
    clients = [BackgroundStream(faults.base_url, bodies[i % 2], HANG_S) for i in range(6)]
    for client in clients:
        client.start()
    wait_until(
        lambda: all(c.stream.num_chunks >= 3 or not c.is_alive() for c in clients), END_S, "every stream to start"
    )
    num_in_flight = sum(client.is_alive() for client in clients)
    faults.restart_redis()

    for i, client in enumerate(clients):
        stream = client.finish(END_S)
        assert client.failure is None, repr(client.failure)
        assert (stream.complete and stream.text == references[i % 2]) or (stream.clean_error and stream.done), stream
    assert num_in_flight >= 1, "the restart came while streams were running"
    assert_serves_and_goes_idle(faults, short, short_reference)


@pytest.mark.timeout(600)
def test_a_worker_killed_in_prefill_is_invisible_to_the_client(faults: FaultStack) -> None:
    body = chat(LONG_PROMPT, max_tokens=48)
    reference, reference_id = answer(faults, body)
    client = BackgroundStream(faults.base_url, body, HANG_S)
    client.start()
    request_id = wait_until(lambda: client.stream.request_id, END_S, "the stream to open")
    with faults.redis() as redis_client:
        owner = wait_until(lambda: faults.job_owner(request_id), END_S, "a worker to take the job")
        steps_at_claim = faults.steps(owner)
        wait_until(lambda: faults.steps(owner) > steps_at_claim, END_S, "a prefill chunk to run")
        faults.kill_worker(owner)
        assert redis_client.llen(keys.event_log(request_id)) == 0, "the worker died before its first token"

    stream = client.finish(END_S)
    assert stream.complete and stream.text == reference, stream
    events = logged_events(faults, request_id)
    assert token_ids(events) == token_ids(logged_events(faults, reference_id)), "no token lost or repeated"
    assert {event.attempt for event in events} == {2}
    final = events[-1]
    assert isinstance(final, FinalEvent) and final.usage.completion_tokens == 48
    assert final.stats.model_extra["worker_id"] != owner
