"""Where a benchmark's files go and what every report carries: the machine, percentiles, tables."""

from __future__ import annotations

import json
import math
import os
import platform
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

RESULTS_ROOT = Path("bench-results")
BOOTSTRAP_RESAMPLES = 2000  # for a median's interval
SIDE_BY_SIDE_NOTE = (
    "contenders are interleaved in one run (each prompt or request goes to every contender in "
    "turn), so load from other jobs on the machine hits them alike: trust the ratios more than "
    "the absolute rates"
)


def results_dir(out: str | Path | None) -> Path:
    """`out`, or bench-results/<timestamp>/ (git-ignored); created."""
    folder = Path(out) if out else RESULTS_ROOT / time.strftime("%Y%m%d-%H%M%S")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def machine_info() -> dict:
    return {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between closest ranks like numpy's default; None if empty.

    Example: [10, 20, 30, 40] -> p50 = 25.0, p99 = 39.7.
    """
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def median_with_interval(values: Sequence[float]) -> dict | None:
    """The median, and a 95% bootstrap interval of it (seeded: a report reproduces exactly)."""
    if not values:
        return None
    values = sorted(values)  # the interval then depends on the values only, not on their order
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(BOOTSTRAP_RESAMPLES))
    return {
        "median": round(statistics.median(values), 4),
        "pairs": len(values),
        "ci95": [round(medians[int(0.025 * len(medians))], 4), round(medians[int(0.975 * len(medians)) - 1], 4)],
    }


def fmt(value: float | None, digits: int = 1, suffix: str = "") -> str:
    return "—" if value is None else f"{value:.{digits}f}{suffix}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def cpu_model() -> str:
    """The CPU's model name as Linux reports it ("" elsewhere): say which CPU a figure came from."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def parse_int_list(text: str, flag: str) -> list[int]:
    """ "1,4,16" -> [1, 4, 16]; ValueError naming the flag for anything else."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{flag}={text!r} must be comma-separated integers, e.g. 1,4,16") from None
    if not values or any(value < 1 for value in values):
        raise ValueError(f"{flag}={text!r} must list integers of at least 1")
    return values
