"""Tiny random Qwen3.5 / Qwen3-Next checkpoints in real Hugging Face format, built with transformers."""

from __future__ import annotations

from pathlib import Path

import torch

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


def make_tiny_hybrid_model_with_mtp(folder: Path, family: str, seed: int = 0, mtp_seed: int = 1, **overrides) -> Path:
    """A tiny hybrid target whose model.safetensors also holds an `mtp.*` head, as Qwen3.5 and
    Qwen3-Next checkpoints ship one.

    The head's layer and final norm are those of a one-layer, full-attention model of the same
    family that transformers writes (`mtp_layer_folder(folder)`, kept as the tests' oracle): its
    `model.layers.0.*` and `model.norm.weight` become `mtp.layers.0.*` and `mtp.norm.weight`, so
    the names and shapes are the format's, not Arbor's; `mtp.fc` and the pre-fc norms are random.
    """
    from safetensors.torch import load_file, save_file

    make_tiny_hybrid_model(folder, family, seed, **overrides)
    layer_overrides = {**overrides, "num_hidden_layers": 1, "layer_types": ["full_attention"]}
    layer_folder = make_tiny_hybrid_model(mtp_layer_folder(folder), family, mtp_seed, **layer_overrides)
    layer = load_file(str(layer_folder / "model.safetensors"))
    head = {"mtp." + name.removeprefix("model."): t for name, t in layer.items() if name.startswith("model.layers.0.")}
    head["mtp.norm.weight"] = layer["model.norm.weight"]
    hidden = head["mtp.norm.weight"].shape[0]
    generator = torch.Generator().manual_seed(mtp_seed)
    head["mtp.fc.weight"] = torch.randn(hidden, 2 * hidden, generator=generator) * 0.15
    for name in ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight"):
        head[name] = 0.1 * torch.randn(hidden, generator=generator)  # zero-centred: the scale is 1 + w
    weights = folder / "model.safetensors"
    save_file({**load_file(str(weights)), **head}, str(weights), metadata={"format": "pt"})
    return folder


def mtp_layer_folder(folder: Path) -> Path:
    """Where make_tiny_hybrid_model_with_mtp keeps the one-layer model its head's layer comes from."""
    return folder.parent / f"{folder.name}-mtp-layer"


def damp_outputs(decoder: torch.nn.Module, damping: float = 0.07) -> None:
    """Scale the mixers' and MLPs' output projections down (o_proj, out_proj, down_proj). With tied
    embeddings the next token then mostly follows the current one: random hybrids fall into
    loops that lookup drafts predict, and the mixers still move the argmax often enough that
    drafts are also rejected part-way (so partial paths get committed)."""
    with torch.no_grad():
        for name, parameter in decoder.named_parameters():
            if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
                parameter.mul_(damping)
