"""A client that reads slower than the worker publishes: every chunk still arrives exactly once, in order.

The peer publishes large deltas back to back while the client stalls, so the gateway's writes back
up (flow control) and the events that pile up meanwhile go out together (`Generation.batches`).
"""

from __future__ import annotations

import json
import time

import pytest

from gateway.generation import Generation
from shared.protocol import Job
from tests.gateway.conftest import MODEL, GatewayServer
from tests.gateway.protocol_peer import Step, delta, error, final

NUM_DELTAS = 100
PIECE = "x" * 60_000  # 100 x 60 kB: more than the socket buffers hold while the client stalls


def piece(i: int) -> str:
    return f"<{i}>{PIECE}"


def _fast_script(job: Job) -> list[Step]:
    return [delta(piece(i), token_ids=[i]) for i in range(NUM_DELTAS)] + [final(completion_tokens=NUM_DELTAS)]


def _fast_then_error_script(job: Job) -> list[Step]:
    return [delta(piece(i), token_ids=[i]) for i in range(NUM_DELTAS)] + [error("the lane failed")]


def read_slowly(gateway: GatewayServer) -> list[dict]:
    """Every `data:` event of one streamed chat, stalling 1 s after the first bytes."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "stream": True}
    buffer, events = b"", []
    with gateway.http().stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        for i, data in enumerate(response.iter_raw(65536)):
            if i == 0:
                time.sleep(1.0)  # the peer publishes everything meanwhile
            buffer += data
            *complete, buffer = buffer.split(b"\n\n")
            events += [event.removeprefix(b"data: ").decode() for event in complete]
    assert buffer == b""
    return events


def batch_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every batch the gateway sends (it runs in this process)."""
    sizes: list[int] = []
    batches = Generation.batches

    async def recorded(self):
        async for batch in batches(self):
            sizes.append(len(batch))
            yield batch

    monkeypatch.setattr(Generation, "batches", recorded)
    return sizes


def test_a_slow_client_gets_every_chunk_exactly_once_in_order(
    gateway: GatewayServer, make_peer, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_peer(script=_fast_script)
    sizes = batch_sizes(monkeypatch)

    events = read_slowly(gateway)

    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    contents = [c["choices"][0]["delta"].get("content") for c in chunks]
    assert contents == [""] + [piece(i) for i in range(NUM_DELTAS)] + [None]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert sum(sizes) == NUM_DELTAS + 1 and max(sizes) > 1, "events that piled up went out in one write"


def test_deltas_that_arrived_before_an_error_are_sent_before_it(gateway: GatewayServer, make_peer) -> None:
    make_peer(script=_fast_then_error_script)

    events = read_slowly(gateway)

    assert events[-1] == "[DONE]"
    *deltas, failure = [json.loads(event) for event in events[:-1]]
    assert [c["choices"][0]["delta"].get("content") for c in deltas] == [""] + [piece(i) for i in range(NUM_DELTAS)]
    assert failure["error"]["message"] and "choices" not in failure
