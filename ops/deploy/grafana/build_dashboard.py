"""Writes ops/deploy/grafana/dashboards/arbor.json: `python -m ops.deploy.grafana.build_dashboard`.

The dashboard is generated so its panels stay uniform; the JSON is committed because Grafana
provisions it from disk. tests/ops check that every metric it queries is exported.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).parent / "dashboards" / "arbor.json"
Q = "histogram_quantile({q}, sum by (le) (rate({name}_bucket[5m])))"

# (row title, [(panel title, unit, [(legend, expr)])])
ROWS = [
    (
        "Queue",
        [
            ("Waiting jobs", "short", [("{{model}}", "sum by (model) (arbor_queue_waiting)")]),
            ("Pending jobs", "short", [("{{model}}", "sum by (model) (arbor_queue_pending)")]),
            ("Oldest job age", "s", [("{{model}}", "max by (model) (arbor_queue_oldest_age_seconds)")]),
            ("Rejections / s", "reqps", [("{{reason}}", "sum by (reason) (rate(arbor_rejections_total[1m]))")]),
            (
                "Redeliveries / s",
                "reqps",
                [("{{model}}", "sum by (model) (rate(arbor_worker_redeliveries_total[5m]))")],
            ),
            ("Dead letters", "short", [("dead letters", "arbor_dead_letters")]),
        ],
    ),
    (
        "Workers and requests",
        [
            (
                "Ready workers by model and mode",
                "short",
                [("{{model}} {{speculation}}", "sum by (model, speculation) (arbor_workers_ready)")],
            ),
            ("Lanes busy / total", "short", [("busy", "sum(arbor_lanes_busy)"), ("total", "sum(arbor_lanes_total)")]),
            ("Requests running", "short", [("running", "sum(arbor_requests_running)")]),
            (
                "Process restarts (arbor up) / h",
                "short",
                [("{{process}}", "sum by (process) (increase(arbor_process_restarts_total[1h]))")],
            ),
            ("Generated tokens / s", "short", [("tokens/s", "sum(rate(arbor_generation_tokens_total[1m]))")]),
        ],
    ),
    (
        "Latency",
        [
            (
                "Time to first token",
                "s",
                [
                    (f"p{p}", Q.format(q=q, name="arbor_time_to_first_token_seconds"))
                    for p, q in (("50", 0.5), ("90", 0.9), ("99", 0.99))
                ],
            ),
            (
                "Inter-token latency",
                "s",
                [
                    (f"p{p}", Q.format(q=q, name="arbor_inter_token_latency_seconds"))
                    for p, q in (("50", 0.5), ("90", 0.9), ("99", 0.99))
                ],
            ),
            (
                "End-to-end latency",
                "s",
                [
                    (f"p{p}", Q.format(q=q, name="arbor_e2e_request_latency_seconds"))
                    for p, q in (("50", 0.5), ("90", 0.9), ("99", 0.99))
                ],
            ),
            (
                "Queue time",
                "s",
                [
                    (f"p{p}", Q.format(q=q, name="arbor_request_queue_time_seconds"))
                    for p, q in (("50", 0.5), ("99", 0.99))
                ],
            ),
            (
                "Publish interval in force (chunk spacing)",
                "s",
                [("{{instance}}", "arbor_worker_publish_interval_seconds")],
            ),
        ],
    ),
    (
        "Speculation and cache",
        [
            (
                "Acceptance length by mode",
                "short",
                [
                    (
                        "{{speculation}}",
                        "1 + sum by (speculation) (rate(arbor_spec_accepted_tokens_total[5m]))"
                        " / sum by (speculation) (rate(arbor_spec_drafts_total[5m]))",
                    )
                ],
            ),
            (
                "Acceptance rate by draft position",
                "percentunit",
                [
                    (
                        "{{speculation}} position {{position}}",
                        "sum by (speculation, position) (rate(arbor_worker_spec_accepted_by_position_total[5m]))"
                        " / on (speculation) group_left sum by (speculation) (rate(arbor_worker_spec_drafts_total[5m]))",  # noqa: E501
                    )
                ],
            ),
            (
                "Prefill cache hit rate",
                "percentunit",
                [
                    (
                        "hit rate",
                        "sum(rate(arbor_prefix_cache_hits_total[5m])) / sum(rate(arbor_prefix_cache_queries_total[5m]))",  # noqa: E501
                    )
                ],
            ),
            ("Prefill cache bytes", "bytes", [("{{instance}}", "arbor_worker_prefix_cache_bytes")]),
        ],
    ),
    (
        "Placement and priority",
        [
            (
                "Placement decisions / s",
                "reqps",
                [("{{outcome}}", "sum by (outcome) (rate(arbor_placement_total[5m]))")],
            ),
            (
                "Prefill cache hit rate by worker",
                "percentunit",
                [
                    (
                        "{{worker}}",
                        "sum by (worker) (rate(arbor_worker_prefix_cache_hits_total[5m]))"
                        " / sum by (worker) (rate(arbor_worker_prefix_cache_queries_total[5m]))",
                    )
                ],
            ),
            (
                "Waiting by priority class",
                "short",
                [
                    ("stream p{{priority}}", "sum by (priority) (arbor_queue_waiting_by_class)"),
                    ("in workers p{{priority}}", "sum by (priority) (arbor_lanes_waiting_by_class)"),
                ],
            ),
            (
                "Time to first token p50 by class",
                "s",
                [
                    (
                        "p{{priority}}",
                        "histogram_quantile(0.5, sum by (le, priority)"
                        " (rate(arbor_time_to_first_token_by_class_seconds_bucket[5m])))",
                    )
                ],
            ),
            (
                "Preemptions / s by class",
                "short",
                [("p{{priority}}", "sum by (priority) (rate(arbor_preemptions_by_class_total[5m]))")],
            ),
        ],
    ),
]


def panel(panel_id: int, title: str, unit: str, targets: list[tuple[str, str]], x: int, y: int) -> dict:
    return {
        "id": panel_id,
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "arbor-prometheus"},
        "gridPos": {"h": 8, "w": 6, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {"refId": chr(65 + i), "expr": expr, "legendFormat": legend} for i, (legend, expr) in enumerate(targets)
        ],
    }


def dashboard() -> dict:
    panels, panel_id, y = [], 1, 0
    for row_title, row_panels in ROWS:
        panels.append(
            {
                "id": panel_id,
                "type": "row",
                "title": row_title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        panel_id, y = panel_id + 1, y + 1
        for i, (title, unit, targets) in enumerate(row_panels):
            panels.append(panel(panel_id, title, unit, targets, 6 * (i % 4), y + 8 * (i // 4)))
            panel_id += 1
        y += 8 * ((len(row_panels) + 3) // 4)
    return {
        "uid": "arbor-overview",
        "title": "Arbor",
        "schemaVersion": 39,
        "version": 1,
        "editable": False,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "tags": ["arbor"],
        "panels": panels,
    }


if __name__ == "__main__":
    OUT.write_text(json.dumps(dashboard(), indent=2) + "\n")
    print(f"wrote {OUT}")
