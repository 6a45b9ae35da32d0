"""A stack whose parts the fault tests kill, freeze and restart one at a time.

    redis-server on a fixed loopback port (EmbeddedRedis(tcp=True)): a restart keeps the URL and
        loses the data, as the embedded Redis of `arbor up` does
    python -m ops.cli gateway                     -> 127.0.0.1:P
    python -m ops.cli worker --worker-id w-a ...  } two workers serving the same tiny model, so
    python -m ops.cli worker --worker-id w-b ...  } that one can take over the other's jobs

Nothing supervises them (unlike `arbor up`, which stops everything when one part dies): a test
breaks what it likes and `heal()` brings back whatever is down before the next one. Workers beat
every 0.2 s with a 1 s TTL, so a dead worker's jobs are reclaimed about a second later, and run
with the prefill cache off, so a prompt seen before is prefilled again (the kill-in-prefill test
relies on it). The gateway's own request deadline is far beyond every test's hang bound: a stream
that only ends at that deadline counts as a hang.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import httpx
import redis

from ops.launch.embedded_redis import EmbeddedRedis
from shared import keys
from shared.heartbeat import Heartbeat
from tests.e2e.live_stack import free_loopback_port, spawn
from tests.support.pending import job_owner_in_any_stream
from tests.support.waiting import wait_for

MODEL = "tiny-qwen3"
CONTEXT = 4096
WORKER_IDS = ("w-a", "w-b")
LANES_PER_WORKER = 4
HEARTBEAT_TTL_S = 1.0
EVENT_POLL_S = 0.5
ORPHAN_TIMEOUT_S = 1.0  # a job whose gateway died is cancelled after this long
GATEWAY_DEADLINE_S = 900.0
START_TIMEOUT_S = 240.0  # two shared cores: two workers importing torch at once can be slow
STOP_TIMEOUT_S = 30.0


class FaultStack:
    def __init__(self, model_dir: Path, log_dir: Path):
        self.model_dir = model_dir
        self.log_dir = log_dir
        self.redis_server = EmbeddedRedis(tcp=True)
        self.port = free_loopback_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.gateway: subprocess.Popen | None = None
        self.workers: dict[str, subprocess.Popen] = {}
        self.log_names: dict[str, str] = {}  # part -> its current incarnation's log file in log_dir
        self._num_spawned = 0

    # -- parts ---------------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        env = dict(
            os.environ,
            REDIS_URL=self.redis_server.url,
            OMP_NUM_THREADS="1",
            ARBOR_LOG_LEVEL="warning",
            ARBOR_PORT=str(self.port),
            ARBOR_EVENT_POLL_S=str(EVENT_POLL_S),
            ARBOR_REQUEST_TIMEOUT_S=str(GATEWAY_DEADLINE_S),
            ARBOR_HEARTBEAT_INTERVAL_S="0.2",
            ARBOR_HEARTBEAT_TTL_S=str(HEARTBEAT_TTL_S),
            ARBOR_DRAIN_GRACE_S="5",
            ARBOR_ORPHAN_TIMEOUT_S=str(ORPHAN_TIMEOUT_S),
        )
        env.pop("ARBOR_API_KEYS", None)
        return env

    def start_gateway(self) -> None:
        self.gateway = self._spawn("gateway", ["gateway"])

    def start_worker(self, worker_id: str) -> None:
        argv = [
            "worker",
            "--model",
            str(self.model_dir),
            "--speculation",
            "none",
            "--worker-id",
            worker_id,
            "--max-lanes",
            str(LANES_PER_WORKER),
            "--max-context",
            str(CONTEXT),
            "--prefill-cache-bytes",
            "0",
        ]
        self.workers[worker_id] = self._spawn(worker_id, argv)

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        self._num_spawned += 1
        self.log_names[name] = f"{self._num_spawned:02d}-{name}.log"
        return spawn(argv, self.env(), self.log_dir / self.log_names[name])

    def start(self) -> FaultStack:
        self.redis_server.start()
        self.start_gateway()
        for worker_id in WORKER_IDS:
            self.start_worker(worker_id)
        self.wait_healthy()
        return self

    def heal(self) -> None:
        """Bring back whatever a test left down, and wait until everything serves again."""
        if not self.redis_server.running:
            self.redis_server.start()
        if self.gateway is None or self.gateway.poll() is not None:
            self.start_gateway()
        for worker_id in WORKER_IDS:
            process = self.workers.get(worker_id)
            if process is None or process.poll() is not None:
                self.start_worker(worker_id)
        self.wait_healthy()

    def kill_worker(self, worker_id: str) -> None:
        process = self.workers[worker_id]
        process.send_signal(signal.SIGKILL)
        process.wait(STOP_TIMEOUT_S)

    def kill_gateway(self) -> None:
        assert self.gateway is not None
        self.gateway.send_signal(signal.SIGKILL)
        self.gateway.wait(STOP_TIMEOUT_S)

    def restart_redis(self) -> None:
        """Stop redis-server and start a fresh one on the same port: every key is gone."""
        self.redis_server.stop()
        self.redis_server.start()

    def stop(self) -> dict[str, int | None]:
        """SIGTERM everything still running; each one's exit status (None: had to be killed)."""
        processes = {
            name: process
            for name, process in {**self.workers, "gateway": self.gateway}.items()
            if process is not None and process.poll() is None
        }
        for process in processes.values():
            process.send_signal(signal.SIGCONT)  # in case a test froze it and failed
            process.send_signal(signal.SIGTERM)
        statuses: dict[str, int | None] = {}
        for name, process in processes.items():
            try:
                statuses[name] = process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                statuses[name] = None
        self.redis_server.stop()
        return statuses

    # -- observing -----------------------------------------------------------------------------

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_server.url, decode_responses=True, socket_timeout=10)

    def heartbeats(self) -> dict[str, Heartbeat]:
        with self.redis() as client:
            beats = {worker_id: client.hgetall(keys.worker_heartbeat(worker_id)) for worker_id in WORKER_IDS}
        return {worker_id: Heartbeat.from_fields(fields) for worker_id, fields in beats.items() if fields}

    def steps(self, worker_id: str) -> int:
        """The worker's scheduler steps so far (a prefill chunk is one); -1 while it has no heartbeat."""
        beat = self.heartbeats().get(worker_id)
        return beat.steps if beat is not None else -1

    def healthy(self) -> bool:
        for name, process in {**self.workers, "gateway": self.gateway}.items():
            assert process is not None and process.poll() is None, f"{name} exited\n{self.logs()}"
        beats = self.heartbeats()
        if not all(worker_id in beats and beats[worker_id].ready for worker_id in WORKER_IDS):
            return False
        try:
            return httpx.get(f"{self.base_url}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> None:
        wait_until(self.healthy, timeout_s, f"the fault stack to serve\n{self.logs()}")

    def idle(self) -> bool:
        """No lane busy, nothing waiting or pending, no job state left behind."""
        stream = keys.request_stream(MODEL)
        with self.redis() as client:
            try:
                pending = client.xpending(stream, keys.CONSUMER_GROUP)["pending"]
            except redis.ResponseError:  # NOGROUP: no worker has read since Redis started
                pending = 0
            waiting = client.xlen(stream)
            job_states = list(client.scan_iter(keys.job_state("*")))
        lanes_busy = sum(beat.lanes_busy for beat in self.heartbeats().values())
        return pending == 0 and waiting == 0 and not job_states and lanes_busy == 0 and self.requests_running() == 0

    def job_owner(self, request_id: str) -> str | None:
        """The worker holding the request's stream entry (pending for it), if any."""
        with self.redis() as client:
            return job_owner_in_any_stream(client, MODEL, request_id)

    def requests_running(self) -> float:
        """The gateway's `arbor_requests_running` gauge: generations it still has in flight."""
        exposition = httpx.get(f"{self.base_url}/metrics", timeout=10).text
        [line] = [line for line in exposition.splitlines() if line.startswith("arbor_requests_running ")]
        return float(line.split()[1])

    def logs(self) -> str:
        paths = sorted(self.log_dir.glob("*.log"))
        return "\n".join(f"--- {path.name} ---\n{path.read_text(errors='replace')[-3000:]}" for path in paths)


def wait_until(condition, timeout_s: float, what: str):
    return wait_for(condition, timeout_s, what, poll_s=0.05)
