"""Prometheus metrics, one registry per app. All names start with `arbor_`.

Measured here, per request:
    arbor_http_requests_total{route,status}          every HTTP response
    arbor_rejections_total{reason}                    refused requests; reason = error code
    arbor_request_success_total{finish_reason}        finished choices
    arbor_request_failures_total{code}                accepted requests that ended in an error
    arbor_requests_running                            generations in flight in this gateway
    arbor_prompt_tokens_total, arbor_generation_tokens_total
    arbor_time_to_first_token_seconds                 arrival -> first delta
    arbor_time_to_first_token_by_class_seconds{priority}  the same, by priority class
    arbor_inter_token_latency_seconds                 between deltas (one delta may carry
                                                      several tokens under speculation)
    arbor_e2e_request_latency_seconds                 arrival -> last event
    arbor_request_queue_time_seconds                  from the final event's stats.queue_s
    arbor_event_repairs_total                         events recovered from the event log
    arbor_ignored_request_fields_total{route,field}   requests carrying an unknown field, ignored
                                                      (field: its path, list indices as `*`)
Read from Redis at scrape time (`fleet.FleetSnapshot`), labelled by model (and mode):
    arbor_redis_up, arbor_queue_waiting, arbor_queue_pending, arbor_queue_oldest_age_seconds,
    arbor_dead_letters, arbor_workers_live, arbor_workers_ready, arbor_lanes_total,
    arbor_lanes_busy, arbor_kv_capacity_tokens, arbor_max_context_lanes (the capacity gate's),
    and counters summed over live heartbeats: arbor_worker_steps_total,
    arbor_worker_tokens_total, arbor_spec_drafts_total, arbor_spec_draft_tokens_total,
    arbor_spec_accepted_tokens_total, arbor_prefix_cache_hits_total,
    arbor_prefix_cache_queries_total, and the draft counters by draft source (label `source`:
    mtp, ngram, ...): arbor_spec_source_drafts_total, arbor_spec_source_draft_tokens_total,
    arbor_spec_source_accepted_tokens_total. (A worker that dies takes its totals with it; Prometheus
    reads the drop as a counter reset.) Acceptance length = 1 + accepted_tokens / drafts.
    Placement and priority classes: see `gateway.class_metrics`.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.class_metrics import class_families
from shared.fleet import FleetSnapshot
from shared.heartbeat import Heartbeat

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)
GAP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.4, 0.8, 1.6, 5, 20)

_WORKER_COUNTERS = {  # heartbeat field -> metric name (summed over live workers)
    "steps": ("arbor_worker_steps", "Scheduler steps"),
    "tokens": ("arbor_worker_tokens", "Tokens generated"),
    "drafts": ("arbor_spec_drafts", "Speculative draft-verify cycles"),
    "draft_tokens": ("arbor_spec_draft_tokens", "Tokens proposed by drafters"),
    "accepted_tokens": ("arbor_spec_accepted_tokens", "Draft tokens accepted by the target"),
    "prefix_cache_hits": ("arbor_prefix_cache_hits", "Paired prefill cache hits"),
    "prefix_cache_queries": ("arbor_prefix_cache_queries", "Paired prefill cache lookups"),
}


_SOURCE_COUNTERS = {  # heartbeat draft_sources field -> metric name (summed over live workers)
    "drafts": ("arbor_spec_source_drafts", "Speculative draft-verify cycles, by draft source"),
    "draft_tokens": ("arbor_spec_source_draft_tokens", "Tokens proposed, by draft source"),
    "accepted_tokens": ("arbor_spec_source_accepted_tokens", "Draft tokens accepted, by draft source"),
}


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.http_requests = Counter("arbor_http_requests", "HTTP responses", ["route", "status"], registry=r)
        self.rejections = Counter("arbor_rejections", "Refused requests by reason", ["reason"], registry=r)
        self.success = Counter("arbor_request_success", "Finished choices", ["finish_reason"], registry=r)
        self.running = Gauge("arbor_requests_running", "Generations in flight", registry=r)
        self.prompt_tokens = Counter("arbor_prompt_tokens", "Prompt tokens", registry=r)
        self.generation_tokens = Counter("arbor_generation_tokens", "Generated tokens", registry=r)
        self.ttft = Histogram(
            "arbor_time_to_first_token_seconds",
            "Arrival to first delta",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.ttft_by_class = Histogram(
            "arbor_time_to_first_token_by_class_seconds",
            "Arrival to first delta, by priority class",
            ["priority"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.inter_token = Histogram(
            "arbor_inter_token_latency_seconds", "Time between deltas", buckets=GAP_BUCKETS_S, registry=r
        )
        self.e2e = Histogram(
            "arbor_e2e_request_latency_seconds",
            "Arrival to last event",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.queue_time = Histogram(
            "arbor_request_queue_time_seconds",
            "Enqueue to worker pick-up",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.failures = Counter(
            "arbor_request_failures", "Accepted requests that ended in an error", ["code"], registry=r
        )
        self.event_repairs = Counter("arbor_event_repairs", "Events recovered from the event log", registry=r)
        self.ignored_fields = Counter(
            "arbor_ignored_request_fields",
            "Requests carrying an unknown field, ignored",
            ["route", "field"],
            registry=r,
        )
        self.fleet = FleetCollector()
        r.register(self.fleet)


class FleetCollector(Collector):
    """Exposes the latest `FleetSnapshot`; the /metrics route refreshes it before each scrape."""

    def __init__(self) -> None:
        self.snapshot = FleetSnapshot(redis_up=False, workers=[], queues={}, dead_letters=0, restarts={})

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot
        yield GaugeMetricFamily("arbor_redis_up", "Whether Redis answered the last scrape", value=int(snap.redis_up))
        yield GaugeMetricFamily("arbor_dead_letters", "Entries in the dead-letter stream", value=snap.dead_letters)
        yield from _queue_gauges(snap)
        yield from _worker_gauges(snap)
        yield from _worker_counters(snap)
        yield _restart_counter(snap)
        yield from class_families(snap)

    def describe(self) -> Iterator[Metric]:
        return iter(())  # dynamic: described by collect() at scrape time


def _queue_gauges(snap: FleetSnapshot) -> Iterator[Metric]:
    families = {
        "waiting": GaugeMetricFamily("arbor_queue_waiting", "Jobs no worker has read", labels=["model"]),
        "pending": GaugeMetricFamily("arbor_queue_pending", "Jobs read but not acknowledged", labels=["model"]),
        "oldest_age_s": GaugeMetricFamily(
            "arbor_queue_oldest_age_seconds", "Age of the oldest waiting or pending job", labels=["model"]
        ),
    }
    for model, stats in sorted(snap.queues.items()):
        for field, family in families.items():
            family.add_metric([model], getattr(stats, field))
    yield from families.values()


def _worker_gauges(snap: FleetSnapshot) -> Iterator[Metric]:
    labels = ["model", "speculation"]
    families = {
        "live": GaugeMetricFamily("arbor_workers_live", "Workers with a current heartbeat", labels=labels),
        "ready": GaugeMetricFamily("arbor_workers_ready", "Live workers reading their stream", labels=labels),
        "lanes_total": GaugeMetricFamily("arbor_lanes_total", "Lanes (request slots)", labels=labels),
        "lanes_busy": GaugeMetricFamily("arbor_lanes_busy", "Lanes serving a request", labels=labels),
        "kv_tokens": GaugeMetricFamily(
            "arbor_kv_capacity_tokens", "Tokens of K/V the workers' caches hold", labels=labels
        ),
        "max_context_lanes": GaugeMetricFamily(
            "arbor_max_context_lanes", "Lanes of their max context the workers' caches hold together", labels=labels
        ),
    }
    for (model, mode), group in sorted(snap.by_model_and_mode().items()):
        families["live"].add_metric([model, mode], len(group))
        families["ready"].add_metric([model, mode], sum(beat.ready for beat in group))
        families["lanes_total"].add_metric([model, mode], sum(beat.lanes_total for beat in group))
        families["lanes_busy"].add_metric([model, mode], sum(beat.lanes_busy for beat in group))
        families["kv_tokens"].add_metric([model, mode], sum(beat.kv_tokens for beat in group))
        families["max_context_lanes"].add_metric([model, mode], sum(beat.max_context_lanes for beat in group))
    yield from families.values()


def _worker_counters(snap: FleetSnapshot) -> Iterator[Metric]:
    groups = sorted(snap.by_model_and_mode().items())
    for field, (name, doc) in _WORKER_COUNTERS.items():
        family = CounterMetricFamily(name, doc, labels=["model", "speculation"])
        for (model, mode), group in groups:
            family.add_metric([model, mode], sum(getattr(beat, field) for beat in group))
        yield family
    yield from _source_counters(groups)


def _source_counters(groups: list[tuple[tuple[str, str], list[Heartbeat]]]) -> Iterator[Metric]:
    for field, (name, doc) in _SOURCE_COUNTERS.items():
        family = CounterMetricFamily(name, doc, labels=["model", "speculation", "source"])
        for (model, mode), group in groups:
            sources = sorted({source for beat in group for source in beat.draft_sources})
            for source in sources:
                total = sum(beat.draft_sources.get(source, {}).get(field, 0) for beat in group)
                family.add_metric([model, mode, source], total)
        yield family


def _restart_counter(snap: FleetSnapshot) -> Metric:
    family = CounterMetricFamily(
        "arbor_process_restarts", "Processes `arbor up` restarted after they died", labels=["process"]
    )
    for name, count in sorted(snap.restarts.items()):
        family.add_metric([name], count)
    return family
