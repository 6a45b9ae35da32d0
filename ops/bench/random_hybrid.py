"""A small random hybrid checkpoint (Qwen3.5 or Qwen3-Next) written with transformers, for benchmarks.

Eight layers at hidden 512 in the Qwen3.5 text layout: three gated-DeltaNet layers then a gated
attention layer, twice (6 + 2); Qwen3-Next's variant swaps the MLPs for sparse MoE. The weights
are transformers' random initialisation (no download): a step's time depends on the shapes. The
tokenizer is the default model's, so the prompt and the vocabulary (hence the lm_head's cost)
are those of the plain benchmarks.
"""

from __future__ import annotations

import json
from pathlib import Path

HYBRID_SHAPE = dict(
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=8,
    layer_types=["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    linear_num_key_heads=4,
    linear_num_value_heads=8,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
    rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25),
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
FAMILIES: dict[str, dict] = {
    "qwen3_5": dict(model_type="qwen3_5_text", architectures=["Qwen3_5ForCausalLM"]),
    "qwen3_next": dict(
        model_type="qwen3_next",
        architectures=["Qwen3NextForCausalLM"],
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=256,
        shared_expert_intermediate_size=512,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    ),
}


def hybrid_shape_summary() -> str:
    """E.g. "8 layers: 6 DeltaNet + 2 attention, hidden 512"."""
    layer_types = HYBRID_SHAPE["layer_types"]
    assert isinstance(layer_types, list)
    num_linear = layer_types.count("linear_attention")
    return (
        f"{len(layer_types)} layers: {num_linear} DeltaNet + {len(layer_types) - num_linear} attention, "
        f"hidden {HYBRID_SHAPE['hidden_size']}"
    )


def write_random_hybrid(folder: Path, family: str, seed: int = 0, **overrides: object) -> Path:
    """config.json, model.safetensors and tokenizer.json of a random hybrid in `folder`
    (`overrides`: config fields, e.g. max_position_embeddings)."""
    import torch
    import transformers

    from worker.models.loader import read_checkpoint

    tokenizer = read_checkpoint(None).tokenizer  # the default model's
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": False}))
    config = {**HYBRID_SHAPE, **FAMILIES[family], "vocab_size": tokenizer.get_vocab_size(), **overrides}
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**config), dtype=torch.float32
    )
    model.save_pretrained(folder)
    return folder
