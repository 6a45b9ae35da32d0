"""Start-up measurement of a decoder's forward cost per weight format and row count, and the plan from it.

Timed on the model itself (not per layer): a forward of n rows after a short committed context,
logits for every row as in verification, the best of a few repeats (a shared machine only ever
adds time). A quantized format that costs over `GIVE_UP_RATIO` times the best and is losing ground (its ratio
to the best grew since the last count) is not timed at higher counts: the int4 forwards of many
rows are slow and would make start-up slow. The choice itself is row_plan.choose_plan, a pure function.
"""

from __future__ import annotations

import logging
import time

import torch

from worker.models.decoder import Decoder
from worker.models.kv_cache import KVCache
from worker.models.row_plan import DEFAULT_ROW_COUNTS, RowPlan, choose_plan
from worker.models.weight_formats import QUANTIZED_FORMATS, LinearFormats

logger = logging.getLogger(__name__)
CONTEXT_TOKENS = 32
REPEATS = 2
GIVE_UP_RATIO = 2.0


def plan_rows(decoder: Decoder, formats: LinearFormats, row_counts: tuple[int, ...] = DEFAULT_ROW_COUNTS) -> RowPlan:
    """The measured plan when the decoder holds several formats; the one format's plan otherwise."""
    if len(formats.formats) == 1:
        return RowPlan.single(formats.body)
    costs = measure_row_costs(decoder, formats.formats, row_counts)
    plan = choose_plan(costs, preferred=formats.body)
    logger.info("row plan %s from forward costs (ms) %s", plan.describe(), _rounded_ms(costs))
    return plan


@torch.inference_mode()
def measure_row_costs(
    decoder: Decoder, weight_formats: tuple[str, ...], row_counts: tuple[int, ...], repeats: int = REPEATS
) -> dict[str, dict[int, float]]:
    """costs[format][rows] = seconds of one forward of `rows` new tokens."""
    costs: dict[str, dict[int, float]] = {fmt: {} for fmt in weight_formats}
    cache = new_timing_cache(decoder, max(row_counts))
    given_up: set[str] = set()
    previous: dict[str, float] = {}  # each format's cost relative to the best, at the last count
    for rows in row_counts:
        for fmt in weight_formats:
            if fmt not in given_up:
                costs[fmt][rows] = _forward_cost(decoder, cache, fmt, rows, repeats)
        best = min(by_rows[rows] for by_rows in costs.values() if rows in by_rows)
        relative = {fmt: by_rows[rows] / best for fmt, by_rows in costs.items() if rows in by_rows}
        given_up |= {fmt for fmt, ratio in relative.items() if falling_behind(fmt, ratio, previous.get(fmt))}
        previous = relative
    decoder.set_formats(RowPlan.single(weight_formats[0]))
    return costs


def falling_behind(weight_format: str, ratio: float, previous_ratio: float | None) -> bool:
    """A quantized format far behind the best and losing ground: its cost grows with the rows, so it
    will not come back. Dense formats are never given up: their cost stays flat while others grow
    (at one row bfloat16 is ~4x int4, at 32 it wins), and a noisy count must not drop them."""
    if weight_format not in QUANTIZED_FORMATS or previous_ratio is None:
        return False
    return ratio > GIVE_UP_RATIO and ratio > previous_ratio


def new_timing_cache(decoder: Decoder, max_rows: int) -> KVCache:
    """A cache holding a short committed context, for `forward_cost`."""
    cache = decoder.new_cache(CONTEXT_TOKENS + max_rows)
    _commit_context(decoder, cache)
    return cache


def _commit_context(decoder: Decoder, cache: KVCache) -> None:
    token_ids = torch.arange(CONTEXT_TOKENS, device=decoder.device) % decoder.config.vocab_size
    decoder(token_ids, torch.arange(CONTEXT_TOKENS, device=decoder.device), cache, num_logits=0)
    cache.commit(CONTEXT_TOKENS)


def _forward_cost(decoder: Decoder, cache: KVCache, weight_format: str, rows: int, repeats: int) -> float:
    decoder.set_formats(RowPlan.single(weight_format))
    return forward_cost(decoder, cache, rows, repeats)


def forward_cost(decoder: Decoder, cache: KVCache, rows: int, repeats: int = REPEATS) -> float:
    """Seconds of one forward of `rows` new tokens with logits after the cache's context, as set up now."""
    start = cache.length
    token_ids = torch.arange(rows, device=decoder.device) % decoder.config.vocab_size
    positions = torch.arange(start, start + rows, device=decoder.device)
    decoder(token_ids, positions, cache)  # warm-up: first calls allocate and pick kernels
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        decoder(token_ids, positions, cache)
        _synchronize(decoder.device)
        best = min(best, time.perf_counter() - started)
    return best


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rounded_ms(costs: dict[str, dict[int, float]]) -> dict[str, dict[int, float]]:
    return {fmt: {rows: round(cost * 1e3, 2) for rows, cost in by_rows.items()} for fmt, by_rows in costs.items()}
