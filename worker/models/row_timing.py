"""How long one forward of n rows takes on a decoder, for the benchmarks (ops/bench/).

Timed on the model itself (not per layer): a forward of n rows after a short committed context,
logits for every row as in verification, the best of a few repeats (a shared machine only ever
adds time). Nothing here chooses what a worker serves: the weight format is a rule
(weight_formats.py), never a timing.
"""

from __future__ import annotations

import time

import torch

from worker.models.decoder import Decoder
from worker.models.kv_cache import KVCache

CONTEXT_TOKENS = 32
REPEATS = 2


def new_timing_cache(decoder: Decoder, max_rows: int) -> KVCache:
    """A cache holding a short committed context, for `forward_cost`."""
    cache = decoder.new_cache(CONTEXT_TOKENS + max_rows)
    _commit_context(decoder, cache)
    return cache


def _commit_context(decoder: Decoder, cache: KVCache) -> None:
    token_ids = torch.arange(CONTEXT_TOKENS, device=decoder.device) % decoder.config.vocab_size
    decoder(token_ids, torch.arange(CONTEXT_TOKENS, device=decoder.device), cache, num_logits=0)
    cache.commit(CONTEXT_TOKENS)


def forward_cost(decoder: Decoder, cache: KVCache, rows: int, repeats: int = REPEATS) -> float:
    """Seconds of one forward of `rows` new tokens with logits after the cache's context."""
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
