"""`arbor up`: the whole stack on one machine — embedded Redis, the gateway, N workers.

Each part runs as its own process (exactly what compose runs), kept running by a `Supervisor`
(ops/launch/supervisor.py): a worker or the gateway that dies is restarted after a capped backoff while
the rest keep serving, and a dead worker's streams continue on another worker or on its
replacement (the queue's crash continuation). A crash loop, or a process that exits with a user
error, stops the stack with one message naming it and its last lines. Only Ctrl-C or SIGTERM
stops everything cleanly: workers drain, then the gateway stops, then Redis. While it runs, the
stack's URLs are in a runtime file (ops/launch/stack_file.py) that `arbor top` reads.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, get_args

import redis

from ops.launch.embedded_redis import APPENDFSYNC_POLICIES, EmbeddedRedis
from ops.launch.restart_policy import RestartPolicy
from ops.launch.stack_file import StackInfo, runtime_dir, write_stack
from ops.launch.supervisor import GiveUp, Supervisor
from shared import keys
from shared.redis_connect import sync_client
from shared.settings import (
    DEFAULT_MODEL_NAME,
    DEFAULT_SPECULATION,
    GatewaySettings,
    Kernels,
    Speculation,
    served_model_name,
)
from shared.tool_call_grammar import TOOL_FORMATS

READY_TIMEOUT_S = 600.0
POLL_INTERVAL_S = 0.2
REDIS_TIMEOUT_S = 2.0


def add_up_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("up", help="run Redis (embedded unless REDIS_URL is set), the gateway and workers")
    parser.add_argument("--port", type=int, default=None, help="the gateway's port (ARBOR_PORT, default 8000)")
    parser.add_argument("--host", default=None, help="the gateway's address (ARBOR_HOST, default 127.0.0.1)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--model", default=None, help="HF folder or .gguf (default: SmolLM2-135M-Instruct)")
    parser.add_argument(
        "--speculation",
        default=None,
        choices=get_args(Speculation),
        help=f"speculation mode (SPECULATION; default {DEFAULT_SPECULATION}, shared/settings.py)",
    )
    parser.add_argument("--draft", default=None)
    parser.add_argument(
        "--kernels",
        default=None,
        choices=get_args(Kernels),
        help="who multiplies int4/int8 weights on a CPU: auto, native, native-int8 or torch (ARBOR_KERNELS)",
    )
    parser.add_argument(
        "--served-model-name", default=None, help="name,alias,... clients may send as model (ARBOR_SERVED_MODEL_NAME)"
    )
    parser.add_argument(
        "--tool-parser",
        default=None,
        choices=TOOL_FORMATS,
        help="tool-call format (ARBOR_TOOL_PARSER; default: from the chat template)",
    )
    parser.add_argument(
        "--redis-appendfsync",
        default="everysec",
        choices=APPENDFSYNC_POLICIES,
        help="the embedded Redis's fsync policy: everysec (a host crash may lose the last second) or always",
    )
    parser.add_argument("--ready-timeout", type=float, default=READY_TIMEOUT_S)
    parser.set_defaults(handler=run_up)


def run_up(args: argparse.Namespace) -> int:
    if args.workers < 1:
        raise ValueError(f"--workers={args.workers} must be at least 1")
    gateway = _check_settings(args)
    args.host, args.port = gateway.host, gateway.port  # a flag, else ARBOR_HOST / ARBOR_PORT, else the default
    started = time.monotonic()
    redis_url = os.environ.get("REDIS_URL")
    embedded = None if redis_url else _embedded_redis(args).start()
    redis_url = redis_url or (embedded.url if embedded is not None else "")
    env = dict(os.environ, REDIS_URL=redis_url, ARBOR_HOST=gateway.host, ARBOR_PORT=str(gateway.port))
    env.setdefault("ARBOR_WORKERS_PER_HOST", str(args.workers))  # they split this machine's cores
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    restarts = RestartCounts(redis_url)
    supervisor = Supervisor(RestartPolicy(), on_restart=restarts.count)
    stack_path: Path | None = None
    try:
        redis_source = "embedded Redis" if embedded is not None else "Redis at REDIS_URL"
        _progress(f"{redis_source} up; starting the gateway and {args.workers} worker(s)")
        gateway_process = supervisor.add("gateway", _command(["gateway"]), env, hide=_own_health_poll)
        for number in range(1, args.workers + 1):
            supervisor.add(f"worker-{number}", _command(_worker_args(args)), env)
        url = f"http://{args.host}:{args.port}"
        outcome = _wait_healthy(url, supervisor, args.ready_timeout, lambda: stopping)
        gateway_process.hide = None  # the polls are over: a 503 now is news
        if stopping:
            return 0  # asked to stop while starting: a clean stop
        if outcome is not True:
            return _fail(outcome)
        _progress(f"ready in {time.monotonic() - started:.1f} s")
        restarts.start([child.name for child in supervisor.children])
        info = StackInfo(os.getpid(), args.port, url, redis_url, args.workers)
        stack_path = write_stack(info, runtime_dir())
        _announce(url, args.workers, (args.served_model_name or "").split(",")[0].strip() or served_name(args.model))
        while not stopping:
            give_up = supervisor.poll()
            if give_up is not None:
                return _fail(give_up)
            if embedded is not None and not embedded.running:
                _restart_redis(embedded, restarts, [child.name for child in supervisor.children])
            time.sleep(POLL_INTERVAL_S)
        return 0
    finally:
        if stack_path is not None:
            stack_path.unlink(missing_ok=True)
        supervisor.stop_all()
        if embedded is not None:
            embedded.stop()


def _embedded_redis(args: argparse.Namespace) -> EmbeddedRedis:
    """A Redis with its append-only file in the runtime directory (private to the user), one
    folder per port. A folder left by a stack that was killed is cleared: its jobs' clients are
    gone."""
    data_dir = runtime_dir() / f"redis-{args.port}"
    shutil.rmtree(data_dir, ignore_errors=True)
    return EmbeddedRedis(data_dir=data_dir, appendfsync=args.redis_appendfsync)


def _restart_redis(embedded: EmbeddedRedis, restarts: RestartCounts, names: list[str]) -> None:
    """The embedded Redis died: start it again on the same socket, from its append-only file.
    The gateway and the workers ride out the outage and reconnect; the jobs, their pending
    entries and event logs are back, so streams in flight continue (a worker's unsent events
    are resent, and the gateway repairs what pub/sub dropped from the event log)."""
    print("arbor up: the embedded Redis exited; starting it again from its append-only file", file=sys.stderr)
    embedded.stop(keep_data=True)
    embedded.start()
    restarts.start(names)
    restarts.count("redis")


def _fail(outcome: GiveUp | str) -> int:
    print(outcome.message() if isinstance(outcome, GiveUp) else outcome, file=sys.stderr, flush=True)
    return 1


class RestartCounts:
    """Each process's restarts in Redis, where the gateway's /metrics and `arbor top` read them.
    Every process starts at 0, so the counter is exported before its first restart."""

    def __init__(self, redis_url: str) -> None:
        timeout_s = REDIS_TIMEOUT_S
        self._client = sync_client(redis_url, timeout_s)

    def start(self, names: list[str]) -> None:
        for name in names:
            self._write(name, functools.partial(self._client.hsetnx, keys.PROCESS_RESTARTS, name, 0))

    def count(self, name: str) -> None:
        self._write(name, functools.partial(self._client.hincrby, keys.PROCESS_RESTARTS, name, 1))

    def _write(self, name: str, write: Callable[[], object]) -> None:
        try:
            write()
        except redis.RedisError as error:  # Redis down: the restart still happens, uncounted
            print(f"arbor up: could not count {name}'s restarts ({type(error).__name__})", file=sys.stderr)


def _check_settings(args: argparse.Namespace) -> GatewaySettings:
    """Read the settings the children will read, so that a bad one is this command's one-line
    error before anything starts, not a child's exit during start-up; the gateway's, with the
    address and port it will listen on."""
    from shared.settings import WorkerSettings

    flags = {name: getattr(args, name) for name in ("host", "port") if getattr(args, name) is not None}
    gateway = GatewaySettings(**flags)
    WorkerSettings(**_worker_flags(args))
    return gateway


def _worker_args(args: argparse.Namespace) -> list[str]:
    argv = ["worker"]
    for flag, value in _worker_flags(args).items():
        argv += [f"--{flag.replace('_', '-')}", str(value)]
    return argv


def _worker_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The flags `arbor up` passes on to each worker, where given."""
    flags = ("model", "speculation", "draft", "kernels", "served_model_name", "tool_parser")
    return {flag: getattr(args, flag) for flag in flags if getattr(args, flag) is not None}


