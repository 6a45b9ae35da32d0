"""Tiny random Qwen3.5 / Qwen3-Next checkpoints in real Hugging Face format, built with transformers."""

from __future__ import annotations

from pathlib import Path

from tests.support.tiny_models import make_tiny_model

# Small but with every feature: grouped value heads (4 per 2 key heads), GQA, partial RoPE, a full
# attention layer every 3rd, and for Qwen3-Next sparse MoE layers with one dense (mlp_only) layer.
HYBRID_SHAPES = dict(
    num_hidden_layers=4,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=12,
    linear_conv_kernel_dim=4,
    layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
    rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25),
)
HYBRID_FAMILIES: dict[str, dict] = {
    "qwen3_5_text": dict(model_type="qwen3_5_text", architectures=["Qwen3_5ForCausalLM"]),
    "qwen3_next": dict(
        model_type="qwen3_next",
        architectures=["Qwen3NextForCausalLM"],
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
    ),
}


def make_tiny_hybrid_model(folder: Path, family: str, seed: int = 0, **overrides) -> Path:
    """A random tiny hybrid model (weights scaled up like tiny_models', so logits are not flat)."""
    options = {**HYBRID_SHAPES, **HYBRID_FAMILIES[family], **overrides}
    return make_tiny_model(folder, "qwen3", seed, **options)
