"""The real stack for `arbor bench serving`: a private Redis, `arbor gateway` and N `arbor worker` processes.

Started like `arbor up` starts them (each in its own session, so a terminal Ctrl-C reaches only
the benchmark, which then stops them in order), with each process's output in a log file in the
results folder, so the progress bar stays readable. Always an embedded Redis: a benchmark never
writes into a Redis it did not start.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from ops.launch.embedded_redis import EmbeddedRedis
from ops.launch.supervisor import stop_all
from ops.launch.up import served_name

POLL_S = 0.5
LOG_TAIL_CHARS = 1500


class StackError(RuntimeError):
    """A process of the stack exited or never became ready; the message carries its log's tail."""


class Stack:
    def __init__(
        self,
        log_dir: Path,
        model: str | None,
        speculation: str,
        draft: str | None,
        dtype: str,
        worker_threads: int | None,
        ready_timeout_s: float,
        max_workers: int = 1,
        prefill_cache_bytes: int | None = 0,  # None: the worker's own default
        extra_env: dict[str, str] | None = None,
        worker_argv: tuple[str, ...] = (),
        gateway_env: dict[str, str] | None = None,
    ) -> None:
        self.log_dir = log_dir
        self.model_name = served_name(model)
        self.speculation = speculation
        self._model_argv = ["--model", model] if model else []
        self._model_argv += ["--draft", draft] if draft else []
        self._log_suffix = ""  # workers restarted in another mode log beside the first ones
        self._dtype = dtype
        self._worker_threads = worker_threads
        self._max_workers = max_workers  # they split the machine's cores (worker/thread_count.py)
        self._ready_timeout_s = ready_timeout_s
        self._prefill_cache_bytes = prefill_cache_bytes
        self._extra_env = dict(extra_env or {})  # more worker settings (ARBOR_QUANTIZE, ...)
        self._worker_argv = list(worker_argv)
        self._gateway_env = dict(gateway_env or {})
        self._port = 0
        self._redis: EmbeddedRedis | None = None
        self._gateway: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self._logs: dict[int, Path] = {}
        self.base_url = ""

    def start(self, num_workers: int) -> Stack:
        self._redis = EmbeddedRedis().start()
        self._port = _free_loopback_port()
        self.base_url = f"http://127.0.0.1:{self._port}"
        self._start_gateway()
        self.add_workers(num_workers)
        return self

    def restart_gateway(self, env: dict[str, str]) -> None:
        """The gateway stopped and started again on its port with `env` (e.g. ARBOR_PLACEMENT=0)."""
        stop_all([self._gateway] if self._gateway is not None else [])
        self._gateway_env = dict(env)
        self._start_gateway()
        self._wait_ready(len(self.workers))

    def _start_gateway(self) -> None:
        argv = ["gateway", "--host", "127.0.0.1", "--port", str(self._port)]
        self._gateway = self._spawn(argv, f"gateway{self._log_suffix}", self._gateway_env)

    def add_workers(self, count: int) -> None:
        # by default the prefill cache off: repeated prompts must not become cache hits
        argv = ["worker", "--speculation", self.speculation, *self._model_argv, *self._worker_argv]
        if self._prefill_cache_bytes is not None:
            argv += ["--prefill-cache-bytes", str(self._prefill_cache_bytes)]
        for _ in range(count):
            self.workers.append(self._spawn(argv, f"worker-{len(self.workers) + 1}{self._log_suffix}"))
        self._wait_ready(len(self.workers))

    def restart_workers(self, speculation: str, count: int | None = None, log_suffix: str | None = None) -> None:
        """Every worker drained and `count` (as many) started in `speculation`; Redis and the gateway stay up."""
        count = len(self.workers) if count is None else count
        self.remove_workers(len(self.workers))
        self.speculation, self._log_suffix = speculation, log_suffix or f"-{speculation}"
        self.add_workers(count)

    def remove_workers(self, count: int) -> None:
        """SIGTERM drains the newest workers; their heartbeats go with them."""
        leaving, self.workers = self.workers[len(self.workers) - count :], self.workers[: len(self.workers) - count]
        stop_all(leaving)

    def pids(self) -> list[int]:
        """Every process of the stack: Redis, the gateway, the workers."""
        pids = [process.pid for process in [self._gateway, *self.workers] if process is not None]
        if self._redis is not None and self._redis.pid is not None:
            pids.append(self._redis.pid)
        return pids

    def stop(self) -> None:
        stop_all([process for process in [self._gateway, *self.workers] if process is not None])
        self.workers, self._gateway = [], None
        if self._redis is not None:
            self._redis.stop()
            self._redis = None

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _spawn(self, argv: list[str], name: str, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
        assert self._redis is not None
        env = dict(
            os.environ, REDIS_URL=self._redis.url, ARBOR_DTYPE=self._dtype, **self._extra_env, **(extra_env or {})
        )
        env["ARBOR_WORKERS_PER_HOST"] = str(self._max_workers)
        if self._worker_threads:
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(self._worker_threads)
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "ops.cli", *argv],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._logs[process.pid] = log_path
        return process

    def _wait_ready(self, num_workers: int) -> None:
        deadline = time.monotonic() + self._ready_timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            if self.ready_workers() >= num_workers:
                return
            time.sleep(POLL_S)
        raise StackError(
            f"{num_workers} worker(s) not ready after {self._ready_timeout_s:.0f} s (logs in {self.log_dir})"
        )

    def ready_workers(self) -> int:
        """Workers ready in the current mode: a restart waits for the new mode, not for a leftover."""
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=2) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as error:  # 503 until a worker is ready; the body still lists them
            body = json.loads(error.read() or b"{}")
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
            return 0
        workers = body.get("workers", [])
        return sum(1 for worker in workers if worker.get("ready") and worker.get("speculation") == self.speculation)

    def _check_alive(self) -> None:
        for process in [self._gateway, *self.workers]:
            if process is not None and process.poll() is not None:
                tail = self._logs[process.pid].read_text(errors="replace")[-LOG_TAIL_CHARS:]
                name = self._logs[process.pid].stem
                raise StackError(f"{name} exited with {process.returncode} (log {self._logs[process.pid]}):\n{tail}")


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def raise_keyboard_interrupt_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, through the `finally` that stops the stack."""

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
