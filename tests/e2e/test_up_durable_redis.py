"""`arbor up`'s embedded Redis keeps an append-only file: killed under load, it comes back with
its streams, and every stream in flight finishes as if nothing had happened.

A real `arbor up` (two workers on a tiny model, greedy, the prefill cache off) serves 8 streaming
requests; once text flows on all of them the embedded redis-server gets SIGKILL. `arbor up`
starts it again from its file in the runtime directory; each stream must then end with exactly
the text the same request gets afterwards, uninterrupted (nothing lost, nothing repeated), and
none may end with 503 `job_lost`, which is what a Redis restarted empty gives.
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ops.launch.stack_file import runtime_dir
from tests.e2e.chat_stream import BackgroundStream
from tests.e2e.test_up_supervision import END_S, UpStack, answer, chat, start_up, stop_up
from tests.support.processes import child_pids, command_line
from tests.support.tiny_models import make_tiny_model
from tests.support.waiting import wait_for

NUM_STREAMS = 8
MAX_TOKENS = 600  # on 2 shared cores, 8 streams of this are still running seconds after text flows


def redis_pid(stack: UpStack) -> int:
    [pid] = [pid for pid in child_pids(stack.process.pid) if "redis-server" in command_line(pid)[0]]
    return pid


def start_streams(stack: UpStack) -> list[BackgroundStream]:
    bodies = [chat(f"Story number {number}: tell me about rivers.") | {"max_tokens": MAX_TOKENS} for number in range(8)]
    streams = [BackgroundStream(stack.base_url, body, END_S) for body in bodies]
    for stream in streams:
        stream.start()
    return streams


@pytest.mark.timeout(900)
def test_streams_in_flight_survive_a_sigkill_of_the_embedded_redis(tmp_path: Path) -> None:
    model_dir = make_tiny_model(tmp_path / "tiny-qwen3", max_position_embeddings=4096)
    stack = start_up(tmp_path, model_dir, 2, "durable")
    try:
        [data_dir] = list(runtime_dir(stack.env).glob("redis-*"))
        streams = start_streams(stack)
        wait_for(lambda: all(s.stream.num_chunks >= 2 for s in streams), END_S, "text on every stream")
        server = redis_pid(stack)
        os.kill(server, signal.SIGKILL)
        assert sum(s.stream.finish_reason is None for s in streams) == NUM_STREAMS, "killed under all 8 streams"
        assert (data_dir / "appendonly.aof").exists(), "the file it comes back from"
        wait_for(lambda: server not in child_pids(stack.process.pid), END_S, "Redis to be reaped")
        wait_for(lambda: redis_pid(stack) if _has_redis(stack) else None, END_S, "Redis started again")
        outcomes = [s.finish(END_S) for s in streams]
        assert [s.status for s in streams] == [200] * NUM_STREAMS, [s.stream.error for s in streams]
        assert all(outcome.complete for outcome in outcomes), ([o.error for o in outcomes], stack.output()[-3000:])
        with ThreadPoolExecutor(NUM_STREAMS) as pool:
            expected = list(pool.map(lambda s: answer(stack, s.body | {"stream": False}), streams))
        assert [outcome.text for outcome in outcomes] == expected, "nothing lost or repeated"
        assert stack.restarts()["redis"] == 1.0
    finally:
        stop_up(stack)
    assert not data_dir.exists(), "a clean stop removes the append-only file"


def _has_redis(stack: UpStack) -> bool:
    return any("redis-server" in command_line(pid)[0] for pid in child_pids(stack.process.pid))
