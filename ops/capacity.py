"""`arbor capacity`: what a model holds on a device, before it is deployed (no weights read, no torch).

    arbor capacity --model /models/Qwen3-Next-80B-A3B --context 262144 --device-memory 80GB,141GB --format int4

prints, per device size, the weights' bytes, K/V bytes a token, recurrent-state bytes a lane,
the cache left beside the weights, and how many tokens, lanes' states and contexts of that
length it holds (worker/models/capacity.py does the arithmetic; the worker logs the same at start).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

DEFAULT_DEVICES = "24GB,80GB,141GB"


def add_capacity_parser(subparsers) -> None:
    parser = subparsers.add_parser("capacity", help="how many contexts of a length fit on a device (no GPU needed)")
    parser.add_argument("--model", required=True, help="a checkpoint folder (its config.json) or a config.json")
    parser.add_argument("--context", type=int, default=None, help="tokens a context holds (default: the model's max)")
    parser.add_argument(
        "--device-memory", default=DEFAULT_DEVICES, help=f"device sizes, comma-separated (default {DEFAULT_DEVICES})"
    )
    parser.add_argument("--format", default="bfloat16", help="weight format: float32, bfloat16, int8, int4")
    parser.add_argument("--dtype", default="bfloat16", help="activation dtype, the K/V's (default bfloat16)")
    parser.add_argument("--kv-cache-bytes", default=None, help="a fixed cache size (ARBOR_KV_CACHE_BYTES), e.g. 20GB")
    parser.set_defaults(handler=run_capacity)


def read_config(model: str) -> dict:
    path = Path(model)
    path = path / "config.json" if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(f"--model {model}: no config.json there")
    raw = json.loads(path.read_text())
    if not isinstance(raw, dict):
        raise ValueError(f"--model {model}: config.json is not an object")
    return raw


def capacity_table(raw: dict, context: int | None, devices: list[int], weight_format: str, dtype: str,
                   kv_cache_bytes: int | None) -> list[str]:  # fmt: skip
    from worker.models.capacity import DEVICE_MEMORY_USE, cache_budget, capacity, weight_bytes
    from worker.models.model_shape import model_shape

    shape = model_shape(raw)
    context = context or shape.max_position_embeddings
    weights = weight_bytes(shape, weight_format, dtype)
    first = capacity(shape, context, weight_format, dtype, 0, weights)
    lines = [
        f"model {shape.model_type}: {shape.num_params:,} parameters, max_position_embeddings "
        f"{shape.max_position_embeddings:,}",
        f"weights ({weight_format}, the rest {dtype}): {_gb(weights)}",
        f"K/V a token ({shape.num_kv_layers} layers x {shape.num_kv_heads} heads x {shape.head_dim}, {dtype}): "
        f"{first.kv_bytes_per_token:,} B",
        f"recurrent state a lane ({shape.num_state_layers} DeltaNet layers): {first.state_bytes_per_lane:,} B",
        f"one context of {context:,} tokens: {_gb(context * first.kv_bytes_per_token + first.state_bytes_per_lane)}",
        "cache: "
        + ("ARBOR_KV_CACHE_BYTES" if kv_cache_bytes else f"{DEVICE_MEMORY_USE:.0%} of the device less the weights"),
        "",
        f"{'device':>9}  {'cache':>9}  {'K/V tokens':>12}  {'state lanes':>11}  {'contexts of ' + str(context):>20}",
    ]
    for device in devices:
        budget = cache_budget(weights, kv_cache_bytes, device_memory_bytes=device)
        fit = capacity(shape, context, weight_format, dtype, budget, weights)
        lanes = str(fit.state_lanes) if fit.state_bytes_per_lane else "-"
        lines.append(f"{_gb(device):>9}  {_gb(budget):>9}  {fit.kv_tokens:>12,}  {lanes:>11}  {fit.contexts:>20}")
    return lines


def run_capacity(args: argparse.Namespace) -> int:
    from worker.models.capacity import parse_bytes

    devices = [parse_bytes(part) for part in args.device_memory.split(",") if part.strip()]
    kv_cache_bytes = parse_bytes(args.kv_cache_bytes) if args.kv_cache_bytes else None
    for line in capacity_table(read_config(args.model), args.context, devices, args.format, args.dtype, kv_cache_bytes):
        print(line)
    return 0


def _gb(num_bytes: int) -> str:
    return f"{num_bytes / 1e9:.1f} GB"
