"""Decode step costs kept on disk between starts, keyed by what they depend on.

Why: the probe (step_cost_probe.py) runs tens of decode steps; on a 2-vCPU machine under load it
took 30 s of a start-up that should take seconds. What a step costs depends on the model, its
weight format and kernels, the drafter and its draft limit, the threads and the CPU, so a table
measured once for that combination serves every later start. The table is a prior only: the
worker scales it online by the steps it really runs (step_costs.OnlineStepCosts), so a cached
table measured on a busier (or quieter) day costs nothing lasting.

A file per key, `step-costs-<sha256 of the key, 16 hex>.json`, in the kernels' cache folder
(worker/kernels/build.py's default_cache_dir); it holds the key itself, so a digest clash reads
as a miss. An unreadable or foreign file is a miss too: it is measured again and rewritten.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from worker.speculation.step_costs import StepCosts

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StepCostKey:
    model: str  # the served model's name, file path, size and modification time
    formats: str  # the weight formats and kernels path (weight_formats.LinearFormats)
    drafter: str  # speculation mode, drafter and the most draft tokens a lane verifies
    threads: int
    cpu: str  # the CPU's model name
    lane_counts: tuple[int, ...]  # where the probe measures

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def cache_path(folder: Path, key: StepCostKey) -> Path:
    return folder / f"step-costs-{key.digest()}.json"


def read_step_costs(folder: Path, key: StepCostKey) -> StepCosts | None:
    """The table cached for `key`, or None (no file, another key's, or unreadable)."""
    path = cache_path(folder, key)
    try:
        stored = json.loads(path.read_text())
        if stored["key"] != json.loads(json.dumps(asdict(key))):
            return None
        return StepCosts({(int(lanes), int(k)): float(seconds) for lanes, k, seconds in stored["seconds"]})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_step_costs(folder: Path, key: StepCostKey, costs: StepCosts) -> None:
    """Atomically (a reader never sees half a file); a folder that cannot be written only costs the
    next start a probe."""
    seconds = [[lanes, k, value] for (lanes, k), value in sorted(costs.seconds.items())]
    text = json.dumps({"key": asdict(key), "seconds": seconds})
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=".step-costs-")
        with os.fdopen(handle, "w") as file:
            file.write(text)
        os.replace(temporary, cache_path(folder, key))
    except OSError as error:
        logger.warning("step costs not cached in %s: %s", folder, error)


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name ("AMD EPYC 7B13"); "unknown" where the system does not say."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith(("model name", "Model", "Hardware")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def cached_or_measured(
    folder: Path | None, key: StepCostKey, measure: Callable[[], StepCosts | None]
) -> StepCosts | None:
    """The table cached for `key` in `folder`, else `measure()`'s, cached there for the next start
    if the probe ran to its end (None `folder`: measured every start, nothing written). A table the
    probe's time budget cut short serves this start only: the next one measures again."""
    if folder is not None:
        cached = read_step_costs(folder, key)
        if cached is not None:
            logger.info("step costs: read from %s (measured at an earlier start)", cache_path(folder, key))
            return cached
    lanes = " and ".join(str(count) for count in key.lane_counts)
    logger.info("step costs: measuring decode steps at %s lanes (kept for this model, drafter and CPU)", lanes)
    measured = measure()
    if measured is not None and not measured.complete:
        logger.info("step costs: the probe's time budget cut it short; the next start measures again")
    elif measured is not None and folder is not None:
        write_step_costs(folder, key, measured)
    return measured
