"""The real stack: `arbor up` (gateway + one worker) plus a second `arbor worker`.

    redis-server (tests.support.redis_server, REDIS_URL for everything below)
    python -m ops.cli up --model <tiny-qwen3> --speculation ngram --port P --workers 1
        -> `arbor gateway` on 127.0.0.1:P and `arbor worker` serving "tiny-qwen3"
    python -m ops.cli worker --model <scripted> --speculation ngram
        -> a second worker serving "scripted" (tests/support/scripted_model.py), same gateway

Both workers serve their own /metrics (ARBOR_METRICS_PORT). Teardown sends SIGTERM to both
top-level processes and requires a clean exit (status 0) from each.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import redis

from tests.support.processes import child_pids, command_line

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = "tiny-qwen3"
SCRIPTED_MODEL = "scripted"
TINY_CONTEXT = 4096  # long enough that a cancelled generation is told apart from a finished one
START_TIMEOUT_S = 240.0  # two cores shared with other jobs: loading torch twice can be slow
STOP_TIMEOUT_S = 60.0
READY_LINE = "Arbor is up at"


@dataclass
class Stack:
    base_url: str
    redis_url: str
    worker_metrics_urls: dict[str, str]  # served model -> that worker's /metrics
    log_dir: Path
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)  # "up" and "worker"
    _clients: list = field(default_factory=list)

    def openai(self, timeout_s: float = 60.0) -> openai.OpenAI:
        client = openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="x", max_retries=0, timeout=timeout_s)
        self._clients.append(client)
        return client

    def http(self, timeout_s: float = 60.0) -> httpx.Client:
        client = httpx.Client(base_url=self.base_url, timeout=timeout_s)
        self._clients.append(client)
        return client

    def redis(self) -> redis.Redis:
        client = redis.Redis.from_url(self.redis_url, decode_responses=True, socket_timeout=10)
        self._clients.append(client)
        return client

    def logs(self) -> str:
        paths = sorted(self.log_dir.glob("*.log"))
        return "\n".join(f"--- {path.name} ---\n{path.read_text()[-3000:]}" for path in paths)

    def process_ids(self) -> dict[str, int]:
        """gateway, the tiny model's worker (both children of `arbor up`) and the scripted worker."""
        up = self.processes["up"].pid
        children = {command_line(pid)[3]: pid for pid in child_pids(up)}  # python -m ops.cli <command> ...
        return {
            "gateway": children["gateway"],
            TINY_MODEL: children["worker"],
            SCRIPTED_MODEL: self.processes["worker"].pid,
        }

    def close_clients(self) -> None:
        for client in self._clients:
            client.close()


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn(argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    with log_path.open("wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "ops.cli", *argv], env=env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT
        )


def wait_until_serving(stack: Stack, processes: dict[str, subprocess.Popen]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    up_log = stack.log_dir / "up.log"
    with httpx.Client(timeout=5) as client:
        while time.monotonic() < deadline:
            for name, process in processes.items():
                assert process.poll() is None, f"{name} exited with {process.returncode}\n{stack.logs()}"
            if READY_LINE in up_log.read_text():
                try:
                    response = client.get(f"{stack.base_url}/health")
                except httpx.HTTPError:
                    response = None
                if response is not None and response.status_code == 200:
                    ready = {w["model"] for w in response.json()["workers"] if w["ready"]}
                    if ready >= {TINY_MODEL, SCRIPTED_MODEL}:
                        return
            time.sleep(0.5)
    raise AssertionError(f"the stack did not serve both models within {START_TIMEOUT_S} s\n{stack.logs()}")


def stop(processes: dict[str, subprocess.Popen]) -> dict[str, int | None]:
    """SIGTERM each, then wait; the exit status of each (None: did not stop in time, killed)."""
    for process in processes.values():
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    statuses: dict[str, int | None] = {}
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for name, process in processes.items():
        try:
            statuses[name] = process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            statuses[name] = None
    return statuses
