"""The hybrid decoder's configuration, read from a Hugging Face `config.json` dict.

Three spellings reach it: Qwen3-Next (`qwen3_next`), Qwen3.5's text model (`qwen3_5_text`), and
Qwen3.5's composite config (`qwen3_5`) whose `text_config` holds the text model. Arbor serves text
only, so a composite config that carries a vision tower is refused by name rather than half-loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.models.checkpoint import CheckpointError

HYBRID_MODEL_TYPES = ("qwen3_5", "qwen3_5_text", "qwen3_next")
LINEAR_ATTENTION, FULL_ATTENTION = "linear_attention", "full_attention"
# model_type -> how a DeltaNet layer's input projections are laid out in the checkpoint
PROJECTION_LAYOUTS = {"qwen3_next": "grouped", "qwen3_5_text": "split"}


@dataclass(slots=True, frozen=True)
class MoeConfig:
    """Qwen3-Next's sparse MLP: top-k routed experts plus one always-on, gated shared expert."""

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    norm_topk_prob: bool
    decoder_sparse_step: int
    mlp_only_layers: tuple[int, ...]


@dataclass(slots=True, frozen=True)
class HybridConfig:
    model_type: str  # "qwen3_next" or "qwen3_5_text" (a composite qwen3_5 is read as its text model)
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]  # per layer: "linear_attention" (gated DeltaNet) or "full_attention"
    # gated attention
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    attention_bias: bool
    rope_theta: float
    rope_scaling: dict | None  # HF rope parameters with "rope_type"; None for plain RoPE
    partial_rotary_factor: float  # RoPE turns only the first head_dim * factor dims of q and k
    # gated DeltaNet
    linear_conv_kernel_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    projection_layout: str  # "grouped" (Qwen3-Next: in_proj_qkvz, in_proj_ba) or "split" (Qwen3.5)
    # everything else
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    moe: MoeConfig | None  # None: every MLP is dense

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def attention_layers(self) -> list[int]:
        return [i for i, kind in enumerate(self.layer_types) if kind == FULL_ATTENTION]

    @property
    def linear_layers(self) -> list[int]:
        return [i for i, kind in enumerate(self.layer_types) if kind == LINEAR_ATTENTION]

    @property
    def conv_dim(self) -> int:
        """Channels of the short convolution: q, k and v side by side."""
        key_dim = self.linear_num_key_heads * self.linear_key_head_dim
        return 2 * key_dim + self.linear_num_value_heads * self.linear_value_head_dim

    def is_sparse_layer(self, index: int) -> bool:
        moe = self.moe
        if moe is None or index in moe.mlp_only_layers:
            return False
        return (index + 1) % moe.decoder_sparse_step == 0

    @classmethod
    def from_hf(cls, raw: dict) -> HybridConfig:
        raw = text_config(raw)
        model_type = raw["model_type"]
        num_layers = _required(raw, "num_hidden_layers")
        num_heads = _required(raw, "num_attention_heads")
        rope = _rope_parameters(raw)
        _check_supported(raw)
        return cls(
            model_type=model_type,
            vocab_size=_required(raw, "vocab_size"),
            hidden_size=_required(raw, "hidden_size"),
            intermediate_size=_required(raw, "intermediate_size"),
            num_hidden_layers=num_layers,
            layer_types=_layer_types(raw, num_layers),
            num_attention_heads=num_heads,
            num_key_value_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=int(raw.get("head_dim") or 256),
            attention_bias=bool(raw.get("attention_bias", False)),
            rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 10000.0))),
            rope_scaling=rope if rope.get("rope_type", "default") != "default" else None,
            partial_rotary_factor=float(rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 0.25))),
            linear_conv_kernel_dim=int(raw.get("linear_conv_kernel_dim", 4)),
            linear_num_key_heads=int(raw.get("linear_num_key_heads", 16)),
            linear_num_value_heads=int(raw.get("linear_num_value_heads", 32)),
            linear_key_head_dim=int(raw.get("linear_key_head_dim", 128)),
            linear_value_head_dim=int(raw.get("linear_value_head_dim", 128)),
            projection_layout=PROJECTION_LAYOUTS[model_type],
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            moe=_moe(raw) if model_type == "qwen3_next" else None,
        )


def is_hybrid(raw: dict) -> bool:
    return raw.get("model_type") in HYBRID_MODEL_TYPES


def text_config(raw: dict) -> dict:
    """The text model's config: `raw` itself, or a composite qwen3_5's `text_config` (no vision)."""
    model_type = raw.get("model_type")
    if model_type != "qwen3_5":
        if model_type not in PROJECTION_LAYOUTS:
            raise CheckpointError(
                f"model_type={model_type!r} is not a hybrid model; expected one of {HYBRID_MODEL_TYPES}"
            )
        return raw
    if raw.get("vision_config") is not None:
        raise CheckpointError(
            "model_type='qwen3_5' with vision parts (vision_config): Arbor serves text only; "
            "use a text-only checkpoint (model_type 'qwen3_5_text')"
        )
    text = raw.get("text_config")
    if not isinstance(text, dict):
        raise CheckpointError("model_type='qwen3_5' config.json has no 'text_config'")
    text = {**text, "model_type": "qwen3_5_text"}
    text.setdefault("tie_word_embeddings", raw.get("tie_word_embeddings", False))
    return text


def _layer_types(raw: dict, num_layers: int) -> tuple[str, ...]:
    """Explicit `layer_types`, or every `full_attention_interval`-th layer full attention (HF's default)."""
    types = raw.get("layer_types")
    if types is None:
        interval = int(raw.get("full_attention_interval", 4))
        types = [FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(num_layers)]
    unknown = sorted(set(types) - {LINEAR_ATTENTION, FULL_ATTENTION})
    if unknown or len(types) != num_layers:
        raise CheckpointError(f"layer_types={types!r}: expected {num_layers} of {LINEAR_ATTENTION}/{FULL_ATTENTION}")
    return tuple(types)


def _moe(raw: dict) -> MoeConfig | None:
    num_experts = int(raw.get("num_experts", 0))
    if num_experts == 0:
        return None
    return MoeConfig(
        num_experts=num_experts,
        num_experts_per_tok=_required(raw, "num_experts_per_tok"),
        moe_intermediate_size=_required(raw, "moe_intermediate_size"),
        shared_expert_intermediate_size=_required(raw, "shared_expert_intermediate_size"),
        norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
        decoder_sparse_step=int(raw.get("decoder_sparse_step", 1)),
        mlp_only_layers=tuple(raw.get("mlp_only_layers") or ()),
    )


def _rope_parameters(raw: dict) -> dict:
    """Both spellings (`rope_parameters`, `rope_scaling`); Qwen3.5's multimodal sections are dropped:
    for text every position stream is the same, so mRoPE is plain RoPE."""
    rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    if "type" in rope and "rope_type" not in rope:
        rope["rope_type"] = rope.pop("type")
    for key in ("mrope_section", "mrope_interleaved"):
        rope.pop(key, None)
    return rope


def _check_supported(raw: dict) -> None:
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"hidden_act={act!r}: the hybrid decoder implements silu only")
    if raw.get("attn_output_gate", True) is not True:
        raise CheckpointError("attn_output_gate=false: the hybrid decoder implements gated attention only")


def _required(raw: dict, key: str) -> int:
    if key not in raw:
        raise CheckpointError(f"config.json is missing {key!r}")
    return int(raw[key])
