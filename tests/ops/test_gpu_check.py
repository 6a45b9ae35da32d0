"""ops/gpu_check.sh and ops/bench/gpu_bound.py without a GPU: they skip cleanly, and what they build is right."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from ops.bench.gpu_bound import bandwidth_bound_ms, build, main, weight_bytes

ROOT = Path(__file__).resolve().parents[2]
TINY = {
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "tie_word_embeddings": False,
}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_gpu_check_skips_cleanly_without_cuda() -> None:
    done = subprocess.run(["bash", str(ROOT / "ops" / "gpu_check.sh")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "skipped" in done.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_gpu_bound_skips_cleanly_without_cuda(capsys) -> None:
    assert main([]) == 0 and "no CUDA" in capsys.readouterr().out


def test_bound_is_bytes_over_bandwidth() -> None:
    assert bandwidth_bound_ms(4_800_000_000, 4.8e12) == pytest.approx(1.0)


@pytest.mark.parametrize("weight_format", ["bfloat16", "int4"])
def test_random_model_of_a_shape_builds_and_counts_its_bytes(weight_format: str) -> None:
    decoder = build(TINY, weight_format, torch.device("cpu"))
    linear_params = 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128) + 256 * 64  # layers + lm_head
    num_bytes = weight_bytes(decoder)
    if weight_format == "bfloat16":
        assert num_bytes > 2 * linear_params
    else:  # half a byte a weight plus scales and zeros, rows padded to 16: well under bfloat16's 2 bytes
        assert 0.5 * linear_params < num_bytes < 1.2 * linear_params
    cache = decoder.new_cache(8)
    logits = decoder(torch.tensor([1, 2, 3]), torch.arange(3), cache).logits
    assert logits.shape == (3, 256) and torch.isfinite(logits).all()
