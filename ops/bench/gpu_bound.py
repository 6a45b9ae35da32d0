"""Batch-1 decode of a random-weight model of a real shape on CUDA, against the memory-bandwidth bound.

`python -m ops.bench.gpu_bound [--config qwen3-8b] [--formats bfloat16,int4] [--out file.json]`

A decode step must read every weight once, so bytes read / bandwidth is its floor. Bandwidth is
measured here (a device-to-device copy of 4 GiB, read + write), not taken from a datasheet. The
weights are random (no download): shape is all a step's time depends on. int4 weights are random
codes and scales packed as a checkpoint's would be. Prints one JSON object; exits 0 without CUDA.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from worker.kernels.quantized_weight import INT4_GROUP_SIZE, Int4Weight
from worker.models.checkpoint import Checkpoint
from worker.models.config import ModelConfig
from worker.models.decoder import Decoder
from worker.models.loader import build_decoder, build_fast_decoder
from worker.models.weight_formats import LinearFormats

CONFIGS = {
    "qwen3-8b": {
        "model_type": "qwen3",
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": False,
    },
}
CONTEXT_TOKENS = 512
DECODE_STEPS = 64
COPY_BYTES = 4 << 30


def bandwidth_bound_ms(num_bytes: int, bytes_per_s: float) -> float:
    """The least time a step reading `num_bytes` can take at `bytes_per_s`."""
    return num_bytes / bytes_per_s * 1e3


def measure_bandwidth(device: torch.device) -> float:
    """Bytes per second of a device-to-device copy (each byte read once and written once)."""
    source = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    torch.cuda.synchronize(device)
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        target.copy_(source)
        torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - started)
    return 2 * COPY_BYTES / best


def random_checkpoint(config: ModelConfig, raw: dict, int4: bool, device: torch.device) -> Checkpoint:
    """Random tensors of the config's shapes: linears as int4 codes and scales when `int4`."""
    with torch.device("meta"):
        shapes = {name: tuple(t.shape) for name, t in Decoder(config).state_dict().items()}
    tensors: dict[str, torch.Tensor] = {}
    quantized: dict[str, Int4Weight] = {}
    for name, shape in shapes.items():
        if int4 and len(shape) == 2 and "embed_tokens" not in name:
            quantized[name] = _random_int4(shape, device)
        else:
            tensors[name] = torch.randn(shape, device=device, dtype=torch.bfloat16) * 0.02
    return Checkpoint(raw, tensors, None, None, [0], quantized=quantized)  # type: ignore[arg-type]


def _random_int4(shape: tuple[int, ...], device: torch.device) -> Int4Weight:
    rows, cols = shape
    groups = cols // INT4_GROUP_SIZE
    q = torch.randint(0, 16, (rows, cols), dtype=torch.uint8, device=device)
    scales = torch.rand(rows, groups, device=device) * 0.01
    return Int4Weight(q, scales, -8 * scales)


def build(raw: dict, weight_format: str, device: torch.device) -> Decoder:
    config = ModelConfig.from_hf(raw)
    checkpoint = random_checkpoint(config, raw, weight_format == "int4", device)
    if weight_format == "bfloat16":
        return build_decoder(config, checkpoint.tensors, torch.bfloat16, str(device))
    formats = LinearFormats("bfloat16", "int4", "int4")
    return build_fast_decoder(config, checkpoint, formats, str(device))


def weight_bytes(decoder: Decoder) -> int:
    """Bytes a decode step reads: every parameter and buffer but the embedding (one row of it)."""
    total = sum(p.numel() * p.element_size() for name, p in decoder.named_parameters() if "embed" not in name)
    for module in decoder.modules():
        kernel = getattr(module, "kernel", None)
        total += getattr(kernel, "num_bytes", 0)
    return total


@torch.inference_mode()
def decode_ms(decoder: Decoder, device: torch.device) -> float:
    cache = decoder.new_cache(CONTEXT_TOKENS + DECODE_STEPS + 1)
    prompt = torch.randint(0, decoder.config.vocab_size, (CONTEXT_TOKENS,), device=device)
    decoder(prompt, torch.arange(CONTEXT_TOKENS, device=device), cache, num_logits=0)
    cache.commit(CONTEXT_TOKENS)
    token = prompt[-1:]
    for _ in range(3):  # warm-up steps, discarded
        decoder(token, torch.tensor([cache.length], device=device), cache)
    torch.cuda.synchronize(device)
    started = time.perf_counter()
    for _ in range(DECODE_STEPS):
        out = decoder(token, torch.tensor([cache.length], device=device), cache)
        token = out.logits[-1:].argmax(-1)
        cache.commit(1)
    torch.cuda.synchronize(device)
    return (time.perf_counter() - started) / DECODE_STEPS * 1e3


def run(config_name: str, formats: list[str]) -> dict:
    device = torch.device("cuda")
    bandwidth = measure_bandwidth(device)
    result: dict = {"config": config_name, "device": torch.cuda.get_device_name(device), "copy_GBps": bandwidth / 1e9}
    for weight_format in formats:
        decoder = build(CONFIGS[config_name], weight_format, device)
        kv_bytes = decoder.new_cache(1).bytes_per_token() * (CONTEXT_TOKENS + DECODE_STEPS // 2)  # read per step
        num_bytes = weight_bytes(decoder) + kv_bytes
        step_ms = decode_ms(decoder, device)
        bound_ms = bandwidth_bound_ms(num_bytes, bandwidth)
        result[weight_format] = {
            "bytes_read_GB": num_bytes / 1e9,
            "step_ms": round(step_ms, 3),
            "bound_ms": round(bound_ms, 3),
            "share_of_bound": round(bound_ms / step_ms, 3),
            "tokens_per_s": round(1e3 / step_ms, 1),
        }
        del decoder
        torch.cuda.empty_cache()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="qwen3-8b")
    parser.add_argument("--formats", default="bfloat16,int4", help="comma-separated: bfloat16, int4")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA device"}))
        return 0
    result = run(args.config, [name.strip() for name in args.formats.split(",") if name.strip()])
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
