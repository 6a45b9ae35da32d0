"""The live stack, started once per session and shared by every test here (see live_stack.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.e2e.live_stack import (
    SCRIPTED_MODEL,
    TINY_CONTEXT,
    TINY_MODEL,
    Stack,
    free_loopback_port,
    spawn,
    stop,
    wait_until_serving,
)
from tests.support.redis_server import RedisServer
from tests.support.scripted_model import make_scripted_model
from tests.support.tiny_models import make_tiny_model


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    models = tmp_path_factory.mktemp("models")
    tiny = make_tiny_model(models / TINY_MODEL, max_position_embeddings=TINY_CONTEXT)
    scripted = make_scripted_model(models / SCRIPTED_MODEL)
    log_dir = tmp_path_factory.mktemp("logs")
    port, tiny_metrics, scripted_metrics = free_loopback_port(), free_loopback_port(), free_loopback_port()
    with RedisServer() as redis_server:
        env = dict(
            os.environ,
            REDIS_URL=redis_server.url,
            OMP_NUM_THREADS="1",
            ARBOR_LOG_LEVEL="warning",
            ARBOR_HEARTBEAT_INTERVAL_S="0.5",
            ARBOR_EVENT_POLL_S="0.5",
        )
        env.pop("ARBOR_API_KEYS", None)
        stack = Stack(
            f"http://127.0.0.1:{port}",
            redis_server.url,
            {
                TINY_MODEL: f"http://127.0.0.1:{tiny_metrics}/metrics",
                SCRIPTED_MODEL: f"http://127.0.0.1:{scripted_metrics}/metrics",
            },
            log_dir,
        )
        processes = {
            "up": spawn(
                ["up", "--model", str(tiny), "--speculation", "ngram", "--port", str(port), "--workers", "1"],
                env | {"ARBOR_METRICS_PORT": str(tiny_metrics)},
                log_dir / "up.log",
            ),
            "worker": spawn(
                ["worker", "--model", str(scripted), "--speculation", "ngram"],
                # full drafts every step: its tests count accepted drafts, which adaptive speculation
                # would size from step costs timed on this (maybe busy) machine
                env | {"ARBOR_METRICS_PORT": str(scripted_metrics), "ARBOR_ADAPTIVE_SPECULATION": "0"},
                log_dir / "worker.log",
            ),
        }
        stack.processes = processes
        try:
            wait_until_serving(stack, processes)
            yield stack
        finally:
            stack.close_clients()
            statuses = stop(processes)
        assert statuses == {"up": 0, "worker": 0}, f"unclean exit: {statuses}\n{stack.logs()}"
