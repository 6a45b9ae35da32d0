"""What a model's memory is made of, read from its config: the shapes the capacity arithmetic needs.

Plain arithmetic over the configs (`ModelConfig`, `HybridConfig`); no tensors. Weights split in
two: the linear layers' matrices (held in the weight format: int4, int8, bfloat16, ...) and the
rest (embeddings, norms, DeltaNet convolutions and gates, MoE routers: always dense, in the
activation dtype). A token's K/V comes from the attention layers only; a hybrid's DeltaNet layers
add a fixed recurrent state per lane instead (conv tail + delta-rule state).
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.models.config import ModelConfig
from worker.models.hybrid.config import HybridConfig, is_hybrid

Linear = tuple[int, int, int]  # (count, out_features, in_features)


@dataclass(frozen=True, slots=True)
class ModelShape:
    model_type: str
    max_position_embeddings: int
    linears: tuple[Linear, ...]  # every linear layer's matrix, the lm_head included
    dense_params: int  # embeddings, norms, biases, convolutions, routers: kept in the activation dtype
    num_kv_layers: int  # layers that keep K/V (all of a plain model's, the attention layers of a hybrid)
    num_kv_heads: int
    head_dim: int
    num_state_layers: int = 0  # a hybrid's DeltaNet layers
    conv_elements: int = 0  # per DeltaNet layer: conv_dim * (kernel - 1), the conv tail
    state_elements: int = 0  # per DeltaNet layer: value heads * dk * dv, the delta-rule state
    tied_params: int = 0  # a tied lm_head's matrix: held twice (embedding, head format), one parameter set

    @property
    def num_params(self) -> int:
        """Parameters as the checkpoint counts them (a tied head once)."""
        return self.num_linear_params + self.dense_params - self.tied_params

    @property
    def num_linear_params(self) -> int:
        return sum(count * out * inner for count, out, inner in self.linears)


def model_shape(raw: dict) -> ModelShape:
    """The shape of the model a Hugging Face `config.json` dict describes (any supported family)."""
    if is_hybrid(raw):
        return hybrid_shape(HybridConfig.from_hf(raw))
    return plain_shape(ModelConfig.from_hf(raw))


def plain_shape(config: ModelConfig) -> ModelShape:
    """Llama / Qwen2 / Qwen3: q, k, v, o and a gated MLP per layer; every layer keeps K/V."""
    hidden, heads, kv_heads, d = (
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    )
    layers, inner = config.num_hidden_layers, config.intermediate_size
    linears = [
        (layers, heads * d, hidden),  # q_proj
        (2 * layers, kv_heads * d, hidden),  # k_proj, v_proj
        (layers, hidden, heads * d),  # o_proj
        (2 * layers, inner, hidden),  # gate_proj, up_proj
        (layers, hidden, inner),  # down_proj
        (1, config.vocab_size, hidden),  # lm_head (tied: the embedding's matrix, also held as the head)
    ]
    per_layer = 2 * hidden  # input and post-attention norms
    per_layer += 2 * d if config.qk_norm else 0
    per_layer += (heads + 2 * kv_heads) * d if config.attention_bias else 0
    per_layer += 2 * inner + hidden if config.mlp_bias else 0
    dense = config.vocab_size * hidden + layers * per_layer + hidden  # embeddings, layers, final norm
    tied = config.vocab_size * hidden if config.tie_word_embeddings else 0
    return ModelShape(
        config.model_type, config.max_position_embeddings, tuple(linears), dense, layers, kv_heads, d, tied_params=tied
    )


def hybrid_shape(config: HybridConfig) -> ModelShape:
    """Qwen3.5 / Qwen3-Next: gated attention layers keep K/V; DeltaNet layers keep a fixed state."""
    hidden = config.hidden_size
    num_attention, num_linear = len(config.attention_layers), len(config.linear_layers)
    linears = [*_attention_linears(config, num_attention), *_deltanet_linears(config, num_linear)]
    linears += _mlp_linears(config)
    linears.append((1, config.vocab_size, hidden))  # lm_head
    dense = config.vocab_size * hidden + config.num_hidden_layers * 2 * hidden + hidden  # embeddings, norms
    dense += num_attention * (2 * config.head_dim + _attention_biases(config))  # q_norm, k_norm
    dense += num_linear * _deltanet_dense(config)
    dense += _router_params(config)
    return ModelShape(
        config.model_type,
        config.max_position_embeddings,
        tuple(linears),
        dense,
        num_attention,
        config.num_key_value_heads,
        config.head_dim,
        num_linear,
        config.conv_dim * (config.linear_conv_kernel_dim - 1),
        config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim,
        config.vocab_size * hidden if config.tie_word_embeddings else 0,
    )


def _attention_linears(config: HybridConfig, count: int) -> list[Linear]:
    hidden, d = config.hidden_size, config.head_dim
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    return [
        (count, 2 * heads * d, hidden),  # q_proj: the query and the output gate, side by side
        (2 * count, kv_heads * d, hidden),  # k_proj, v_proj
        (count, hidden, heads * d),  # o_proj
    ]


def _attention_biases(config: HybridConfig) -> int:
    heads, kv_heads, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    return (2 * heads + 2 * kv_heads) * d + config.hidden_size if config.attention_bias else 0


def _deltanet_linears(config: HybridConfig, count: int) -> list[Linear]:
    """Both layouts hold the same rows: q, k, v, z (in_proj_qkvz or qkv + z) and b, a (in_proj_ba or b + a)."""
    hidden, num_v = config.hidden_size, config.linear_num_value_heads
    value_dim = num_v * config.linear_value_head_dim
    return [
        (count, config.conv_dim + value_dim, hidden),  # q, k, v and the output gate z
        (count, 2 * num_v, hidden),  # b (the write strength) and a (the decay)
        (count, hidden, value_dim),  # out_proj
    ]


def _deltanet_dense(config: HybridConfig) -> int:
    """conv1d [conv_dim, 1, kernel], dt_bias and A_log [value heads], the gated norm [dv]."""
    num_v = config.linear_num_value_heads
    return config.conv_dim * config.linear_conv_kernel_dim + 2 * num_v + config.linear_value_head_dim


def _mlp_linears(config: HybridConfig) -> list[Linear]:
    hidden, moe = config.hidden_size, config.moe
    num_sparse = sum(config.is_sparse_layer(i) for i in range(config.num_hidden_layers))
    num_dense = config.num_hidden_layers - num_sparse
    linears: list[Linear] = [
        (2 * num_dense, config.intermediate_size, hidden),
        (num_dense, hidden, config.intermediate_size),
    ]
    if moe is None or num_sparse == 0:
        return linears
    experts, shared = num_sparse * moe.num_experts, moe.shared_expert_intermediate_size
    return linears + [
        (2 * experts, moe.moe_intermediate_size, hidden),  # every expert's gate_proj, up_proj
        (experts, hidden, moe.moe_intermediate_size),  # down_proj
        (2 * num_sparse, shared, hidden),  # the shared expert's gate_proj, up_proj
        (num_sparse, hidden, shared),
    ]


def _router_params(config: HybridConfig) -> int:
    """Per sparse layer: the router [experts, hidden] and the shared expert's gate [1, hidden]."""
    moe = config.moe
    if moe is None:
        return 0
    num_sparse = sum(config.is_sparse_layer(i) for i in range(config.num_hidden_layers))
    return num_sparse * (moe.num_experts + 1) * config.hidden_size
