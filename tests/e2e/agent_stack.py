"""A stack for replaying recorded agent traffic: real Redis, `arbor up` serving the scripted
model (tests/support/scripted_model.py: real tool calls, any context length) under every model
name the fixtures send, and a second gateway on the same Redis with strict request fields, so
the two gateways differ in that one setting.

    redis-server
    python -m ops.cli up --model <scripted, 131072 positions> --served-model-name scripted,<names> --port P
    python -m ops.cli gateway --port S   (ARBOR_STRICT_REQUEST_FIELDS=1)
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.e2e.live_stack import READY_LINE, START_TIMEOUT_S, free_loopback_port, spawn, stop
from tests.support.redis_server import RedisServer
from tests.support.scripted_model import make_scripted_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "agent_traffic"
# Claude Code's system prompt and tools are ~60 KB, ~30K tokens of the tiny tokenizer
REPLAY_CONTEXT = 131072
STRICT_SETTING = "ARBOR_STRICT_REQUEST_FIELDS"


@dataclass(frozen=True, slots=True)
class AgentStack:
    base_url: str  # unknown fields ignored (the default)
    strict_url: str  # unknown fields refused
    log_dir: Path

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.read_text()[-3000:]}" for p in sorted(self.log_dir.glob("*.log")))


def fixture_paths() -> list[Path]:
    return sorted(FIXTURES.glob("*/*.json"))


def fixture_model_names() -> list[str]:
    bodies = [json.loads(path.read_text())["body"] for path in fixture_paths()]
    return sorted({body["model"] for body in bodies if isinstance(body, dict) and "model" in body})


@contextmanager
def agent_stack(models_dir: Path, log_dir: Path) -> Iterator[AgentStack]:
    model = make_scripted_model(models_dir / "scripted", max_position_embeddings=REPLAY_CONTEXT)
    names = ",".join(["scripted", *fixture_model_names()])
    port, strict_port = free_loopback_port(), free_loopback_port()
    with RedisServer() as redis_server:
        env = dict(os.environ, REDIS_URL=redis_server.url, OMP_NUM_THREADS="1", ARBOR_LOG_LEVEL="warning")
        env.pop("ARBOR_API_KEYS", None)
        env.pop(STRICT_SETTING, None)
        strict = {STRICT_SETTING: "1"}
        up = ["up", "--model", str(model), "--served-model-name", names, "--speculation", "none"]
        processes = {
            "up": spawn([*up, "--port", str(port), "--workers", "1"], env, log_dir / "up.log"),
            "strict": spawn(["gateway", "--port", str(strict_port)], env | strict, log_dir / "strict.log"),
        }
        stack = AgentStack(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{strict_port}", log_dir)
        try:
            _wait_until_serving(stack, processes)
            yield stack
        finally:
            statuses = stop(processes)
        # a lone `arbor gateway` ends by the signal, as in tests/e2e/test_faults.py
        assert statuses == {"up": 0, "strict": -signal.SIGTERM}, f"unclean exit: {statuses}\n{stack.logs()}"


def _wait_until_serving(stack: AgentStack, processes: dict) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    with httpx.Client(timeout=5) as client:
        while time.monotonic() < deadline:
            for name, process in processes.items():
                assert process.poll() is None, f"{name} exited with {process.returncode}\n{stack.logs()}"
            if READY_LINE in (stack.log_dir / "up.log").read_text() and all(
                _healthy(client, url) for url in (stack.base_url, stack.strict_url)
            ):
                return
            time.sleep(0.5)
    raise AssertionError(f"the replay stack did not serve within {START_TIMEOUT_S} s\n{stack.logs()}")


def _healthy(client: httpx.Client, base_url: str) -> bool:
    try:
        return client.get(f"{base_url}/health").status_code == 200
    except httpx.HTTPError:
        return False
