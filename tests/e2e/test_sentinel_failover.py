"""The whole stack on a Redis Sentinel set rides out failovers with nothing lost or repeated.

A real Sentinel set on loopback (tests/support/sentinel_set.py: one master, two replicas, three
sentinels; `min-replicas-to-write 1`) and a real `arbor up` on it (`REDIS_URL=redis+sentinel://`,
two workers on a tiny model, greedy, the prefill cache off, `ARBOR_REDIS_MIN_REPLICAS=1`). Three
rounds of 16 streaming requests, each disrupted once text flows on every stream:

1. the master gets SIGKILL (then it is started again and rejoins as a replica);
2. the new master gets SIGKILL: a second failover;
3. the master is frozen with SIGSTOP until the sentinels promote another, then resumed.

Every stream must end with the text the same request gets uninterrupted, and with 200 (no
request the gateway accepted is lost). Each round prints the write gap: how long a confirmed
write (RPUSH + WAIT 1) through the same URL kept failing.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from ops.bench.failover import GapProbe  # the benchmark's probe: one definition of the write gap
from tests.e2e.chat_stream import BackgroundStream
from tests.e2e.live_stack import READY_LINE, STOP_TIMEOUT_S, free_loopback_port, spawn
from tests.support.sentinel_set import Node, SentinelSet
from tests.support.tiny_models import make_tiny_model
from tests.support.waiting import wait_for

MODEL = "tiny-qwen3"
NUM_STREAMS = 16
MAX_TOKENS = 400  # long enough to still be streaming through a failover on 2 shared cores
START_TIMEOUT_S = 240.0
END_S = 240.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[SentinelSet]:
    with SentinelSet() as running:
        yield running


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, cluster: SentinelSet) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("sentinel-stack")
    model_dir = make_tiny_model(root / MODEL, max_position_embeddings=4096)
    port = free_loopback_port()
    env = dict(os.environ) | {
        "REDIS_URL": cluster.url,
        "ARBOR_REDIS_MIN_REPLICAS": "1",
        "OMP_NUM_THREADS": "1",
        "XDG_RUNTIME_DIR": str(root / "run"),
        "ARBOR_PREFILL_CACHE_BYTES": "0",
        "ARBOR_MAX_CONTEXT": "4096",
    }
    log = root / "up.log"
    argv = ["up", "--model", str(model_dir), "--speculation", "ngram", "--port", str(port), "--workers", "2"]
    process = spawn(argv, env, log)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: READY_LINE in log.read_text() or process.poll() is not None, START_TIMEOUT_S, "arbor up")
        assert process.poll() is None, log.read_text()[-3000:]
        wait_for(lambda: _num_ready_workers(base_url) == 2, START_TIMEOUT_S, "both workers ready")
        yield base_url, log
    finally:
        _stop(process, log)


def _all_streaming(streams: list[BackgroundStream]) -> bool:
    """Every stream has text, or one of them failed (then the caller says which, at once)."""
    failed = any(s.status not in (None, 200) or s.failure is not None for s in streams)
    return failed or all(s.stream.num_chunks >= 2 for s in streams)


def _num_ready_workers(base_url: str) -> int:
    try:
        return sum(worker["ready"] for worker in httpx.get(f"{base_url}/health", timeout=5).json()["workers"])
    except (httpx.HTTPError, ValueError, KeyError):
        return 0


def _stop(process: subprocess.Popen, log: Path) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        status = process.wait(STOP_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
    assert status == 0, log.read_text()[-3000:]


def bodies() -> list[dict]:
    return [
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"Tale {number}: the river and the sentinel."}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
        }
        for number in range(NUM_STREAMS)
    ]


def answers(base_url: str) -> list[str]:
    def one(body: dict) -> str:
        response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=END_S)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["message"]["content"]

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(one, bodies()))


def sigkill(cluster: SentinelSet) -> Callable[[], None]:
    old = cluster.kill_master()

    def recover() -> None:
        cluster.wait_for_new_master(old)
        cluster.restart(old)

    return recover


def sigstop(cluster: SentinelSet) -> Callable[[], None]:
    frozen: Node = cluster.master()
    assert frozen.process is not None
    os.kill(frozen.process.pid, signal.SIGSTOP)

    def recover() -> None:
        try:
            cluster.wait_for_new_master(frozen)
        finally:
            os.kill(frozen.process.pid, signal.SIGCONT)  # type: ignore[union-attr]
        cluster.wait_for_replicas(2)

    return recover


# slow, out of the default run: its second SIGKILL failover has now and then seen no master
# elected within 60 s on a loaded 2-core machine (ops/launch/sentinel_set.py's harness or the sentinels'
# timing, not yet found); run it with -m slow
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_streams_survive_two_sigkill_failovers_and_a_frozen_master(
    stack: tuple[str, Path], cluster: SentinelSet
) -> None:
    base_url, log = stack
    gaps = {}
    outcomes = {}
    for name, disrupt in [("sigkill", sigkill), ("second sigkill", sigkill), ("sigstop", sigstop)]:
        cluster.wait_for_replicas(2)  # in sync before the round: a request needs a replica to confirm it
        streams = [BackgroundStream(base_url, body, END_S) for body in bodies()]
        for stream in streams:
            stream.start()
        wait_for(lambda s=streams: _all_streaming(s), END_S, "text on every stream")
        refused = [(s.status, s.stream.error, s.failure) for s in streams if s.status not in (None, 200) or s.failure]
        assert not refused, (name, refused)
        probe = GapProbe(cluster.url)
        probe.start()
        recover = disrupt(cluster)
        unfinished = sum(s.stream.finish_reason is None for s in streams)
        recover()
        finished = [s.finish(END_S) for s in streams]
        gaps[name] = probe.stop()
        assert [s.status for s in streams] == [200] * NUM_STREAMS, (name, [s.stream.error for s in streams])
        assert all(f.complete for f in finished), (name, [f.error for f in finished], log.read_text()[-3000:])
        assert unfinished >= NUM_STREAMS // 2, f"{name}: only {unfinished} streams were running at the failover"
        outcomes[name] = [f.text for f in finished]
        cluster.wait_for_replicas(2)
    expected = answers(base_url)
    for name, texts in outcomes.items():
        assert texts == expected, f"{name}: a stream lost or repeated text"
    print("write gap (s): " + ", ".join(f"{name} {gap:.2f}" for name, gap in gaps.items()))
