"""Placement and priority-class families of /metrics, from the fleet snapshot read at scrape time.

arbor_placement_total{model,outcome}                 routed (offered to the prefix's worker),
                                                     shared (no worker held a prefix with a lane
                                                     free), moved (an offer left unread for the
                                                     offer wait, taken back)
arbor_queue_waiting_by_class{model,priority}         jobs no worker has read, per class stream
arbor_queue_pending_by_class{model,priority}         read, not acknowledged
arbor_lanes_waiting_by_class{model,priority}         accepted by workers, waiting in their schedulers
arbor_preemptions_by_class_total{model,priority}     lanes preempted (summed over live workers)
arbor_worker_prefix_cache_hits_total{model,worker}   per worker, for its hit rate
arbor_worker_prefix_cache_queries_total{model,worker}
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from shared.fleet import FleetSnapshot


def class_families(snap: FleetSnapshot) -> Iterator[Metric]:
    yield _placements(snap)
    yield from _class_queues(snap)
    yield from _worker_classes(snap)
    yield from _worker_prefix_cache(snap)


def _placements(snap: FleetSnapshot) -> Metric:
    family = CounterMetricFamily("arbor_placement", "Placement decisions by outcome", labels=["model", "outcome"])
    for model, counts in sorted(snap.placements.items()):
        for outcome, count in sorted(counts.items()):
            family.add_metric([model, outcome], count)
    return family


def _class_queues(snap: FleetSnapshot) -> Iterator[Metric]:
    labels = ["model", "priority"]
    waiting = GaugeMetricFamily("arbor_queue_waiting_by_class", "Jobs no worker has read, by class", labels=labels)
    pending = GaugeMetricFamily(
        "arbor_queue_pending_by_class", "Jobs read but not acknowledged, by class", labels=labels
    )
    for model, by_class in sorted(snap.class_queues.items()):
        for priority, stats in sorted(by_class.items()):
            waiting.add_metric([model, str(priority)], stats.waiting)
            pending.add_metric([model, str(priority)], stats.pending)
    yield waiting
    yield pending


def _worker_classes(snap: FleetSnapshot) -> Iterator[Metric]:
    """Every class with a stream gets a sample (0 when no worker reports it), so the series exist."""
    labels = ["model", "priority"]
    waiting = GaugeMetricFamily("arbor_lanes_waiting_by_class", "Lanes waiting in workers, by class", labels=labels)
    preempted = CounterMetricFamily("arbor_preemptions_by_class", "Lanes preempted, by class", labels=labels)
    waiting_sums = {(model, p): 0 for model, by_class in snap.class_queues.items() for p in by_class}
    preempted_sums = dict(waiting_sums)
    for beat in snap.workers:
        for priority, count in beat.waiting_by_class.items():
            waiting_sums[beat.model, priority] = waiting_sums.get((beat.model, priority), 0) + count
        for priority, count in beat.preemptions_by_class.items():
            preempted_sums[beat.model, priority] = preempted_sums.get((beat.model, priority), 0) + count
    for (model, priority), count in sorted(waiting_sums.items()):
        waiting.add_metric([model, str(priority)], count)
    for (model, priority), count in sorted(preempted_sums.items()):
        preempted.add_metric([model, str(priority)], count)
    yield waiting
    yield preempted


def _worker_prefix_cache(snap: FleetSnapshot) -> Iterator[Metric]:
    labels = ["model", "worker"]
    hits = CounterMetricFamily("arbor_worker_prefix_cache_hits", "Prefill cache hits, per worker", labels=labels)
    queries = CounterMetricFamily(
        "arbor_worker_prefix_cache_queries", "Prefill cache lookups, per worker", labels=labels
    )
    for beat in sorted(snap.workers, key=lambda beat: beat.worker_id):
        hits.add_metric([beat.model, beat.worker_id], beat.prefix_cache_hits)
        queries.add_metric([beat.model, beat.worker_id], beat.prefix_cache_queries)
    yield hits
    yield queries
