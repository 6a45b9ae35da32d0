"""The MTP head of a hybrid target (Qwen3.5, Qwen3-Next), built from the hybrid model's own parts.

The tensor names are the plain decoders' head's (mtp.py); shapes and math are a hybrid layer's,
as vLLM's qwen3_next_mtp and qwen3_5_mtp build the head:
    mtp.fc.weight                        [hidden, 2 * hidden], input cat[embedding, hidden]
    mtp.pre_fc_norm_embedding.weight, mtp.pre_fc_norm_hidden.weight, mtp.norm.weight
                                         zero-centred RMSNorms (scale 1 + w), like every hybrid norm
    mtp.layers.0.*                       a full-attention hybrid layer: gated attention (output
                                         gate, partial RoPE, zero-centred q/k norms) and the MLP a
                                         layer at index 0 has (Qwen3-Next: sparse MoE with a shared
                                         expert unless layer 0 is mlp-only; Qwen3.5: dense SwiGLU)

The layer is built as index 0 whatever the target's layer_types say: the checkpoints' head is a
full-attention layer, and vLLM reads the MLP kind from that index. Its K/V live in a plain
one-layer KVCache of the target's attention sizes; the head has no recurrent state.
"""

from __future__ import annotations

import torch
from torch import nn

from worker.models.decoder import Span
from worker.models.hybrid.config import HybridConfig
from worker.models.hybrid.gated_attention import GatedAttention
from worker.models.hybrid.moe import SparseMoe, SwiGLU
from worker.models.hybrid.norms import ZeroCentredRMSNorm
from worker.models.kv_pool import PackedRows
from worker.models.linear import Linear

MTP_LAYER_INDEX = 0


class HybridMtpLayer(nn.Module):
    def __init__(self, config: HybridConfig):
        super().__init__()
        size, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = GatedAttention(config)
        sparse = config.moe if config.is_sparse_layer(MTP_LAYER_INDEX) else None
        self.mlp: nn.Module = SparseMoe(size, sparse) if sparse else SwiGLU(size, config.intermediate_size)
        self.input_layernorm = ZeroCentredRMSNorm(size, eps)
        self.post_attention_layernorm = ZeroCentredRMSNorm(size, eps)

    def forward_lanes(
        self,
        x: torch.Tensor,  # [R, hidden]: several lanes' rows, lane by lane
        cos: torch.Tensor,  # [R, rotary_dim]
        sin: torch.Tensor,
        layer: int,
        spans: list[Span],
        packed: PackedRows | None = None,
    ) -> torch.Tensor:
        """DecoderLayer.forward_lanes' contract: attention per lane over its own cache."""
        assert packed is None, "the head's caches are its own KVCaches, never a block pool's"
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, layer, spans)
        return x + self.mlp(self.post_attention_layernorm(x))


class HybridMtpHead(nn.Module):
    """The `mtp.*` tensors of a hybrid checkpoint as a module (parameter names without the prefix)."""

    def __init__(self, config: HybridConfig):
        super().__init__()
        size, eps = config.hidden_size, config.rms_norm_eps
        self.fc = Linear(2 * size, size, bias=False)
        self.pre_fc_norm_embedding = ZeroCentredRMSNorm(size, eps)
        self.pre_fc_norm_hidden = ZeroCentredRMSNorm(size, eps)
        self.layers = nn.ModuleList([HybridMtpLayer(config)])
        self.norm = ZeroCentredRMSNorm(size, eps)
