"""The hybrid decoder (Qwen3.5, Qwen3-Next): gated DeltaNet layers with a gated-attention layer
every few, dense or sparse MLPs, zero-centred RMSNorms.

Its forward and forward_lanes have the plain decoder's signatures and contract
(worker/models/decoder.py), so the model runner serves it unchanged, several lanes in one
forward: each lane's new tokens after its cache's committed ones, optional logits for its last
n, hidden states of requested layers; nothing is committed until the caller commits.
The recurrent layers choose their form by what the caller may commit: a tree, or a short forward
with logits (decode, verification), runs the per-token recurrence and keeps the state after each
token (in a tree each node continues its parent's state); anything else (a prefill chunk, a long
scoring forward: committed whole) runs the chunked form.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from worker.models.decoder import ForwardOutput, LaneRows, Span, embedding, lane_logits, lane_spans
from worker.models.hybrid.config import LINEAR_ATTENTION, HybridConfig
from worker.models.hybrid.gated_attention import GatedAttention, partial_rotary
from worker.models.hybrid.gated_deltanet import GatedDeltaNet, RecurrentLane
from worker.models.hybrid.hybrid_cache import HybridCache
from worker.models.hybrid.hybrid_pool import PagedHybridCache
from worker.models.hybrid.moe import SparseMoe, SwiGLU
from worker.models.hybrid.norms import ZeroCentredRMSNorm
from worker.models.hybrid.state_pool import StatePool
from worker.models.linear import Linear
from worker.models.planned_linear import PlannedLinear
from worker.models.refined_head import TopKRefinedHead
from worker.models.rope import RotaryEmbedding

# The most new tokens a forward may commit in part (a verification: root + draft nodes). Keeping
# every position's delta-rule state costs heads * dk * dv per token and layer, so longer
# forwards keep only their last.
MAX_VERIFY_TOKENS = 64


class HybridLayer(nn.Module):
    def __init__(self, config: HybridConfig, index: int):
        super().__init__()
        self.is_linear = config.layer_types[index] == LINEAR_ATTENTION
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(config)
        else:
            self.self_attn = GatedAttention(config)
        sparse = config.moe if config.is_sparse_layer(index) else None
        self.mlp: nn.Module = (
            SparseMoe(config.hidden_size, sparse) if sparse else SwiGLU(config.hidden_size, config.intermediate_size)
        )
        self.input_layernorm = ZeroCentredRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = ZeroCentredRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,  # [R, hidden]: the step's rows, lane by lane
        cos: torch.Tensor,
        sin: torch.Tensor,
        slot: int,  # this layer's index among the caches' attention (K/V) or linear (recurrent) layers
        lanes: list[HybridLane],
    ) -> torch.Tensor:
        h = self.input_layernorm(x)
        if self.is_linear:
            h = self.linear_attn(h, slot, [lane.recurrent for lane in lanes])
        else:
            h = self.self_attn(h, cos, sin, slot, [lane.span for lane in lanes])
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


@dataclass(slots=True)
class HybridLane:
    """One lane's rows, as its attention layers (span) and its recurrent layers see them."""

    span: Span
    recurrent: RecurrentLane


