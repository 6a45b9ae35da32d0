"""`arbor top` shows priority classes, placement decisions and each worker's prefix hit rate."""

from __future__ import annotations

from rich.console import Console

from ops.top import render
from shared.fleet import FleetSnapshot
from shared.heartbeat import Heartbeat
from shared.queue_stats import QueueStats


def test_a_frame_shows_classes_placement_and_hit_rates():
    beat = Heartbeat(
        worker_id="w-1",
        model="m",
        speculation="none",
        ready=True,
        lanes_total=4,
        lanes_busy=4,
        prefix_cache_hits=3,
        prefix_cache_queries=4,
        waiting_by_class={10: 2},
        preemptions_by_class={10: 5},
        started_at=0.0,
        beat_at=100.0,
    )
    fleet = FleetSnapshot(
        redis_up=True,
        workers=[beat],
        queues={"m": QueueStats(7, 4, 1.0)},
        dead_letters=0,
        restarts={},
        class_queues={"m": {0: QueueStats(1, 1, 0.5), 10: QueueStats(6, 3, 1.0)}},
        placements={"m": {"routed": 9, "shared": 2, "moved": 1}},
    )
    console = Console(record=True, width=200)
    console.print(render((100.0, fleet), None))
    text = console.export_text()
    row_10 = next(line for line in text.splitlines() if "│ 10 " in line or " 10 │" in line)
    assert [cell.strip() for cell in row_10.split("│") if cell.strip()] == ["m", "10", "6", "3", "2", "5"]
    assert "placement: m: routed 9, shared 2, taken back 1" in text
    assert "3/4 (75%)" in text
