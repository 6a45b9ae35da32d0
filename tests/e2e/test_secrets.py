"""No secret in logs or replies: the API key and the Redis password never leave the process.

`arbor up` (the gateway and one worker are its children and write to its output) runs with an API
key and against a redis-server that requires a password, given as a deployment gives it: inside
REDIS_URL. The stack is driven through its normal paths and its failure paths — no key, a wrong
key, bad input, a prompt over the context, Redis going away and coming back — at log level debug,
then stopped; the gateway and a worker are also started once with settings that do not validate
(the CLI prints that error). No piece of either secret may appear in any of that output, nor in a
reply body (/health, /metrics, error envelopes).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ops.launch.embedded_redis import EmbeddedRedis
from tests.e2e.live_stack import READY_LINE, REPO_ROOT, START_TIMEOUT_S, STOP_TIMEOUT_S, free_loopback_port, spawn
from tests.support.tiny_models import make_tiny_model

CONTEXT = 512
NON_HEX = "ghijkmnpqrstuvwxyz"  # request and worker ids are hex: a secret made of these cannot match them
PIECE = 8  # pydantic, for one, echoes inputs cut short: look for every piece this long


def _secret() -> str:
    return "".join(secrets.choice(NON_HEX) for _ in range(24))


def _leaked_pieces(text: str, secret: str) -> list[str]:
    return sorted({secret[i : i + PIECE] for i in range(len(secret) - PIECE + 1) if secret[i : i + PIECE] in text})


@pytest.mark.timeout(600)
def test_neither_the_api_key_nor_the_redis_password_is_ever_echoed(tmp_path: Path) -> None:
    api_key, password = f"sk-{_secret()}", _secret()
    model_dir = make_tiny_model(tmp_path / "tiny-qwen3", max_position_embeddings=CONTEXT)
    redis_server = EmbeddedRedis(tcp=True, password=password).start()
    assert password in redis_server.url
    port = free_loopback_port()
    env = dict(
        os.environ,
        REDIS_URL=redis_server.url,
        ARBOR_API_KEYS=api_key,
        ARBOR_LOG_LEVEL="debug",
        OMP_NUM_THREADS="1",
        ARBOR_HEARTBEAT_INTERVAL_S="0.5",
    )
    up_log = tmp_path / "up.log"
    up = spawn(["up", "--model", str(model_dir), "--speculation", "none", "--port", str(port)], env, up_log)
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", up, up_log)
        replies = _drive(f"http://127.0.0.1:{port}", api_key, redis_server)
    finally:
        up.send_signal(signal.SIGTERM)
        up_status = up.wait(STOP_TIMEOUT_S)
        redis_server.stop()
    outputs = {
        "arbor up, gateway and worker": up_log.read_text(errors="replace"),
        "gateway with bad settings": _refused(["gateway"], env | {"ARBOR_DEFAULT_MAX_TOKENS": "99999"}),
        "gateway with bad settings, no REDIS_URL": _refused(
            ["gateway"], {k: v for k, v in env.items() if k != "REDIS_URL"} | {"ARBOR_DEFAULT_MAX_TOKENS": "99999"}
        ),
        "worker with bad settings": _refused(
            ["worker", "--model", str(model_dir)], env | {"ARBOR_HEARTBEAT_TTL_S": "0.1"}
        ),
        "replies": "\n".join(replies),
    }

    assert up_status == 0, outputs["arbor up, gateway and worker"][-3000:]
    assert READY_LINE in outputs["arbor up, gateway and worker"]
    assert "redis unavailable" in outputs["arbor up, gateway and worker"], "the outage was logged"
    for name, text in outputs.items():
        assert _leaked_pieces(text, api_key) == [], f"the API key leaks into {name}"
        assert _leaked_pieces(text, password) == [], f"the Redis password leaks into {name}"


def _wait_healthy(base_url: str, up: subprocess.Popen, up_log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert up.poll() is None, up_log.read_text()[-3000:]
        if READY_LINE in up_log.read_text() and _status(base_url) == 200:
            return
        time.sleep(0.3)
    raise AssertionError(f"arbor up did not get healthy\n{up_log.read_text()[-3000:]}")


def _status(base_url: str) -> int | None:
    try:
        return httpx.get(f"{base_url}/health", timeout=5).status_code
    except httpx.HTTPError:
        return None


def _drive(base_url: str, api_key: str, redis_server: EmbeddedRedis) -> list[str]:
    """Every path worth a log line or an error body; the reply bodies."""
    chat = {"model": "tiny-qwen3", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}
    auth = {"authorization": f"Bearer {api_key}"}
    replies: list[str] = []
    with httpx.Client(base_url=base_url, timeout=60) as http:

        def expect(status: int | None, method: str, path: str, **kwargs) -> None:
            response = http.request(method, path, **kwargs)
            assert status is None or response.status_code == status, (path, response.text)
            replies.append(response.text)

        expect(200, "POST", "/v1/chat/completions", json=chat, headers=auth)
        expect(200, "POST", "/v1/chat/completions", json=chat | {"stream": True}, headers=auth)
        expect(200, "GET", "/v1/models", headers=auth)
        expect(401, "POST", "/v1/chat/completions", json=chat)
        expect(401, "POST", "/v1/chat/completions", json=chat, headers={"authorization": f"Bearer {api_key}x"})
        expect(400, "POST", "/v1/chat/completions", content=b"{", headers=auth)
        expect(404, "POST", "/v1/chat/completions", json=chat | {"model": "no-such-model"}, headers=auth)
        too_long = chat | {"messages": [{"role": "user", "content": "apples pears plums " * CONTEXT}]}
        expect(400, "POST", "/v1/chat/completions", json=too_long, headers=auth)  # refused by the worker
        expect(200, "GET", "/health")
        expect(200, "GET", "/metrics")

        redis_server.stop()
        expect(503, "POST", "/v1/chat/completions", json=chat, headers=auth)
        expect(503, "GET", "/health")
        expect(None, "GET", "/metrics")
        time.sleep(1.5)  # every worker loop meets the outage and logs its retries
        redis_server.start()  # same port, same password, no data
        deadline = time.monotonic() + START_TIMEOUT_S
        while _status(base_url) != 200:
            assert time.monotonic() < deadline, "the stack did not recover from the Redis restart"
            time.sleep(0.3)
        expect(200, "POST", "/v1/chat/completions", json=chat, headers=auth)
    return replies


def _refused(argv: list[str], env: dict[str, str]) -> str:
    """The output of an `arbor` command that must refuse its settings."""
    result = subprocess.run(
        [sys.executable, "-m", "ops.cli", *argv],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=STOP_TIMEOUT_S,
    )
    assert result.returncode == 2 and "arbor: error" in result.stderr, result.stderr[-2000:]
    return result.stdout + result.stderr
