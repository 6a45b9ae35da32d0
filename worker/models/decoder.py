"""One decoder for the Llama, Qwen2 and Qwen3 families, in plain PyTorch.

Parameter names match Hugging Face checkpoints, so a state dict loads without renaming.
A forward runs the new rows of one or several lanes (`LaneRows`) at once: the linear layers see
every row of the step in one product, attention runs over each lane's own K/V (its cache, its
length, its causal or tree mask), and logits are computed only for the rows that choose tokens.

A decoder built in fast weight formats (fast_weights.py) has q/k/v fused into one `qkv_proj` and
gate/up into one `gate_up_proj`: one kernel call instead of three (two) per layer, which on a
CPU at one row is a visible share of a 135M model's step (eager per-op overhead, ~10 us a call).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from worker.kernels.fused_layers import FusedLayers, RowTables
from worker.models.attention import grouped_attention
from worker.models.config import ModelConfig
from worker.models.kv_cache import KVCache
from worker.models.kv_pool import PackedRows, PagedKVCache
from worker.models.linear import Linear
from worker.models.planned_linear import PlannedLinear
from worker.models.refined_head import TopKRefinedHead
from worker.models.rope import RotaryEmbedding, apply_rotary

MIN_PACKED_LANES = 2
MAX_PACKED_ROWS = 16  # verification widths; a longer prefill chunk attends on its own (padding others to it costs more)


class LaneCache(Protocol):
    """What a forward needs of a lane's cache: KVCache, or the pool's PagedKVCache."""

    length: int
    max_tokens: int

    def layer_kv(
        self, layer: int, start: int, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def reserve(self, num_tokens: int) -> None:
        """Room for tokens [0, num_tokens): a growing buffer grows, a pool lane takes its blocks."""


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in at least float32 (as the reference does) but never below the input's precision.
        compute = torch.promote_types(x.dtype, torch.float32)
        h = x if x.dtype == compute else x.to(compute)  # no call where nothing converts: 1 row is all overhead
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * (h if h.dtype == x.dtype else h.to(x.dtype))


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        bias = config.attention_bias
        self.q_proj = Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj: nn.Module = Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        self.q_norm: RMSNorm | None
        self.k_norm: RMSNorm | None
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.qkv_proj: nn.Module | None = None  # q, k and v stacked by rows, when fused
        self.qkv_sizes = (
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
        )

    def rotated_qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [heads, T, d] and k [kv_heads, T, d] normed (Qwen3) and rotated; v [T, kv_heads, d]."""
        num_tokens, head_dim = x.shape[0], self.head_dim
        if self.qkv_proj is not None and self.q_norm is None:
            # fused: q and k are adjacent columns of one product, so one rotary call does both
            qkv = self.qkv_proj.forward(x)  # [T, (heads + 2 kv_heads) * d]
            num_qk = self.num_heads + self.num_kv_heads
            qk = qkv[:, : num_qk * head_dim].view(num_tokens, num_qk, head_dim).transpose(0, 1)
            qk = apply_rotary(qk, cos, sin)  # [heads + kv_heads, T, d]
            v = qkv[:, num_qk * head_dim :].view(num_tokens, self.num_kv_heads, head_dim)
            return qk[: self.num_heads], qk[self.num_heads :], v
        if self.qkv_proj is not None:
            q, k, v = self.qkv_proj.forward(x).split(self.qkv_sizes, dim=-1)  # views of one [T, q + 2 kv] product
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        shape = (num_tokens, -1, head_dim)
        q, k, v = q.view(shape), k.view(shape), v.view(shape)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rotary(q.transpose(0, 1), cos, sin), apply_rotary(k.transpose(0, 1), cos, sin), v

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        layer_keys: torch.Tensor,
        layer_values: torch.Tensor,
        start: int,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.rotated_qkv(x, cos, sin)
        end = start + num_tokens
        layer_keys[:, start:end] = k
        layer_values[:, start:end] = v.transpose(0, 1)
        out = grouped_attention(q, layer_keys[:, :end], layer_values[:, :end], mask)  # [heads, T, head_dim]
        return self.o_proj.forward(out.transpose(0, 1).reshape(num_tokens, -1))

    def forward_lanes(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        layer: int,
        spans: list[Span],
        packed: PackedRows | None = None,
    ) -> torch.Tensor:
        """Rows of several lanes ([R, hidden], lane by lane): one q/k/v and one o product for all,
        attention per lane over its own K/V (ragged lengths, each lane its own mask)."""
        cache = spans[0].cache
        if (
            len(spans) == 1 and isinstance(cache, KVCache) and packed is None and spans[0].num_rows == x.shape[0]
        ):  # one lane in its own buffer, no padding rows: the plain path
            return self.forward(x, cos, sin, cache.keys[layer], cache.values[layer], spans[0].start, spans[0].mask)
        num_rows = x.shape[0]
        q, k, v = self.rotated_qkv(x, cos, sin)  # [heads, R, d], [kv_heads, R, d], [R, kv_heads, d]
        v = v.transpose(0, 1)  # [kv_heads, R, d]
        outs: list[torch.Tensor | None] = []
        for span in spans:
            if packed is not None and span.packed:
                outs.append(None)
                continue
            rows = slice(span.first_row, span.end_row)
            keys, values = span.cache.layer_kv(layer, span.start, k[:, rows], v[:, rows])
            outs.append(grouped_attention(q[:, rows], keys, values, span.mask))
        if packed is None:
            out = torch.cat([o for o in outs if o is not None], dim=1) if len(outs) > 1 else outs[0]
            assert out is not None
            if out.shape[1] < num_rows:  # a bucket's padding rows (Decoder.decode_buckets) attend to nothing
                out = torch.cat((out, out.new_zeros(out.shape[0], num_rows - out.shape[1], out.shape[2])), dim=1)
        else:
            picked = packed.rows
            out = q.new_zeros(q.shape)  # [heads, R, d]
            out[:, picked] = packed.attend(layer, q, k[:, picked], v[:, picked])
            for span, lane_out in zip(spans, outs, strict=True):
                if lane_out is not None:
                    out[:, span.first_row : span.end_row] = lane_out
        assert out is not None
        return self.o_proj.forward(out.transpose(0, 1).reshape(num_rows, -1))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        size, inner, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = Linear(size, inner, bias=bias)
        self.up_proj = Linear(size, inner, bias=bias)
        self.down_proj: nn.Module = Linear(inner, size, bias=bias)
        self.gate_up_proj: nn.Module | None = None  # gate and up stacked by rows, when fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # .forward: these are plain layers without hooks; a __call__ each is ~2 us at one row
        if self.gate_up_proj is not None:
            # silu and the product in the activation dtype: kept in bfloat16 between the kernels
            # they saved ~0.7 ms a step but cost greedy agreement (11/20 prompts, 0.71, vs 13/20, 0.85)
            gate, up = self.gate_up_proj.forward(x).chunk(2, dim=-1)  # [T, inner] each
            return self.down_proj.forward(F.silu(gate) * up)
        return self.down_proj.forward(F.silu(self.gate_proj.forward(x)) * self.up_proj.forward(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, layer_keys, layer_values, start, mask) -> torch.Tensor:
        # .forward, not __call__: no hooks are used here, and at one row on a CPU each nn.Module
        # call's dispatch (~2 us) is a visible share of the step (4 a layer)
        h = self.self_attn.forward(self.input_layernorm.forward(x), cos, sin, layer_keys, layer_values, start, mask)
        x = x + h
        return x + self.mlp.forward(self.post_attention_layernorm.forward(x))

    def forward_lanes(self, x, cos, sin, layer: int, spans: list[Span], packed: PackedRows | None) -> torch.Tensor:
        x = x + self.self_attn.forward_lanes(self.input_layernorm.forward(x), cos, sin, layer, spans, packed)
        return x + self.mlp.forward(self.post_attention_layernorm.forward(x))


def embedding(num_embeddings: int, embedding_dim: int) -> nn.Embedding:
    """nn.Embedding, randomly initialised only off the meta device. Why: the loaders build decoders
    on "meta", where normal_ runs torch's Python reference, whose first call imports torch._dynamo:
    3 s of a quiet worker's start-up, 18 s of a busy one's, for values the checkpoint replaces."""
    weight = torch.empty(num_embeddings, embedding_dim)
    if not weight.is_meta:
        nn.init.normal_(weight)
    return nn.Embedding(num_embeddings, embedding_dim, _weight=weight)


class DecoderBody(nn.Module):
    """The `model.*` part of a checkpoint: embeddings, layers, final norm."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


@dataclass(slots=True)
class LaneRows:
    """One lane's new rows in a forward: they follow the lane's committed tokens in `cache`."""

    token_ids: list[int]
    positions: list[int]
    cache: LaneCache
    tree_mask: torch.Tensor | None = None  # [T, T] bool: may new token i attend to new token j (None: causal)
    num_logits: int | None = None  # logits for the last n rows only (None: all, 0: none)


@dataclass(slots=True)
class Span:
    """Where a lane's rows sit in the step's rows, and what its attention reads."""

    cache: LaneCache
    start: int  # the lane's committed length: its new K/V go to slots [start, start + num_rows)
    first_row: int
    num_rows: int
    mask: torch.Tensor | None  # [T, start + T] or None (one row sees everything)
    packed: bool = False  # its rows attend together with the step's other few-row lanes (PackedRows)

    @property
    def end_row(self) -> int:
        return self.first_row + self.num_rows


@dataclass(slots=True)
class ForwardOutput:
    logits: torch.Tensor  # [num_logits, vocab]
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # layer index -> [T, hidden] (output of that layer)
    final_hidden: torch.Tensor | None = None  # [T, hidden], after the final norm


def _packed_rows(spans: list[Span]) -> PackedRows | None:
    """The step's lanes in a block pool with few rows (decode and verification, not prefill
    chunks), to attend together (two or more of them)."""
    candidates = [
        (span, span.cache)
        for span in spans
        if span.num_rows <= MAX_PACKED_ROWS and isinstance(span.cache, PagedKVCache)
    ]
    if len(candidates) < MIN_PACKED_LANES:
        return None
    caches: list[PagedKVCache] = []
    first_rows: list[int] = []
    masks: list[torch.Tensor | None] = []
    pool = candidates[0][1].pool
    for span, cache in candidates:
        if cache.pool is pool:
            span.packed = True
            caches.append(cache)
            first_rows.append(span.first_row)
            masks.append(span.mask)
    return PackedRows(pool, caches, first_rows, masks)


# vLLM's shape of decode buckets: small batches one by one, then every 8 rows.
DECODE_BUCKETS = (1, 2, 4, *range(8, 257, 8))


class Decoder(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = DecoderBody(config)
        self.lm_head: nn.Module = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary: RotaryEmbedding | None = None
        self.activation_dtype: torch.dtype | None = None  # set where the linears' formats differ from it
        # Row counts a decode step is padded up to (DECODE_BUCKETS where set, on CUDA): a step's
        # linear layers, norms and MLP then run in a few fixed shapes, the pieces a CUDA graph can
        # capture around the attention (as vLLM's piecewise graphs do). None: exactly its rows.
        self.decode_buckets: tuple[int, ...] | None = None
        self.fused: FusedLayers | None = None  # every layer in one native call (worker/kernels/fused_layers.py)

    @property
    def dtype(self) -> torch.dtype:
        """The activation dtype: residual stream, norms, attention, KV cache."""
        return self.activation_dtype or self.model.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    def _bucket_padding(self, lanes: Sequence[LaneRows], num_rows: int) -> int:
        """Rows to pad a decode step with, up to its bucket (0: not a decode step, or past the last)."""
        buckets = self.decode_buckets
        if buckets is None or any(lane.num_logits == 0 for lane in lanes):  # prefill chunks keep their shape
            return 0
        bucket = next((size for size in buckets if size >= num_rows), num_rows)
        return bucket - num_rows

    def head_weight(self) -> torch.Tensor:
        """lm_head's weight [vocab, hidden] as a dense tensor (for a drafter's vocabulary subset)."""
        head = self.lm_head
        if isinstance(head, nn.Linear):
            return head.weight
        assert isinstance(head, PlannedLinear | TopKRefinedHead), type(head)
        return head.dense_weight()

    def new_cache(self, max_tokens: int) -> KVCache:
        return KVCache(self.config, max_tokens, self.dtype, self.device)

    @torch.inference_mode()
    def forward(
        self,
        token_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        cache: KVCache,
        tree_mask: torch.Tensor | None = None,  # [T, T] bool: may new token i attend to new token j
        hidden_layers: Sequence[int] = (),
        num_logits: int | None = None,  # logits for the last n tokens only (None: all, 0: none)
        want_final_hidden: bool = False,
    ) -> ForwardOutput:
        """Run T new tokens after the cache's committed tokens; their K/V go to slots [length, length+T).

        The cache length is not advanced: the caller commits what it keeps (see KVCache.commit).
        Without `tree_mask` the new tokens attend causally among themselves.
        """
        lane = LaneRows(token_ids.tolist(), positions.tolist(), cache, tree_mask, num_logits)
        return self.forward_lanes([lane], hidden_layers, want_final_hidden)[0]

    @torch.inference_mode()
    def forward_lanes(
        self, lanes: Sequence[LaneRows], hidden_layers: Sequence[int] = (), want_final_hidden: bool = False
    ) -> list[ForwardOutput]:
        """One forward over the new rows of every lane; one ForwardOutput per lane, in order."""
        if self.rotary is None or self.rotary.dtype != self.dtype:
            self.rotary = RotaryEmbedding(self.config, self.dtype, self.device)
        spans = lane_spans(lanes, self.device)
        packed = _packed_rows(spans)
        token_ids = [token for lane in lanes for token in lane.token_ids]
        positions = [position for lane in lanes for position in lane.positions]
        padding = self._bucket_padding(lanes, len(token_ids))
        token_ids, positions = token_ids + [0] * padding, positions + [0] * padding
        cos, sin = self.rotary(torch.tensor(positions, device=self.device))
        wanted = set(hidden_layers)
        hidden: dict[int, torch.Tensor] = {}
        x = self.model.embed_tokens(torch.tensor(token_ids, device=self.device))  # [R, hidden]
        storage = self._fused_storage(lanes, spans, len(token_ids))
        if storage is not None:
            x = self._fused_forward(x, cos, sin, lanes, spans, storage, wanted, hidden)
        for index, layer in enumerate(self.model.layers if storage is None else ()):
            assert isinstance(layer, DecoderLayer)
            x = layer.forward_lanes(x, cos, sin, index, spans, packed)
            if index in wanted:
                hidden[index] = x
        x = self.model.norm(x)
        logits_by_lane = lane_logits(self.lm_head, x, lanes, spans, self.config.vocab_size)
        outputs = []
        for span, logits in zip(spans, logits_by_lane, strict=True):
            rows = slice(span.first_row, span.end_row)
            lane_hidden = {layer: h[rows] for layer, h in hidden.items()}
            outputs.append(ForwardOutput(logits, lane_hidden, x[rows] if want_final_hidden else None))
        return outputs

    def _fused_storage(
        self, lanes: Sequence[LaneRows], spans: list[Span], num_rows: int
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The one K/V storage every lane of this forward writes to, where the native layers run it."""
        if self.fused is None:
            return None
        first = spans[0].cache
        if isinstance(first, PagedKVCache):
            pool = first.pool
            same = all(isinstance(s.cache, PagedKVCache) and s.cache.pool is pool for s in spans)
            return (pool.keys, pool.values) if same and pool.keys.dtype == torch.float32 else None
        if len(spans) == 1 and isinstance(first, KVCache) and first.keys.dtype == torch.float32:
            return first.keys, first.values
        return None

    def _fused_forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        lanes: Sequence[LaneRows],
        spans: list[Span],
        storage: tuple[torch.Tensor, torch.Tensor],
        wanted: set[int],
        hidden: dict[int, torch.Tensor],
    ) -> torch.Tensor:
        assert self.fused is not None
        lane_slots = []
        for span in spans:
            end = span.start + span.num_rows
            if isinstance(span.cache, PagedKVCache):
                assert span.start >= span.cache.shared_tokens, f"a lane writes token {span.start} into a shared block"
                lane_slots.append(span.cache.token_slots(end))
            else:
                lane_slots.append(torch.arange(end))
        tables = RowTables.build(spans, lane_slots, [lane.tree_mask for lane in lanes])
        x = x.contiguous()
        for index in wanted:
            hidden[index] = torch.empty_like(x)
        self.fused.forward(x, cos, sin, tables, storage[0], storage[1], hidden)
        return x


