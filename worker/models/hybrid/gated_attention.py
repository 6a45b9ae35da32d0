"""The hybrid models' full-attention layer: Qwen3-style attention with three differences.

- an output gate: q_proj yields, per head, the query and a gate; the attention output is
  multiplied by sigmoid(gate) before o_proj;
- partial RoPE: only the first head_dim * partial_rotary_factor dims of q and k are rotated;
- zero-centred q/k norms (norms.py).

K/V live in each lane's cache exactly as in the plain decoder (slots after the committed length);
a forward serves the rows of several lanes at once, as the plain decoder's attention does.
"""

from __future__ import annotations

import torch
from torch import nn

from worker.models.config import ModelConfig
from worker.models.decoder import Span, grouped_attention
from worker.models.hybrid.config import HybridConfig
from worker.models.hybrid.norms import ZeroCentredRMSNorm
from worker.models.linear import Linear
from worker.models.rope import RotaryEmbedding, apply_rotary


def partial_rotary(config: HybridConfig, dtype: torch.dtype, device: torch.device | str) -> RotaryEmbedding:
    """cos/sin tables over the rotated dims only: rope.py's tables for a head of `rotary_dim`."""
    return RotaryEmbedding(attention_view(config, config.num_hidden_layers, config.rotary_dim), dtype, device)


def attention_view(config: HybridConfig, num_layers: int, head_dim: int) -> ModelConfig:
    """The gated attention's sizes as a plain decoder's config, for the plain parts it shares
    (rope.py's tables, a KVCache of `num_layers` attention layers)."""
    return ModelConfig(
        model_type=config.model_type,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=head_dim,
        rms_norm_eps=config.rms_norm_eps,
        rope_theta=config.rope_theta,
        rope_scaling=config.rope_scaling,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        attention_bias=config.attention_bias,
        mlp_bias=False,
        qk_norm=True,
    )


def rotate_leading(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [heads, T, head_dim] with its first cos.shape[-1] dims rotated, the rest passed through."""
    rotary_dim = cos.shape[-1]
    return torch.cat((apply_rotary(x[..., :rotary_dim], cos, sin), x[..., rotary_dim:]), dim=-1)


class GatedAttention(nn.Module):
    def __init__(self, config: HybridConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim = config.head_dim
        bias = config.attention_bias
        self.q_proj = Linear(config.hidden_size, 2 * self.num_heads * head_dim, bias=bias)  # query and gate
        self.k_proj = Linear(config.hidden_size, self.num_kv_heads * head_dim, bias=bias)
        self.v_proj = Linear(config.hidden_size, self.num_kv_heads * head_dim, bias=bias)
        self.o_proj = Linear(self.num_heads * head_dim, config.hidden_size, bias=bias)
        self.q_norm = ZeroCentredRMSNorm(head_dim, config.rms_norm_eps)
        self.k_norm = ZeroCentredRMSNorm(head_dim, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,  # [R, hidden]: the rows of one or several lanes, lane by lane
        cos: torch.Tensor,  # [R, rotary_dim]
        sin: torch.Tensor,
        slot: int,  # this layer's index among the caches' attention layers
        spans: list[Span],  # where each lane's rows sit, its cache, its committed length, its mask
    ) -> torch.Tensor:
        """One q/k/v and one o product for every row; attention per lane over its own K/V (its new
        K/V written to slots after its committed tokens, as in the plain decoder)."""
        num_rows, head_dim = x.shape[0], self.head_dim
        q, gate = self.q_proj(x).view(num_rows, self.num_heads, 2 * head_dim).split(head_dim, dim=-1)
        q = rotate_leading(self.q_norm(q).transpose(0, 1), cos, sin)  # [heads, R, d]
        k = self.k_norm(self.k_proj(x).view(num_rows, self.num_kv_heads, head_dim)).transpose(0, 1)
        k = rotate_leading(k, cos, sin)  # [kv_heads, R, d]
        v = self.v_proj(x).view(num_rows, self.num_kv_heads, head_dim).transpose(0, 1)
        outs = []
        for span in spans:
            rows = slice(span.first_row, span.end_row)
            keys, values = span.cache.layer_kv(slot, span.start, k[:, rows], v[:, rows])
            outs.append(grouped_attention(q[:, rows], keys, values, span.mask))
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)  # [heads, R, d]
        out = out.transpose(0, 1).reshape(num_rows, -1) * torch.sigmoid(gate.reshape(num_rows, -1))
        return self.o_proj(out)
