"""Long contexts on a tiny hybrid whose max_position_embeddings is Qwen3-Next's 262,144.

- RoPE (YaRN-scaled, partial) at every position up to 262,143 equals transformers' own rotary
  embedding: the tables are the reference's, float32 products and all.
- (slow) A 32,768-token prompt served through the runner in float64 (chunked prefill: the chunked
  delta rule, attention a chunk of rows at a time) gives the last-token logits of another path:
  64-row forwards straight through the decoder, each running the recurrent delta rule token by
  token. Its memory is bounded by the chunk, not the prompt: the peak RSS grows by at most the
  lane's cache + four chunk-sized [heads, chunk, context] float64 attention buffers + 256 MB,
  where one [heads, context, context] matrix alone would be 34 GB.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

from tests.support.long_prompt_probe import long_prompt
from tests.support.tiny_hybrid_models import make_tiny_hybrid_model
from worker.engine.generate import PREFILL_CHUNK
from worker.models.hybrid.config import HybridConfig
from worker.models.hybrid.decoder import MAX_VERIFY_TOKENS
from worker.models.hybrid.gated_attention import partial_rotary
from worker.models.loader import load_model

MAX_POSITIONS = 262144
LONG_PROMPT = 32768
SLACK_BYTES = 256 << 20
YARN = dict(
    rope_type="yarn",
    rope_theta=10000000.0,
    partial_rotary_factor=0.25,
    factor=4.0,
    original_max_position_embeddings=65536,
)
REPO_ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture(scope="module")
def long_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("long") / "tiny-long"
    return make_tiny_hybrid_model(folder, "qwen3_next", max_position_embeddings=MAX_POSITIONS, rope_parameters=YARN)


def test_rope_at_every_position_to_the_models_maximum_is_the_references(long_model):
    raw = json.loads((long_model / "config.json").read_text())
    ours = partial_rotary(HybridConfig.from_hf(raw), torch.float32, "cpu")
    reference_config = transformers.AutoConfig.from_pretrained(long_model)
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRotaryEmbedding

    theirs = Qwen3NextRotaryEmbedding(reference_config)
    positions = torch.arange(MAX_POSITIONS)
    cos, signed_sin = ours(positions)
    ref_cos, ref_sin = theirs(torch.zeros(1, dtype=torch.float32), positions[None])
    half = cos.shape[-1] // 2
    assert ours.attention_factor > 1.0  # YaRN's scale is applied
    assert torch.equal(cos, ref_cos[0])
    assert torch.equal(signed_sin[:, half:], ref_sin[0][:, half:])
    assert torch.equal(-signed_sin[:, :half], ref_sin[0][:, :half])


def recurrent_reference(folder: Path, token_ids: list[int]) -> torch.Tensor:
    """The last token's logits, float64, fed MAX_VERIFY_TOKENS rows a forward with every row's
    logits asked for: the recurrent form of the delta rule (decoder._recurrent_lane)."""
    decoder = load_model(folder, dtype=torch.float64).decoder
    cache = decoder.new_cache(len(token_ids))
    logits = None
    for start in range(0, len(token_ids), MAX_VERIFY_TOKENS):
        rows = token_ids[start : start + MAX_VERIFY_TOKENS]
        logits = decoder(torch.tensor(rows), torch.arange(start, start + len(rows)), cache).logits
        cache.commit(len(rows))
    assert logits is not None
    return logits[-1]


@pytest.mark.slow
def test_a_long_prompt_served_in_chunks_matches_the_recurrent_form_with_bounded_memory(long_model, tmp_path):
    out = tmp_path / "probe.json"
    command = [
        sys.executable,
        "-m",
        "tests.support.long_prompt_probe",
        str(long_model),
        str(LONG_PROMPT),
        "7",
        str(out),
    ]
    subprocess.run(command, cwd=REPO_ROOT, check=True, timeout=1800)
    report = json.loads(out.read_text())
    served = torch.tensor(report["logits"], dtype=torch.float64)

    raw = json.loads((long_model / "config.json").read_text())
    with torch.inference_mode():
        expected = recurrent_reference(long_model, long_prompt(raw["vocab_size"], LONG_PROMPT, 7))
    assert torch.allclose(served, expected, atol=1e-8, rtol=0), (served - expected).abs().max()

    heads = raw["num_attention_heads"]
    attention_buffers = 4 * heads * PREFILL_CHUNK * LONG_PROMPT * 8  # scores, masked, softmax, a spare
    bound = report["cache_bytes"] + attention_buffers + SLACK_BYTES
    grown = report["peak_rss"] - report["baseline_rss"]
    assert grown <= bound, f"peak RSS grew {grown:,} B serving {LONG_PROMPT} tokens; bound {bound:,} B"
