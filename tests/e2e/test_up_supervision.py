"""`arbor up` keeps its stack serving when a worker dies, and `arbor top` finds it unaided.

Each stack here is a real `arbor up` (embedded Redis, gateway, workers) on a tiny model, with
heartbeats every 0.2 s and a 1 s TTL, so a dead worker's job is reclaimed about a second after
it dies. A worker is killed with SIGKILL while it streams; the client's stream must finish with
the text the same request gets when nothing goes wrong (greedy, the prefill cache off, so both
runs compute the same thing), the killed worker must be replaced, and the stack must serve the
next request. `XDG_RUNTIME_DIR` is the test's own, so `arbor top` can only find this stack
through the runtime file `arbor up` writes there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from ops.launch.stack_file import find_stack, runtime_dir
from shared import keys
from shared.heartbeat import Heartbeat
from tests.e2e.chat_stream import BackgroundStream
from tests.e2e.live_stack import READY_LINE, REPO_ROOT, STOP_TIMEOUT_S, free_loopback_port, spawn
from tests.support.pending import job_owner_in_any_stream
from tests.support.processes import child_pids, command_line
from tests.support.tiny_models import make_tiny_model
from tests.support.waiting import wait_for

MODEL = "tiny-qwen3"
CONTEXT = 4096
START_TIMEOUT_S = 240.0  # two shared cores: workers importing torch at once can be slow
END_S = 180.0  # a whole stream, a death and a reclaim included
MAX_TOKENS = 1500  # long enough to be killed in the middle of on the tiny model


@dataclass
class UpStack:
    process: subprocess.Popen
    env: dict[str, str]
    base_url: str
    log: Path

    def redis(self) -> redis.Redis:
        info = find_stack(runtime_dir(self.env))
        return redis.Redis.from_url(info.redis_url, decode_responses=True, socket_timeout=10)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def live_workers(self) -> list[Heartbeat]:
        with self.redis() as client:
            beats = [client.hgetall(keys.worker_heartbeat(wid)) for wid in client.smembers(keys.WORKERS_SET)]
        return [beat for beat in (Heartbeat.from_fields(fields) for fields in beats if fields) if beat.ready]

    def job_owner(self, request_id: str) -> str | None:
        with self.redis() as client:
            return job_owner_in_any_stream(client, MODEL, request_id)

    def restarts(self) -> dict[str, float]:
        exposition = httpx.get(f"{self.base_url}/metrics", timeout=10).text
        prefix = "arbor_process_restarts_total{"
        rows = [line.removeprefix(prefix).split() for line in exposition.splitlines() if line.startswith(prefix)]
        return {labels.split('"')[1]: float(value) for labels, value in rows}


def start_up(tmp_path: Path, model_dir: Path, num_workers: int, name: str) -> UpStack:
    port = free_loopback_port()
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"} | {
        "OMP_NUM_THREADS": "1",
        "XDG_RUNTIME_DIR": str(tmp_path / f"{name}-run"),
        "ARBOR_HEARTBEAT_INTERVAL_S": "0.2",
        "ARBOR_HEARTBEAT_TTL_S": "1",
        "ARBOR_PREFILL_CACHE_BYTES": "0",
        "ARBOR_MAX_CONTEXT": str(CONTEXT),
    }
    log = tmp_path / f"{name}.log"
    argv = ["up", "--model", str(model_dir), "--speculation", "ngram", "--port", str(port)]
    process = spawn([*argv, "--workers", str(num_workers)], env, log)
    stack = UpStack(process, env, f"http://127.0.0.1:{port}", log)
    wait_for(lambda: READY_LINE in stack.output() or process.poll() is not None, START_TIMEOUT_S, "arbor up")
    assert process.poll() is None, stack.output()[-3000:]
    wait_for(lambda: len(stack.live_workers()) == num_workers, START_TIMEOUT_S, "every worker ready")
    return stack


def stop_up(stack: UpStack) -> None:
    stack.process.send_signal(signal.SIGTERM)
    try:
        status = stack.process.wait(STOP_TIMEOUT_S)
    finally:
        if stack.process.poll() is None:
            stack.process.kill()
    assert status == 0, stack.output()[-3000:]
    assert not list(runtime_dir(stack.env).glob("stack-*.json")), "the runtime file goes with the stack"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("up-models") / MODEL, max_position_embeddings=CONTEXT)


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[UpStack]:
    stack = start_up(tmp_path_factory.mktemp("up-two"), model_dir, 2, "two")
    try:
        yield stack
    finally:
        stop_up(stack)


def chat(content: str) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
    }


def answer(stack: UpStack, body: dict) -> str:
    response = httpx.post(f"{stack.base_url}/v1/chat/completions", json=body, timeout=END_S)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def pid_of(worker_id: str) -> int:
    return int(worker_id.rsplit("-", 2)[1])  # the default WORKER_ID is host-pid-random


def kill_the_worker_serving(stack: UpStack, body: dict) -> tuple[BackgroundStream, str]:
    """Start a stream, SIGKILL its worker once text flows; the stream and the killed worker's id."""
    client = BackgroundStream(stack.base_url, body, END_S)
    client.start()
    request_id = wait_for(lambda: client.stream.request_id, END_S, "the stream to open")
    owner = wait_for(lambda: stack.job_owner(request_id), END_S, "a worker to take the job")
    wait_for(lambda: client.stream.num_chunks >= 2, END_S, "text to flow")
    assert client.stream.finish_reason is None, "killed mid-stream, not after it"
    os.kill(pid_of(owner), signal.SIGKILL)
    return client, owner


