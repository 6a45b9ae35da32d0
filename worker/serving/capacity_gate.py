"""The worker's capacity gate, applied at start-up: the cache budget, what fits in it, and the context it allows.

The arithmetic is worker/models/capacity.py's; this module feeds it the loaded model (its config,
weight format, activation dtype and the bytes its tensors hold: held_bytes.py), the memory left
free once the weights are in, and
ARBOR_KV_CACHE_BYTES, then fits the lane length to it: the context (ARBOR_MAX_CONTEXT, else the
model's own `max_position_embeddings`) becomes at most the longest lane the cache can ever hold,
so a request that could never run is refused with a 400 naming the limit instead of waiting for
room that will never come.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from worker.engine.runner import ModelRunner
from worker.models.capacity import (
    Capacity,
    CapacityError,
    cache_budget,
    capacity,
    kv_bytes_per_token,
    pool_split,
    state_bytes_per_lane,
)
from worker.models.config import ModelConfig
from worker.models.held_bytes import held_tensor_bytes
from worker.models.hybrid.config import HybridConfig
from worker.models.kv_pool import DEFAULT_BLOCK_TOKENS, DEFAULT_MAX_KV_CACHE_BYTES
from worker.models.model_shape import ModelShape, hybrid_shape, plain_shape

log = logging.getLogger(__name__)
MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True, slots=True)
class StartCapacity:
    capacity: Capacity  # at the context the worker serves
    kv_cache_bytes: int  # the budget lanes' K/V blocks (and a hybrid's state slots) share
    max_context: int  # tokens a lane may hold, prompt + output
    limit_note: str  # why max_context is below the model's own maximum ("" when it is not)
    max_lanes: int  # lanes that run at once: ARBOR_MAX_LANES, or fewer where the state slots are


def decoder_shape(runner: ModelRunner) -> ModelShape:
    config = runner.decoder.config
    if isinstance(config, HybridConfig):
        return hybrid_shape(config)
    assert isinstance(config, ModelConfig)
    return plain_shape(config)


def start_capacity(
    runner: ModelRunner,
    weight_format: str | None,
    kv_cache_bytes: int | None,
    default_kv_cache_bytes: int,
    max_lanes: int,
) -> StartCapacity:
    """`default_kv_cache_bytes`: the budget when ARBOR_KV_CACHE_BYTES is unset (capped here by the
    free memory). The budget divides as the pool will (capacity.pool_split): a hybrid's state slots
    first, one a lane up to `max_lanes`, then whole K/V blocks; the longest lane is all the blocks."""
    shape, dtype = decoder_shape(runner), str(runner.decoder.dtype).removeprefix("torch.")
    budget = kv_cache_bytes or min(default_kv_cache_bytes, cache_budget(0, free_memory_bytes=free_memory(runner)))
    fmt = weight_format or dtype
    per_lane = state_bytes_per_lane(shape, dtype)
    slots, blocks = pool_split(budget, kv_bytes_per_token(shape, dtype) * DEFAULT_BLOCK_TOKENS, per_lane, max_lanes)
    scratch = runner.max_draft_nodes + 1  # a verification's rows past the context (ModelStepper._capacity)
    fits = blocks * DEFAULT_BLOCK_TOKENS - scratch
    if fits < 1:
        raise CapacityError(
            f"kv_cache_bytes={budget}: not one token of K/V fits beside the lanes' states and {scratch} "
            "scratch rows; raise ARBOR_KV_CACHE_BYTES"
        )
    max_context, note = runner.max_context, ""
    if fits < max_context:
        setting = f"ARBOR_KV_CACHE_BYTES={budget}" if kv_cache_bytes else f"{budget} bytes, ARBOR_KV_CACHE_BYTES unset"
        note = f"the most one lane's K/V can hold in this worker's cache ({setting})"
        log.warning("max context %d does not fit: serving %d tokens, %s", max_context, fits, note)
        max_context = fits
    lanes = min(max_lanes, slots) if per_lane else max_lanes
    if lanes < max_lanes:
        log.warning("the cache holds %d lanes' recurrent states (ARBOR_KV_CACHE_BYTES): %d run at once", lanes, lanes)
    weights = held_tensor_bytes(runner.decoder)  # what is held, not the config's arithmetic
    cap = capacity(shape, max_context, fmt, dtype, budget, weights, block_tokens=DEFAULT_BLOCK_TOKENS)
    if per_lane:  # what the pool will really hold: its slots, and K/V in the blocks beside them
        per_context = -(-max_context // DEFAULT_BLOCK_TOKENS)
        cap = replace(
            cap, kv_tokens=blocks * DEFAULT_BLOCK_TOKENS, state_lanes=slots, contexts=min(slots, blocks // per_context)
        )
    return StartCapacity(cap, budget, max_context, note, lanes)


def free_memory(runner: ModelRunner) -> int:
    """Bytes free on the model's device now (the weights are loaded): CUDA's own count, else the
    host's MemAvailable."""
    device = runner.decoder.device
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    for line in MEMINFO.read_text().splitlines() if MEMINFO.exists() else ():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return DEFAULT_MAX_KV_CACHE_BYTES  # no way to ask: today's default cap


def log_capacity(start: StartCapacity) -> None:
    cap = start.capacity
    log.info(
        "capacity: weights %s B (%s), K/V %d B a token, state %d B a lane, cache %d B: %d tokens of K/V, "
        "%s lanes' states, %d contexts of %d tokens",
        f"{cap.weight_bytes:,}",
        cap.weight_format,
        cap.kv_bytes_per_token,
        cap.state_bytes_per_lane,
        cap.cache_bytes,
        cap.kv_tokens,
        cap.state_lanes if cap.state_bytes_per_lane else "no",
        cap.contexts,
        cap.context,
    )