class HybridBody(nn.Module):
    """The `model.*` part of a checkpoint: embeddings, layers, final norm."""

    def __init__(self, config: HybridConfig):
        super().__init__()
        self.embed_tokens = embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(HybridLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = ZeroCentredRMSNorm(config.hidden_size, config.rms_norm_eps)


class HybridDecoder(nn.Module):
    def __init__(self, config: HybridConfig):
        super().__init__()
        self.config = config
        self.model = HybridBody(config)
        self.lm_head: nn.Module = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # layer index -> its slot among the attention layers (K/V) or the linear ones (recurrent state)
        self.slots = {
            i: slot for kind in (config.attention_layers, config.linear_layers) for slot, i in enumerate(kind)
        }
        self.rotary: RotaryEmbedding | None = None

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    def head_weight(self) -> torch.Tensor:
        """lm_head's weight [vocab, hidden] as a dense tensor (for a drafter's vocabulary subset)."""
        head = self.lm_head
        if isinstance(head, nn.Linear):
            return head.weight
        assert isinstance(head, PlannedLinear | TopKRefinedHead), type(head)
        return head.dense_weight()

    def new_cache(self, max_tokens: int) -> HybridCache:
        return HybridCache(self.config, max_tokens, self.dtype, self.device)

    def cache_bytes(self, max_tokens: int) -> int:
        """What `new_cache(max_tokens)` holds: K/V of the attention layers plus the fixed recurrent state."""
        return HybridCache.bytes_for(self.config, max_tokens, self.dtype)

    def state_bytes(self) -> int:
        """One lane's recurrent state (conv tails + delta-rule states), whatever its length."""
        return StatePool.slot_bytes(self.config, self.dtype)

    @torch.inference_mode()
    def forward(
        self,
        token_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        cache: HybridCache | PagedHybridCache,
        tree_mask: torch.Tensor | None = None,
        hidden_layers: Sequence[int] = (),
        num_logits: int | None = None,  # logits for the last n tokens only (None: all, 0: none)
        want_final_hidden: bool = False,
    ) -> ForwardOutput:
        lane = LaneRows(token_ids.tolist(), positions.tolist(), cache, tree_mask, num_logits)
        return self.forward_lanes([lane], hidden_layers, want_final_hidden)[0]

    @torch.inference_mode()
    def forward_lanes(
        self, lanes: Sequence[LaneRows], hidden_layers: Sequence[int] = (), want_final_hidden: bool = False
    ) -> list[ForwardOutput]:
        """One forward over the new rows of every lane (each lane's cache a HybridCache, or a
        PagedHybridCache in the block pool): norms,
        projections and MLPs over all rows at once, attention and recurrence per lane."""
        if self.rotary is None or self.rotary.dtype != self.dtype:
            self.rotary = partial_rotary(self.config, self.dtype, self.device)
        spans = lane_spans(lanes, self.device)
        hybrid_lanes = [HybridLane(span, _recurrent_lane(lane, span)) for lane, span in zip(lanes, spans, strict=True)]
        positions = [position for lane in lanes for position in lane.positions]
        cos, sin = self.rotary(torch.tensor(positions, device=self.device))
        wanted, hidden = set(hidden_layers), {}
        x = self.model.embed_tokens(torch.tensor([t for lane in lanes for t in lane.token_ids], device=self.device))
        for index, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, self.slots[index], hybrid_lanes)  # [R, hidden]
            if index in wanted:
                hidden[index] = x
        x = self.model.norm(x)
        outputs = []
        logits_by_lane = lane_logits(self.lm_head, x, lanes, spans, self.config.vocab_size)
        for span, logits in zip(spans, logits_by_lane, strict=True):
            rows = slice(span.first_row, span.end_row)
            lane_hidden = {layer: h[rows] for layer, h in hidden.items()}
            outputs.append(ForwardOutput(logits, lane_hidden, x[rows] if want_final_hidden else None))
        return outputs


def _recurrent_lane(lane: LaneRows, span: Span) -> RecurrentLane:
    """What the recurrent layers keep for a lane: every row's state where it may be committed in
    part (a tree; a short forward with logits: decode, verification), else only the last."""
    cache = lane.cache
    assert isinstance(cache, HybridCache | PagedHybridCache), type(cache)
    parents = None if lane.tree_mask is None else tree_parents(lane.tree_mask)
    every_position = parents is not None or (lane.num_logits != 0 and span.num_rows <= MAX_VERIFY_TOKENS)
    snapshot_every = None if every_position else cache.snapshot_every
    return RecurrentLane(
        cache.recurrent, span.first_row, span.num_rows, every_position, parents, span.start, snapshot_every
    )


def tree_parents(tree_mask: torch.Tensor) -> list[int]:
    """Row i's parent: its nearest ancestor (-1 for none), the last earlier column its row sees.

    Draft trees list parents before children (speculation/tree.py), so a row's ancestors are
    earlier rows and the nearest one has the largest index. Example: root, two children, a
    grandchild under the second: rows [[1,0,0,0], [1,1,0,0], [1,0,1,0], [1,0,1,1]] -> [-1, 0, 0, 2].
    """
    rows = tree_mask.tolist()
    return [max((j for j in range(i) if row[j]), default=-1) for i, row in enumerate(rows)]
