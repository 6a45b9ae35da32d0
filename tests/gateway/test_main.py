"""`python -m gateway` reads its settings from the environment, serves, and stops cleanly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx

from tests.gateway.conftest import MODEL
from tests.gateway.protocol_peer import ProtocolPeer
from tests.support.redis_server import RedisServer


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_answer(url: str, process: subprocess.Popen, timeout_s: float = 20) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while True:
        assert process.poll() is None, process.communicate()[1]
        try:
            return httpx.get(url, timeout=1)
        except httpx.TransportError:
            assert time.monotonic() < deadline, "gateway never answered"
            time.sleep(0.1)


def test_gateway_process_serves_with_env_settings(redis_server: RedisServer, redis_client) -> None:
    port = _free_port()
    env = os.environ | {"REDIS_URL": redis_server.url, "ARBOR_PORT": str(port), "ARBOR_API_KEYS": "secret"}
    env["ARBOR_LOG_LEVEL"] = "warning"
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    peer = ProtocolPeer(redis_server.url, model=MODEL).start()
    try:
        base = f"http://127.0.0.1:{port}"
        assert _wait_for_answer(f"{base}/health", process).status_code == 200
        assert httpx.get(f"{base}/v1/models", timeout=5).status_code == 401  # the key came from the env
        models = httpx.get(f"{base}/v1/models", headers={"authorization": "Bearer secret"}, timeout=5)
        assert [m["id"] for m in models.json()["data"]] == [MODEL]
    finally:
        peer.stop()
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=20)

    assert process.returncode == 0, stderr