def lane_logits(
    lm_head: nn.Module, x: torch.Tensor, lanes: Sequence[LaneRows], spans: list[Span], vocab_size: int
) -> list[torch.Tensor]:
    """Each lane's logits rows [num_logits, vocab], from one lm_head product over the rows that need them."""
    ranges = []
    for lane, span in zip(lanes, spans, strict=True):
        count = span.num_rows if lane.num_logits is None else lane.num_logits
        ranges.append((span.end_row - count, span.end_row))
    counts = [end - begin for begin, end in ranges]
    if len(ranges) == 1:
        begin, end = ranges[0]
        return [lm_head(x[begin:end])]
    rows = [row for begin, end in ranges for row in range(begin, end)]
    logits = lm_head(x[torch.tensor(rows, device=x.device)]) if rows else x.new_empty(0, vocab_size)
    return list(logits.split(counts))


def lane_spans(lanes: Sequence[LaneRows], device: torch.device, starts: Sequence[int] | None = None) -> list[Span]:
    """Where each lane's rows sit in a step and what its attention reads: its new rows follow its
    committed tokens (or `starts[i]`: a drafter's scratch positions past them)."""
    spans, first_row = [], 0
    for index, lane in enumerate(lanes):
        start, num_rows = (lane.cache.length if starts is None else starts[index]), len(lane.token_ids)
        assert num_rows == len(lane.positions) and num_rows > 0, (num_rows, len(lane.positions))
        assert start + num_rows <= lane.cache.max_tokens, "KV cache overflow: caller must check context length"
        lane.cache.reserve(start + num_rows)  # (a buffer that grows: KVCache; pool blocks: already taken)
        mask = attention_mask(start, num_rows, lane.tree_mask, device)
        spans.append(Span(lane.cache, start, first_row, num_rows, mask))
        first_row += num_rows
    return spans


def attention_mask(
    start: int, num_tokens: int, tree_mask: torch.Tensor | None, device: torch.device
) -> torch.Tensor | None:
    """[T, start + T] bool: every new token sees the committed prefix, and among the new tokens
    what `tree_mask` allows (causal by default). One new token needs no mask at all."""
    if tree_mask is None and num_tokens == 1:
        return None
    if tree_mask is None:
        tree_mask = torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device).tril()
    prefix = torch.ones(num_tokens, start, dtype=torch.bool, device=device)
    return torch.cat((prefix, tree_mask), dim=1)
