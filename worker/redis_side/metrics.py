"""The worker's own Prometheus endpoint (ARBOR_METRICS_PORT), scraped per replica.

Why both this and the gateway's heartbeat sums: the gateway's `/metrics` already exports fleet
totals read from heartbeats (enough for one-scrape dashboards), but per-position acceptance,
redeliveries and prefill-cache bytes are per-worker detail that would bloat every heartbeat, and
per-replica series let Prometheus (DNS discovery, see ops/deploy/prometheus) tell workers apart.
Everything is read from the owner thread's counters at scrape time; nothing is counted twice.

The same port answers an orchestrator's probes: GET /livez (200 while the process serves HTTP at
all) and GET /readyz (200 once the model is loaded and the worker reads its stream, 503 while it
loads or drains), so Kubernetes can tell a worker loading a model from one that is stuck.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer

from worker.redis_side.heartbeat import WorkerIdentity
from worker.serving.handoff import WorkerCounters


class WorkerCollector:
    def __init__(
        self,
        identity: WorkerIdentity,
        counters: WorkerCounters,
        lanes_busy: Callable[[], int],
        publish_interval_s: Callable[[], float] = lambda: 0.0,
    ):
        self.identity, self.counters, self.lanes_busy = identity, counters, lanes_busy
        self.publish_interval_s = publish_interval_s

    def collect(self) -> Iterator[Metric]:
        labels = ["model", "speculation"]
        values = [self.identity.model, self.identity.speculation]
        c = self.counters
        for name, doc, value in (
            ("arbor_worker_steps", "Scheduler steps (prefill chunks and decode cycles)", c.steps),
            ("arbor_worker_generated_tokens", "Tokens generated", c.tokens),
            ("arbor_worker_spec_drafts", "Draft-verify cycles with a non-empty draft", c.drafts),
            ("arbor_worker_spec_draft_tokens", "Draft tokens proposed", c.draft_tokens),
            ("arbor_worker_spec_accepted_tokens", "Draft tokens accepted", c.accepted_tokens),
            ("arbor_worker_prefix_cache_queries", "Prefill cache lookups", c.prefix_cache_queries),
            ("arbor_worker_prefix_cache_hits", "Prefill cache hits", c.prefix_cache_hits),
            ("arbor_worker_redeliveries", "Jobs reclaimed from a dead worker", c.redeliveries),
            ("arbor_worker_preemptions", "Lanes that gave their KV blocks back to resume later", c.preemptions),
            ("arbor_worker_step_lanes", "Lanes summed over steps (÷ steps: the mean batch)", c.step_lanes),
            ("arbor_worker_step_rows", "Rows summed over steps (÷ steps: the mean rows a forward)", c.step_rows),
        ):
            family = CounterMetricFamily(name, doc, labels=labels)
            family.add_metric(values, value)
            yield family
        yield from _by_source(labels, values, c)
        by_position = CounterMetricFamily(
            "arbor_worker_spec_accepted_by_position",
            "Drafts whose token at this position (1-based) was accepted",
            labels=[*labels, "position"],
        )
        for index, count in enumerate(list(c.accepted_by_position)):
            by_position.add_metric([*values, str(index + 1)], count)
        yield by_position
        yield _gauge(
            "arbor_worker_prefix_cache_bytes", "Bytes held by the prefill cache", labels, values, c.prefix_cache_bytes
        )
        yield _gauge("arbor_worker_lanes_busy", "Lanes serving a request", labels, values, self.lanes_busy())
        yield _gauge("arbor_worker_lanes_total", "Lanes", labels, values, self.identity.lanes_total)
        yield _gauge("arbor_worker_kv_blocks_used", "KV pool blocks held", labels, values, c.kv_blocks_used)
        yield _gauge("arbor_worker_kv_blocks_total", "KV pool blocks", labels, values, c.kv_blocks_total)
        yield from _capacity_gauges(c, labels, values)
        yield _gauge(
            "arbor_worker_spec_draft_length",
            "Draft tokens per lane adaptive speculation chose for the last decode step",
            labels,
            values,
            c.draft_length,
        )
        yield _gauge(
            "arbor_worker_spec_lanes_drafting",
            "Lanes of the last decode step that drafted",
            labels,
            values,
            c.lanes_speculating,
        )
        yield _gauge(
            "arbor_worker_publish_interval_seconds",
            "Least time between event batches while steps run (the configured interval, stretched "
            "by the publish budget)",
            labels,
            values,
            self.publish_interval_s(),
        )


_SOURCE_COUNTERS = (  # SourceCounts field -> metric; their sums over sources are the counters above
    ("drafts", "arbor_worker_spec_source_drafts", "Draft-verify cycles with a non-empty draft, by draft source"),
    ("draft_tokens", "arbor_worker_spec_source_draft_tokens", "Draft tokens proposed, by draft source"),
    ("accepted_tokens", "arbor_worker_spec_source_accepted_tokens", "Draft tokens accepted, by draft source"),
)


def _by_source(labels: list[str], values: list[str], counters: WorkerCounters) -> Iterator[Metric]:
    """The draft counters split by where each draft came from (the tree's `source`: mtp, ngram, ...)."""
    sources = sorted(dict(counters.by_source).items())  # a copy first: the owner thread may add a source
    for field, name, doc in _SOURCE_COUNTERS:
        family = CounterMetricFamily(name, doc, labels=[*labels, "source"])
        for source, counts in sources:
            family.add_metric([*values, source], getattr(counts, field))
        yield family


CAPACITY_GAUGES = (
    ("arbor_worker_kv_cache_bytes", "Bytes of the cache lanes' K/V and recurrent states share", "cache_bytes"),
    ("arbor_worker_kv_capacity_tokens", "Tokens of K/V the cache holds", "kv_tokens"),
    ("arbor_worker_kv_bytes_per_token", "K/V bytes a token takes (attention layers only)", "kv_bytes_per_token"),
    ("arbor_worker_state_bytes_per_lane", "Recurrent-state bytes a hybrid lane takes", "state_bytes_per_lane"),
    ("arbor_worker_state_capacity_lanes", "Lanes' recurrent states the cache holds", "state_lanes"),
    ("arbor_worker_weight_bytes", "Bytes of the model's weights, as held", "weight_bytes"),
    ("arbor_worker_max_context_tokens", "Tokens one lane may hold (prompt + output)", "context"),
    ("arbor_worker_max_context_lanes", "Lanes of the max context that fit together", "contexts"),
)


def _capacity_gauges(counters: WorkerCounters, labels: list[str], values: list[str]) -> Iterator[Metric]:
    """The capacity gate's figures, once the model is loaded."""
    capacity = counters.capacity
    if capacity is None:
        return
    for name, doc, field in CAPACITY_GAUGES:
        yield _gauge(name, doc, labels, values, getattr(capacity, field))


def _gauge(name: str, doc: str, labels: list[str], values: list[str], value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    family.add_metric(values, value)
    return family


def serve_metrics(
    collector: WorkerCollector, host: str, port: int, ready: Callable[[], bool] = lambda: True
) -> WSGIServer:
    """Start the endpoint (and the probes) on a daemon thread; returns the server (stop it with
    `stop_metrics`). `ready()` answers /readyz."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    metrics_app = make_wsgi_app(registry)
    probes = {"/livez": lambda: True, "/readyz": ready}

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        probe = probes.get(environ.get("PATH_INFO", ""))
        if probe is None:
            return metrics_app(environ, start_response)  # type: ignore[no-any-return]
        ok = probe()
        start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
        return [b"ok\n" if ok else b"unavailable\n"]

    server = make_server(host, port, app, ThreadingWSGIServer, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="arbor-metrics", daemon=True).start()
    return server


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # a scrape every few seconds is no news
        pass


def stop_metrics(server: WSGIServer) -> None:
    """Stop serving and close the listening socket (`shutdown` alone leaves it open)."""
    server.shutdown()
    server.server_close()
