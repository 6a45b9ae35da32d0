"""The hybrid models' MLPs: a dense SwiGLU, and Qwen3-Next's sparse mixture of experts.

The sparse block, per token: a router scores every expert (softmax in float32), the top k are
kept (renormalised to sum to 1 when `norm_topk_prob`), their SwiGLU outputs are summed with those
weights, and a shared expert, scaled by sigmoid(shared_expert_gate(x)), is added for every token.
Experts are stored as checkpoints store them (`experts.{i}.gate_proj`, ...), so names load as they are.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from worker.models.hybrid.config import MoeConfig
from worker.models.linear import Linear


class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    def __init__(self, hidden_size: int, moe: MoeConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(moe.num_experts, hidden_size))
        self.top_k = moe.num_experts_per_tok
        self.norm_topk_prob = moe.norm_topk_prob

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per token, the chosen experts [T, k] and their weights [T, k] (in x's dtype)."""
        logits = F.linear(x, self.weight)  # [T, experts]
        probs = torch.softmax(logits, dim=-1, dtype=torch.promote_types(x.dtype, torch.float32))
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return experts, weights.to(x.dtype)


class SparseMoe(nn.Module):
    def __init__(self, hidden_size: int, moe: MoeConfig):
        super().__init__()
        self.gate = Router(hidden_size, moe)
        self.experts = nn.ModuleList(SwiGLU(hidden_size, moe.moe_intermediate_size) for _ in range(moe.num_experts))
        self.shared_expert = SwiGLU(hidden_size, moe.shared_expert_intermediate_size)
        self.shared_expert_gate = Linear(hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        experts, weights = self.gate(x)  # [T, k] each
        out = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)  # [T, hidden]
        routed = torch.zeros_like(x)
        for expert in experts.unique().tolist():  # ascending, as the reference sums them
            tokens, slot = torch.where(experts == expert)
            contribution = self.experts[expert](x[tokens]) * weights[tokens, slot, None]
            routed.index_add_(0, tokens, contribution)
        return routed + out
