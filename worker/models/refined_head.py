"""An lm_head that scores the whole vocabulary in a fast format and its best candidates exactly.

Why: the body in int4 straight from a Q4 GGUF is close to the float32 model (greedy output on 6
prompts x 32 tokens identical to the float32 path with a float32 head), but the head is not: the
kernels return bfloat16, whose logits are ~0.06-0.125 apart at SmolLM2's scale, and an int4 copy of
a Q8_0 embedding moves them further (4/6 prompts identical with a bfloat16 or int8 head, 0/6
with int4). A float32 head reads 113 MB a step, three times the rest of the model.

So: logits for every token from the fast head ([T, vocab], bfloat16 rounded), then the
`num_candidates` best of each row recomputed in float32 from the dense weight (the tied
embedding, already resident) and written over them. Greedy decoding picks the float32 argmax
whenever it is among the fast head's candidates; sampling sees exact logits where the mass is.
Each row is refined on its own, so a verification forward and plain decoding agree row for row.
"""

from __future__ import annotations

import torch
from torch import nn

from worker.models.planned_linear import PlannedLinear

DEFAULT_NUM_CANDIDATES = 32


class TopKRefinedHead(nn.Module):
    def __init__(self, head: PlannedLinear, weight: torch.Tensor, num_candidates: int = DEFAULT_NUM_CANDIDATES):
        super().__init__()
        self.head = head
        self.weight = weight  # [vocab, hidden] dense, the exact values (shared with the embedding when tied)
        self.num_candidates = num_candidates
        self.in_features, self.out_features = head.in_features, head.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.head(x)  # [T, vocab] (or [vocab] for one hidden state), in x's dtype
        if x.dim() != 2:
            return self.forward(x.reshape(1, -1))[0]
        candidates = logits.topk(self.num_candidates, dim=-1).indices  # [T, k]
        rows = self.weight[candidates].to(x.dtype)  # [T, k, hidden]
        # a product and a sum over the last dimension, not bmm: each row's sum then runs in the same
        # order whatever the number of rows (bmm's kernel choice depends on it), so a row's logits
        # are the same bits decoded alone or verified among others
        exact = (rows * x.unsqueeze(1)).sum(-1)  # [T, k]
        return logits.scatter_(-1, candidates, exact.to(logits.dtype))

    def dense_weight(self) -> torch.Tensor:
        return self.weight
