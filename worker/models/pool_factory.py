"""The serving worker's K/V pool for a decoder: a plain model's `KVPool`, or a hybrid's `HybridPool`
(attention K/V in blocks, recurrent states in slots). Above both pools and both decoders, so
neither pool module needs to know the decoders."""

from __future__ import annotations

from worker.models.capacity import pool_split
from worker.models.decoder import Decoder
from worker.models.hybrid.decoder import HybridDecoder
from worker.models.hybrid.hybrid_pool import HybridPool, attention_kv_config
from worker.models.kv_pool import DEFAULT_BLOCK_TOKENS, KVPool


def new_pool(decoder: object, num_bytes: int, max_lanes: int, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> KVPool:
    """A pool of `num_bytes` for `decoder`'s lanes. A hybrid model's (worker/models/hybrid/
    hybrid_pool.py) holds its attention layers' K/V in blocks and its recurrent states in slots,
    one a lane up to `max_lanes` (capacity.pool_split says how the bytes divide)."""
    assert isinstance(decoder, Decoder | HybridDecoder), type(decoder)
    if isinstance(decoder, HybridDecoder):
        config = decoder.config
        block_bytes = KVPool.block_bytes(attention_kv_config(config), block_tokens, decoder.dtype)
        slots, num_blocks = pool_split(num_bytes, block_bytes, decoder.state_bytes(), max_lanes)
        return HybridPool(config, max(num_blocks, 1), block_tokens, slots, decoder.dtype, decoder.device)
    block_bytes = KVPool.block_bytes(decoder.config, block_tokens, decoder.dtype)
    num_blocks = max(num_bytes // block_bytes, 1)
    return KVPool(decoder.config, num_blocks, block_tokens, decoder.dtype, decoder.device)
