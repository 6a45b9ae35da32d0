"""The goals of `arbor bench serving`, per mode: how it scales from 1 stream to 16, and how it compares with `none`.

Example: `none` gives 40 output tokens/s at 1 stream and 120 at 16, with an ITL p50 of 25 ms and
50 ms: tokens/s 16 over 1 = 3.0, ITL p50 16 over 1 = 2.0. `mtp` at 60 and 150: 1.5 and 1.25 of
`none` at 1 and 16 streams. A ratio is None where a level did not run or had no figure.
"""

from __future__ import annotations

from collections.abc import Callable

from ops.bench.results import ratio

BASE_STREAMS, LOADED_STREAMS = 1, 16
BASELINE_MODE = "none"


def mode_goals(sweep: list[dict], baseline: list[dict] | None) -> dict:
    """One mode's goals; `baseline` is `none`'s sweep when it ran beside this mode, else None."""
    by_level = {level["concurrency"]: level for level in sweep}
    low, high = by_level.get(BASE_STREAMS), by_level.get(LOADED_STREAMS)
    return {
        "tokens_per_s_16_over_1": _level_ratio(high, low, lambda level: level["output_tokens_per_s"]),
        "itl_p50_16_over_1": _level_ratio(high, low, lambda level: level["itl_ms"]["p50"]),
        "tokens_per_s_over_none": None if baseline is None else _over_baseline(sweep, baseline),
    }


def with_goals(modes: list[dict]) -> list[dict]:
    """Each `{"mode", "sweep"}` with its goals; the ratios to `none` only when it ran beside other modes."""
    baseline = next((run["sweep"] for run in modes if run["mode"] == BASELINE_MODE), None)
    if len(modes) < 2:
        baseline = None
    return [
        {**run, "goals": mode_goals(run["sweep"], None if run["mode"] == BASELINE_MODE else baseline)} for run in modes
    ]


def _over_baseline(sweep: list[dict], baseline: list[dict]) -> dict[str, float | None]:
    """Output tokens/s over the baseline's at each level both ran, keyed by concurrency (JSON keys are strings)."""
    rates = {level["concurrency"]: level["output_tokens_per_s"] for level in baseline}
    return {
        str(level["concurrency"]): _rounded(ratio(level["output_tokens_per_s"], rates[level["concurrency"]]))
        for level in sweep
        if level["concurrency"] in rates
    }


def _level_ratio(high: dict | None, low: dict | None, figure: Callable[[dict], float | None]) -> float | None:
    if high is None or low is None:
        return None
    return _rounded(ratio(figure(high), figure(low)))


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
