"""The decoder's configuration, read from a Hugging Face `config.json` dict.

One small dataclass covers the Llama, Qwen2 and Qwen3 families; the differences between them
are flags (`qk_norm`, `attention_bias`) rather than subclasses.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.models.checkpoint import CheckpointError

# model_type -> (q/k/v bias by default, per-head q/k RMSNorm)
FAMILIES: dict[str, tuple[bool, bool]] = {
    "llama": (False, False),
    "mistral": (False, False),
    "qwen2": (True, False),
    "qwen3": (False, True),
}


@dataclass(slots=True, frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None  # HF rope parameters with "rope_type"; None for plain RoPE
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    qk_norm: bool

    @classmethod
    def from_hf(cls, raw: dict) -> ModelConfig:
        model_type = raw.get("model_type", "")
        if model_type not in FAMILIES:
            raise CheckpointError(
                f"unsupported architecture model_type={model_type!r}; supported: {', '.join(sorted(FAMILIES))}"
            )
        default_bias, qk_norm = FAMILIES[model_type]
        num_heads = _required(raw, "num_attention_heads")
        hidden_size = _required(raw, "hidden_size")
        rope = _rope_parameters(raw)
        return cls(
            model_type=model_type,
            vocab_size=_required(raw, "vocab_size"),
            hidden_size=hidden_size,
            intermediate_size=_required(raw, "intermediate_size"),
            num_hidden_layers=_required(raw, "num_hidden_layers"),
            num_attention_heads=num_heads,
            num_key_value_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=raw.get("head_dim") or hidden_size // num_heads,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 10000.0))),
            rope_scaling=rope if rope.get("rope_type", "default") != "default" else None,
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", default_bias)),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            qk_norm=qk_norm,
        )


def _rope_parameters(raw: dict) -> dict:
    """Both spellings: `rope_scaling` (transformers 4.x) and `rope_parameters` (5.x)."""
    rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    if "type" in rope and "rope_type" not in rope:
        rope["rope_type"] = rope.pop("type")
    return rope


def _required(raw: dict, key: str) -> int:
    if key not in raw:
        raise CheckpointError(f"config.json is missing {key!r}")
    return int(raw[key])
