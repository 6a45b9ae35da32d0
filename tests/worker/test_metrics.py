"""The worker's own /metrics endpoint serves its counters, per-position acceptance included."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

from worker.redis_side.heartbeat import WorkerIdentity
from worker.redis_side.metrics import WorkerCollector, serve_metrics, stop_metrics
from worker.serving.handoff import WorkerCounters


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_metrics_endpoint_reads_live_counters():
    counters = WorkerCounters(tokens=7, drafts=3, accepted_tokens=4, accepted_by_position=[3, 1], redeliveries=2)
    counters.preemptions, counters.kv_blocks_used, counters.kv_blocks_total = 3, 40, 100
    counters.draft_length, counters.lanes_speculating, counters.step_lanes = 2, 5, 90
    identity = WorkerIdentity("w1", "tiny", "mtp", lanes_total=4, max_context=512, started_at=0.0)
    port = _free_port()
    server = serve_metrics(WorkerCollector(identity, counters, lambda: 1, lambda: 0.015), "127.0.0.1", port)
    try:
        counters.tokens += 5  # read at scrape time, not copied at start
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            body = response.read().decode()
    finally:
        stop_metrics(server)
    assert 'arbor_worker_generated_tokens_total{model="tiny",speculation="mtp"} 12.0' in body
    assert 'arbor_worker_spec_accepted_by_position_total{model="tiny",position="1",speculation="mtp"} 3.0' in body
    assert 'arbor_worker_spec_accepted_by_position_total{model="tiny",position="2",speculation="mtp"} 1.0' in body
    assert 'arbor_worker_redeliveries_total{model="tiny",speculation="mtp"} 2.0' in body
    assert 'arbor_worker_lanes_busy{model="tiny",speculation="mtp"} 1.0' in body
    assert 'arbor_worker_publish_interval_seconds{model="tiny",speculation="mtp"} 0.015' in body
    # the batched engine's decisions: memory, preemption, batch size and adaptive speculation
    assert 'arbor_worker_preemptions_total{model="tiny",speculation="mtp"} 3.0' in body
    assert 'arbor_worker_kv_blocks_used{model="tiny",speculation="mtp"} 40.0' in body
    assert 'arbor_worker_kv_blocks_total{model="tiny",speculation="mtp"} 100.0' in body
    assert 'arbor_worker_step_lanes_total{model="tiny",speculation="mtp"} 90.0' in body
    assert 'arbor_worker_spec_draft_length{model="tiny",speculation="mtp"} 2.0' in body
    assert 'arbor_worker_spec_lanes_drafting{model="tiny",speculation="mtp"} 5.0' in body


def test_the_metrics_port_answers_the_probes_readyz_following_the_worker() -> None:
    identity = WorkerIdentity("w1", "tiny", "mtp", lanes_total=4, max_context=512, started_at=0.0)
    state = {"ready": False}
    port = _free_port()
    server = serve_metrics(
        WorkerCollector(identity, WorkerCounters(), lambda: 0, lambda: 0.0), "127.0.0.1", port, lambda: state["ready"]
    )

    def status(path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code

    try:
        assert (status("/livez"), status("/readyz")) == (200, 503), "loading: alive, not ready"
        state["ready"] = True
        assert (status("/livez"), status("/readyz")) == (200, 200)
        assert status("/metrics") == 200
    finally:
        stop_metrics(server)