def _progress(message: str) -> None:
    print(f"arbor up: {message}", flush=True)


def _own_health_poll(line: str) -> bool:
    """The gateway's access line for one of `_wait_healthy`'s polls before a worker is ready: one
    every half second would bury the workers' progress lines (shown again once it is ready)."""
    return '"GET /health HTTP/1.1" 503' in line


def _command(argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "ops.cli", *argv]


def _wait_healthy(
    url: str, supervisor: Supervisor, timeout_s: float, stopping: Callable[[], bool]
) -> Literal[True] | GiveUp | str:
    """True once the gateway answers /health with 200 (a ready worker); a process that cannot
    be kept running, or a message (at the deadline, or asked to stop), otherwise. Restarts go on
    meanwhile."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stopping():
        give_up = supervisor.poll()
        if give_up is not None:
            return give_up
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    return "arbor up: stopped while starting" if stopping() else f"arbor up: not healthy after {timeout_s:.0f} s"


def served_name(model: str | None) -> str:
    """The `model` clients send for a worker started with `--model model` (None: the default)."""
    return DEFAULT_MODEL_NAME if model is None else served_model_name(model)


def _announce(url: str, num_workers: int, model: str) -> None:
    print(
        f"Arbor is up at {url} with {num_workers} worker(s). Try:\n"
        f"  curl {url}/v1/chat/completions -H 'Content-Type: application/json' \\\n"
        f'    -d \'{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}]}}\'\n'
        f"Ctrl-C stops everything.",
        flush=True,
    )
