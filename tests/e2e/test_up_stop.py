"""`arbor up` stopped while it starts (the worker still importing torch or loading its model): a
clean stop, exit status 0, nothing left running. A big model takes minutes to load, and loading
cannot be interrupted, so neither `arbor up` nor the worker may wait for it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.live_stack import READY_LINE, STOP_TIMEOUT_S, free_loopback_port, spawn
from tests.support.tiny_models import make_tiny_model


def _children(pid: int) -> set[int]:
    return {int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.timeout(300)
def test_arbor_up_stopped_while_starting_exits_cleanly_and_leaves_nothing_running(tmp_path: Path) -> None:
    model_dir = make_tiny_model(tmp_path / "tiny-qwen3")
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"} | {"OMP_NUM_THREADS": "1"}
    log = tmp_path / "up.log"
    up = spawn(
        ["up", "--model", str(model_dir), "--speculation", "none", "--port", str(free_loopback_port())], env, log
    )
    try:
        deadline = time.monotonic() + 60
        while len(_children(up.pid)) < 3 and time.monotonic() < deadline:  # Redis, the gateway, a worker
            assert up.poll() is None, log.read_text()[-3000:]
            time.sleep(0.05)
        children = _children(up.pid)
        assert len(children) >= 3, log.read_text()[-3000:]
        up.send_signal(signal.SIGTERM)
        status = up.wait(STOP_TIMEOUT_S)
    finally:
        if up.poll() is None:
            up.kill()
    output = log.read_text(errors="replace")
    assert READY_LINE not in output, "stopped before it was up"
    assert status == 0, output[-3000:]
    assert not [pid for pid in children if _running(pid)], "every process it started is gone"
