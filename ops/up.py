"""`arbor up`: the whole stack on one machine — embedded Redis, the gateway, N workers.

Each part runs as its own process (exactly what compose runs), supervised here: if any of them
dies the others are stopped, and Ctrl-C or SIGTERM drains workers, stops the gateway, then Redis.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from ops.embedded_redis import EmbeddedRedis
from shared.settings import DEFAULT_MODEL_NAME, served_model_name

READY_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 40.0


def add_up_parser(subparsers) -> None:
    parser = subparsers.add_parser("up", help="run Redis (embedded unless REDIS_URL is set), the gateway and workers")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--model", default=None, help="HF folder or .gguf (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--speculation", default=None, help="none|mtp|dflash|tree|ngram (default: SPECULATION or mtp)")
    parser.add_argument("--draft", default=None)
    parser.add_argument("--ready-timeout", type=float, default=READY_TIMEOUT_S)
    parser.set_defaults(handler=run_up)


def run_up(args: argparse.Namespace) -> int:
    if args.workers < 1:
        raise ValueError(f"--workers={args.workers} must be at least 1")
    _check_settings(args)
    redis_url = os.environ.get("REDIS_URL")
    embedded = None if redis_url else EmbeddedRedis().start()
    env = dict(os.environ, REDIS_URL=redis_url or embedded.url, ARBOR_HOST=args.host, ARBOR_PORT=str(args.port))
    children: list[subprocess.Popen] = []
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        children.append(_spawn(["gateway"], env))
        for _ in range(args.workers):
            children.append(_spawn(_worker_args(args), env))
        url = f"http://{args.host}:{args.port}"
        if not _wait_healthy(url, children, args.ready_timeout, lambda: stopping):
            return 0 if stopping else 1  # asked to stop while starting: a clean stop
        _announce(url, args.workers, served_name(args.model))
        while not stopping:
            if any(child.poll() is not None for child in children):
                print("arbor up: a process exited; stopping the rest", file=sys.stderr)
                return 1
            time.sleep(0.5)
        return 0
    finally:
        stop_all(children)
        if embedded is not None:
            embedded.stop()


def _check_settings(args: argparse.Namespace) -> None:
    """Read the settings the children will read, so that a bad one is this command's one-line
    error before anything starts, not a child's exit during start-up."""
    from shared.settings import GatewaySettings, WorkerSettings

    GatewaySettings(host=args.host, port=args.port)
    WorkerSettings(**_worker_flags(args))


def _worker_args(args: argparse.Namespace) -> list[str]:
    argv = ["worker"]
    for flag, value in _worker_flags(args).items():
        argv += [f"--{flag}", str(value)]
    return argv


def _worker_flags(args: argparse.Namespace) -> dict[str, str]:
    """The flags `arbor up` passes on to each worker, where given."""
    return {flag: getattr(args, flag) for flag in ("model", "speculation", "draft") if getattr(args, flag) is not None}


def _spawn(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    # A new session each, so the terminal's Ctrl-C reaches only us and we stop them in order.
    return subprocess.Popen([sys.executable, "-m", "ops.cli", *argv], env=env, start_new_session=True)


def _wait_healthy(url: str, children: list[subprocess.Popen], timeout_s: float, stopping) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stopping():
        if any(child.poll() is not None for child in children):
            print("arbor up: a process exited during start-up", file=sys.stderr)
            return False
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    if not stopping():
        print(f"arbor up: not healthy after {timeout_s:.0f} s", file=sys.stderr)
    return False


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


def stop_all(children: list[subprocess.Popen]) -> None:
    """Workers first (SIGTERM = drain their lanes), then the gateway."""
    for child in reversed(children):
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for child in reversed(children):
        try:
            child.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
