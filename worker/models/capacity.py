"""Capacity arithmetic: how many tokens of K/V, lanes' recurrent states and whole contexts fit.

Plain arithmetic over a `ModelShape` (worker/models/model_shape.py); no tensors, so `arbor
capacity` answers before a GPU is bought and the worker answers at start-up.

    weights        linears in the weight format (one copy: weight_formats.py holds one format), the
                   rest dense in the activation dtype; a worker logs the bytes its tensors really
                   take instead (held_bytes.py), packing and a quantized head's kept source included
    K/V per token  2 (K and V) x K/V layers x kv_heads x head_dim x activation bytes
    state per lane DeltaNet layers x (conv tail in the activation dtype + delta-rule state in at least
                   float32), whatever the context's length
    cache budget   ARBOR_KV_CACHE_BYTES when set, else DEVICE_MEMORY_USE of the device's memory less
                   the weights (or of the memory left free once they are loaded)

Worked example, Qwen3-Next-80B-A3B in bfloat16 on an 80 GB device: 24,576 B of K/V a token
(2 x 12 x 2 x 256 x 2), 77,266,944 B of state a lane; one 262,144-token context is then
24,576 x 262,144 + 77,266,944 = 6,519,717,888 B. Beside ~159 GB of bfloat16 weights nothing is left
for it; in int4 (~60 GB of weights) the 72 - 60 GB left hold one, and on a 141 GB device ten.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from worker.models.model_shape import ModelShape

# Of a hybrid model's cache, the most its lanes' recurrent states may take: the rest is K/V blocks
# (a state slot serves a lane of any length; the blocks decide how long the lanes can grow).
STATE_SHARE = 0.5
DEVICE_MEMORY_USE = 0.9  # of the device's memory, for weights and cache: the rest is activations' headroom
INT4_GROUP = 32  # worker/kernels/quantized_weight.py's INT4_GROUP_SIZE
DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
FORMATS = ("float64", "float32", "bfloat16", "float16", "int8", "int4")


class CapacityError(ValueError):
    """A setting the arithmetic cannot use (a format it does not know, a negative size)."""


@dataclass(frozen=True, slots=True)
class Capacity:
    """What fits. `context` is the length asked about (the worker's: its max context)."""

    weight_format: str
    dtype: str  # the activation dtype: K/V and conv tails are held in it
    weight_bytes: int
    kv_bytes_per_token: int
    state_bytes_per_lane: int  # 0 for a plain model
    cache_bytes: int  # the budget K/V and states share (0 when the weights leave nothing)
    # tokens of K/V the budget holds, states aside (whole blocks of `block_tokens`), and lanes whose
    # recurrent states it holds, K/V aside (0 for a plain model); a worker publishes its pool's
    # instead: the blocks and state slots its budget was divided into (capacity_gate.py)
    kv_tokens: int
    state_lanes: int
    context: int
    contexts: int  # contexts of `context` tokens that fit together, each with its lane's state
    max_lane_tokens: int  # the longest context one lane can ever hold: its K/V beside its state

    def as_dict(self) -> dict[str, int | str]:
        return asdict(self)


def linear_bytes(out_features: int, in_features: int, weight_format: str) -> int:
    """One [out, in] matrix in a weight format (weight_formats.py, kernels/quantized_weight.py):
    int8 is a byte a weight and a float32 scale a row; int4 is two weights a byte and a float32
    scale and minimum per group of INT4_GROUP along the input."""
    weights = out_features * in_features
    if weight_format == "int8":
        return weights + 4 * out_features
    if weight_format == "int4":
        return weights // 2 + 8 * out_features * -(-in_features // INT4_GROUP)
    return weights * _dtype_bytes(weight_format)


def weight_bytes(shape: ModelShape, weight_format: str, dtype: str) -> int:
    """The model's weights held as the worker holds them (see the module docstring)."""
    if weight_format not in FORMATS:
        raise CapacityError(f"format={weight_format!r}: choose from {', '.join(FORMATS)}")
    total = sum(count * linear_bytes(out, inner, weight_format) for count, out, inner in shape.linears)
    return total + shape.dense_params * _dtype_bytes(dtype)


def kv_bytes_per_token(shape: ModelShape, dtype: str) -> int:
    return 2 * shape.num_kv_layers * shape.num_kv_heads * shape.head_dim * _dtype_bytes(dtype)


def state_bytes_per_lane(shape: ModelShape, dtype: str) -> int:
    """Conv tails in the activation dtype, delta-rule states in at least float32 (HybridCache.bytes_for)."""
    size = _dtype_bytes(dtype)
    return shape.num_state_layers * (shape.conv_elements * size + shape.state_elements * max(size, 4))


def cache_budget(
    weights: int,
    kv_cache_bytes: int | None = None,
    device_memory_bytes: int | None = None,
    free_memory_bytes: int | None = None,
) -> int:
    """ARBOR_KV_CACHE_BYTES if set; else DEVICE_MEMORY_USE of the free memory (weights already
    loaded) or of the device's memory less the weights; never below 0."""
    if kv_cache_bytes is not None:
        return kv_cache_bytes
    if free_memory_bytes is not None:
        return max(int(DEVICE_MEMORY_USE * free_memory_bytes), 0)
    if device_memory_bytes is None:
        raise CapacityError("no memory to plan with: give device_memory_bytes, free_memory_bytes or kv_cache_bytes")
    return max(int(DEVICE_MEMORY_USE * device_memory_bytes) - weights, 0)


def capacity(
    shape: ModelShape,
    context: int,
    weight_format: str,
    dtype: str,
    budget: int,
    weights: int | None = None,
    block_tokens: int = 1,
) -> Capacity:
    """What fits in `budget` bytes of cache; `block_tokens`: K/V is handed out in blocks of that many
    tokens (the plain models' pool), so only whole blocks count."""
    if context < 1:
        raise CapacityError(f"context={context}: at least 1 token")
    per_token, per_lane = kv_bytes_per_token(shape, dtype), state_bytes_per_lane(shape, dtype)
    block_bytes = per_token * block_tokens
    per_context = -(-context // block_tokens) * block_bytes + per_lane
    return Capacity(
        weight_format=weight_format,
        dtype=dtype,
        weight_bytes=weight_bytes(shape, weight_format, dtype) if weights is None else weights,
        kv_bytes_per_token=per_token,
        state_bytes_per_lane=per_lane,
        cache_bytes=budget,
        kv_tokens=budget // block_bytes * block_tokens,
        state_lanes=budget // per_lane if per_lane else 0,
        context=context,
        contexts=budget // per_context,
        max_lane_tokens=max(budget - per_lane, 0) // block_bytes * block_tokens,
    )


def pool_split(budget: int, block_bytes: int, state_bytes: int, max_lanes: int) -> tuple[int, int]:
    """How a worker's pool divides `budget` bytes (pool_factory.new_pool): (state slots, K/V blocks).
    A hybrid gets a state slot per lane up to `max_lanes`, at least one, the slots at most
    STATE_SHARE of the budget; the blocks get the rest (possibly none: the caller refuses that)."""
    if state_bytes == 0:
        return 0, budget // block_bytes
    slots = max(min(max_lanes, int(budget * STATE_SHARE) // state_bytes), 1)
    return slots, max(budget - slots * state_bytes, 0) // block_bytes


def parse_bytes(text: str) -> int:
    """ "80GB", "141 GB", "24GiB", "512MiB" or a plain number of bytes (GB = 10^9, GiB = 2^30)."""
    units = {"tib": 1 << 40, "gib": 1 << 30, "mib": 1 << 20, "kib": 1 << 10, "tb": 10**12, "gb": 10**9, "mb": 10**6}
    cleaned = text.strip().lower().replace(" ", "")
    scale = next((scale for suffix, scale in units.items() if cleaned.endswith(suffix)), 1)
    number = cleaned.rstrip("tgmkib") if scale != 1 else cleaned.removesuffix("b")
    try:
        value = float(number) * scale
    except ValueError:
        value = 0.0
    if value <= 0:
        raise CapacityError(f"memory size {text!r}: expected a positive size such as 80GB")
    return int(value)


def _dtype_bytes(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise CapacityError(f"dtype={dtype!r}: choose from {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]
