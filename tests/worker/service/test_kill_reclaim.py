"""Two `arbor worker` processes; the one streaming a job is SIGKILLed; the other takes over.

The client's view must be one unbroken stream: events by seq concatenate to exactly the output of
the same request served without interruption.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared import keys
from shared.heartbeat import Heartbeat
from shared.protocol import FinalEvent
from tests.worker.service.harness import (
    MODEL,
    chat_body,
    events_of,
    submit,
    text_of,
    token_ids_of,
    wait_done,
    wait_for,
)

REPO = Path(__file__).resolve().parents[3]


class WorkerProcess:
    def __init__(self, worker_id: str, model_dir: Path, redis_url: str, log_dir: Path, **extra_env: str):
        self.worker_id = worker_id
        self.log_path = log_dir / f"{worker_id}.log"
        env = {
            **os.environ,
            "ARBOR_SERVED_MODEL_NAME": MODEL,
            "ARBOR_HEARTBEAT_INTERVAL_S": "0.2",
            "ARBOR_HEARTBEAT_TTL_S": "1.0",
            "ARBOR_DRAIN_GRACE_S": "5",
            "OMP_NUM_THREADS": "1",
            "ARBOR_LOG_LEVEL": "info",
            **extra_env,
        }
        command = [
            sys.executable,
            "-m",
            "ops.cli",
            "worker",
            "--model",
            str(model_dir),
            "--speculation",
            "none",
            "--redis-url",
            redis_url,
            "--worker-id",
            worker_id,
            "--max-context",
            "512",
            "--max-lanes",
            "2",
        ]
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(command, cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._log.close()
        return self.process.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]


@pytest.fixture
def workers(redis_server, tiny_model_dir, tmp_path) -> Iterator[dict[str, WorkerProcess]]:
    started = {name: WorkerProcess(name, tiny_model_dir, redis_server.url, tmp_path) for name in ("w-a", "w-b")}
    yield started
    for worker in started.values():
        worker.stop()


def all_ready(client, workers: dict[str, WorkerProcess]) -> bool:
    for worker in workers.values():
        assert worker.process.poll() is None, f"{worker.worker_id} exited:\n{worker.log()}"
        fields = client.hgetall(keys.worker_heartbeat(worker.worker_id))
        if not fields or not Heartbeat.from_fields(fields).ready:
            return False
    return True


@pytest.mark.timeout(120)
def test_sigkill_mid_stream_is_invisible_to_the_client(client, workers):
    wait_for(lambda: all_ready(client, workers), 60, "both workers to be ready")
    body = chat_body("Tell me everything about foxes", max_tokens=160, ignore_eos=True)
    uninterrupted = wait_done(client, submit(client, body), timeout_s=60)

    request_id = submit(client, body)
    wait_for(lambda: len(events_of(client, request_id)) >= 5, 30, "the stream to start")
    owner = client.hget(keys.job_state(request_id), "worker")
    victim = workers[owner]
    victim.process.send_signal(signal.SIGKILL)
    victim.process.wait(10)
    num_published = len(events_of(client, request_id))
    assert num_published < 150, "the kill came mid-stream"

    events = wait_done(client, request_id, timeout_s=60)
    assert text_of(events) == text_of(uninterrupted)
    assert token_ids_of(events) == token_ids_of(uninterrupted)
    assert {e.attempt for e in events[:num_published]} == {1} and events[-1].attempt == 2
    assert isinstance(events[-1], FinalEvent) and events[-1].usage.completion_tokens == 160
    assert events[-1].stats.model_extra["worker_id"] != owner
    survivor = next(w for name, w in workers.items() if name != owner)
    assert survivor.stop() == 0, survivor.log()
    assert client.xpending(keys.request_stream(MODEL), keys.CONSUMER_GROUP)["pending"] == 0
