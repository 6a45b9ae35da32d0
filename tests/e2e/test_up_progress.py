"""`arbor up` says what it is doing while it starts, and passes its settings on as given.

A real stack on a tiny model, the port given only as ARBOR_PORT (no --port) and the kernels as
`--kernels torch`: the stack must listen on that port, the worker must run the kernels asked
for (its log says so), the output must name each phase (loading, capacity, ready) and not carry
the gateway's access lines for `arbor up`'s own /health polls.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.live_stack import READY_LINE, STOP_TIMEOUT_S, free_loopback_port, spawn
from tests.support.tiny_models import make_tiny_model

START_TIMEOUT_S = 240.0  # two shared cores: importing torch can be slow


@pytest.mark.timeout(400)
def test_arbor_up_prints_its_phases_and_passes_kernels_and_arbor_port_on(tmp_path: Path) -> None:
    model_dir = make_tiny_model(tmp_path / "tiny-qwen3")
    port = free_loopback_port()
    env = {key: value for key, value in os.environ.items() if key not in ("REDIS_URL", "ARBOR_HOST")}
    env |= {"OMP_NUM_THREADS": "1", "ARBOR_PORT": str(port)}
    log = tmp_path / "up.log"
    up = spawn(["up", "--model", str(model_dir), "--speculation", "none", "--kernels", "torch"], env, log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while READY_LINE not in log.read_text(errors="replace"):
            assert up.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.2)
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(STOP_TIMEOUT_S)
    output = log.read_text(errors="replace")
    assert f"Arbor is up at http://127.0.0.1:{port}" in output, "ARBOR_PORT, not the default 8000"
    assert "linear kernels: torch kernels (aten): asked for" in output
    for phase in ("arbor up: embedded Redis up", "loading model", "loaded in", "capacity:", "arbor up: ready in"):
        assert phase in output, phase
    assert '"GET /health HTTP/1.1" 503' not in output, "arbor up's own polls stay out of its output"