@pytest.mark.timeout(900)
def test_a_worker_killed_mid_stream_is_replaced_and_the_stream_finishes_as_if_uninterrupted(
    two_workers: UpStack,
) -> None:
    assert two_workers.restarts() == {"gateway": 0.0, "worker-1": 0.0, "worker-2": 0.0}, "exported from the start"
    body = chat("Tell me a long story about rivers.")
    client, killed = kill_the_worker_serving(two_workers, body)
    stream = client.finish(END_S)
    assert stream.complete, (stream, two_workers.output()[-3000:])
    assert stream.text == answer(two_workers, body), "nothing lost or repeated"
    assert two_workers.process.poll() is None, "the stack stays up"
    workers = wait_for(lambda: len(two_workers.live_workers()) == 2, START_TIMEOUT_S, "two workers again")
    assert workers
    assert killed not in {beat.worker_id for beat in two_workers.live_workers()}
    assert sum(two_workers.restarts().values()) == 1, "the restart is counted in /metrics"
    assert "restarting it in" in two_workers.output()


def test_arbor_top_finds_the_running_stack_without_environment_variables(two_workers: UpStack) -> None:
    env = {key: value for key, value in two_workers.env.items() if key != "REDIS_URL"} | {"COLUMNS": "200"}
    result = subprocess.run(
        [sys.executable, "-m", "ops.cli", "top", "--once"], env=env, cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    for beat in two_workers.live_workers():
        assert beat.worker_id in result.stdout
    assert "ngram" in result.stdout and MODEL in result.stdout


def test_a_killed_gateway_is_restarted_on_its_port_and_serves_again(two_workers: UpStack) -> None:
    [gateway] = [pid for pid in child_pids(two_workers.process.pid) if command_line(pid)[3:4] == ["gateway"]]
    restarts_before = two_workers.restarts().get("gateway", 0.0)
    os.kill(gateway, signal.SIGKILL)
    wait_for(lambda: gateway not in child_pids(two_workers.process.pid), END_S, "the gateway to be reaped")
    wait_for(lambda: _healthy(two_workers.base_url), START_TIMEOUT_S, "a new gateway to serve")
    assert answer(two_workers, chat("Hello again.") | {"max_tokens": 8})
    assert two_workers.restarts()["gateway"] == restarts_before + 1


def test_a_killed_embedded_redis_is_started_again_and_the_stack_serves(two_workers: UpStack) -> None:
    [server] = [pid for pid in child_pids(two_workers.process.pid) if "redis-server" in command_line(pid)[0]]
    os.kill(server, signal.SIGKILL)
    wait_for(lambda: server not in child_pids(two_workers.process.pid), END_S, "Redis to be reaped")
    wait_for(lambda: _num_live_workers(two_workers) == 2, START_TIMEOUT_S, "both workers back on the new Redis")
    wait_for(lambda: _healthy(two_workers.base_url), START_TIMEOUT_S, "the gateway back on the new Redis")
    assert answer(two_workers, chat("Still there?") | {"max_tokens": 8})
    assert two_workers.restarts()["redis"] == 1.0
    assert "the embedded Redis exited; starting it again" in two_workers.output()


def _num_live_workers(stack: UpStack) -> int:
    """0 while Redis is down (between its death and arbor up starting it again)."""
    try:
        return len(stack.live_workers())
    except redis.ConnectionError:
        return 0


def _healthy(base_url: str) -> bool:
    try:
        return httpx.get(f"{base_url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.timeout(900)
def test_the_only_worker_killed_mid_stream_is_restarted_and_its_stream_finishes(
    tmp_path: Path, model_dir: Path
) -> None:
    stack = start_up(tmp_path, model_dir, 1, "one")
    try:
        body = chat("Describe the sea at night, at length.")
        client, killed = kill_the_worker_serving(stack, body)
        stream = client.finish(END_S)
        assert stream.complete, (stream, stack.output()[-3000:])
        assert stream.text == answer(stack, body)
        [worker] = wait_for(stack.live_workers, START_TIMEOUT_S, "the restarted worker")
        assert worker.worker_id != killed
        assert stack.restarts() == {"gateway": 0.0, "worker-1": 1.0}
        assert answer(stack, chat("And now something short.") | {"max_tokens": 8})
    finally:
        stop_up(stack)


def up_until_it_exits(tmp_path: Path, model_dir: Path) -> tuple[int, str, float]:
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"} | {
        "OMP_NUM_THREADS": "1",
        "XDG_RUNTIME_DIR": str(tmp_path / "run"),
    }
    log = tmp_path / "up.log"
    started = time.monotonic()
    process = spawn(
        ["up", "--model", str(model_dir), "--speculation", "none", "--port", str(free_loopback_port())], env, log
    )
    try:
        status = process.wait(START_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
    return status, log.read_text(errors="replace"), time.monotonic() - started


@pytest.mark.timeout(600)
def test_a_worker_that_crashes_at_start_up_every_time_stops_the_stack_with_one_message(
    tmp_path: Path, model_dir: Path
) -> None:
    broken = tmp_path / "broken-model"
    broken.mkdir()
    for item in model_dir.iterdir():
        (broken / item.name).write_bytes(item.read_bytes())
    (broken / "model.safetensors").write_bytes(b"\x00" * 64)  # a torn download: fails on every load
    status, output, elapsed_s = up_until_it_exits(tmp_path, broken)
    assert status == 1, output[-3000:]
    assert output.count("arbor up: worker-1 ") >= 2, "restarted before it gave up"
    [message] = [line for line in output.splitlines() if "a crash loop" in line]
    assert message.startswith("arbor up: worker-1 exited with status 1: 5 crashes"), message
    assert READY_LINE not in output
    assert elapsed_s < START_TIMEOUT_S


def test_a_worker_that_exits_with_a_user_error_stops_the_stack_at_once(tmp_path: Path, model_dir: Path) -> None:
    status, output, _ = up_until_it_exits(tmp_path, tmp_path / "no-such-model")
    assert status == 1, output[-3000:]
    assert "arbor up: worker-1 exited with status 2 (a user error" in output
    assert "no-such-model" in output.split("arbor up: worker-1 exited with status 2")[1], "its last lines follow"
    assert "restarting it in" not in output
