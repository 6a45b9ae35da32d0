"""The gated DeltaNet layer: input projections, a causal short convolution, the gated delta rule.

    x -> q, k, v (one projection, then a depthwise causal conv of width `kernel` and silu),
         z (output gate), b -> beta = sigmoid(b), a -> g = -exp(A_log) * softplus(a + dt_bias)
      -> delta rule over (l2norm(q) / sqrt(dk), l2norm(k), v, g, beta)
      -> GatedRMSNorm(out, z) per value head -> out_proj

Qwen3-Next and Qwen3.5 differ only in how the checkpoint lays out the projections:
- "grouped" (Qwen3-Next): `in_proj_qkvz` and `in_proj_ba`, whose rows are grouped per key head
  (each group: q, k, then the v and z of the value heads that key head serves);
- "split" (Qwen3.5): `in_proj_qkv` (q | k | v), `in_proj_z`, `in_proj_b`, `in_proj_a`.

The conv and delta-rule states come from the sequence's RecurrentState and are staged back to it
(recurrent_state.py): a verification runs the per-token recurrence and stages the state after
every token (along a chain, or in a tree each node from its parent's), so a commit can keep any
accepted path; a prefill chunk runs the chunked form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from worker.models.hybrid.config import HybridConfig
from worker.models.hybrid.delta_rule import CHUNK_SIZE, chunked_delta_rule, recurrent_delta_rule
from worker.models.hybrid.norms import GatedRMSNorm
from worker.models.hybrid.recurrent_state import RecurrentState, StagedStep, chain_parents, conv_columns
from worker.models.linear import Linear

L2NORM_EPS = 1e-6


@dataclass(slots=True)
class RecurrentLane:
    """One lane's rows in a forward, for the recurrent layers: where they sit, whose state they
    continue, and what the lane may commit (every row's state, or only the last)."""

    recurrent: RecurrentState
    first_row: int
    num_rows: int
    every_position: bool  # keep the state after every row (a forward that may be committed in part)
    parents: list[int] | None = None  # a tree's (recurrent_state.py); None: a chain
    start: int = 0  # the lane's committed tokens before these rows
    snapshot_every: int | None = None  # a prefill chunk also keeps the state at each multiple of this


def l2_normalized(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2NORM_EPS)


def _chains_of_equal_length(lanes: list[RecurrentLane]) -> list[list[int]]:
    """Indices of lanes that can share one recurrence: chains (decode rows, chain verification)
    that keep every row's state, grouped by their number of rows, two or more to a group."""
    groups: dict[int, list[int]] = {}
    for index, lane in enumerate(lanes):
        if lane.every_position and lane.parents is None:
            groups.setdefault(lane.num_rows, []).append(index)
    return [group for group in groups.values() if len(group) > 1]


class GatedDeltaNet(nn.Module):
    def __init__(self, config: HybridConfig):
        super().__init__()
        self.num_k_heads, self.num_v_heads = config.linear_num_key_heads, config.linear_num_value_heads
        self.k_head_dim, self.v_head_dim = config.linear_key_head_dim, config.linear_value_head_dim
        self.key_dim = self.num_k_heads * self.k_head_dim
        self.value_dim = self.num_v_heads * self.v_head_dim
        self.conv_dim = config.conv_dim
        self.layout = config.projection_layout
        hidden = config.hidden_size
        self.conv1d = nn.Conv1d(
            self.conv_dim, self.conv_dim, config.linear_conv_kernel_dim, groups=self.conv_dim, bias=False
        )
        if self.layout == "grouped":
            self.in_proj_qkvz = Linear(hidden, 2 * self.key_dim + 2 * self.value_dim, bias=False)
            self.in_proj_ba = Linear(hidden, 2 * self.num_v_heads, bias=False)
        else:
            self.in_proj_qkv = Linear(hidden, self.conv_dim, bias=False)
            self.in_proj_z = Linear(hidden, self.value_dim, bias=False)
            self.in_proj_b = Linear(hidden, self.num_v_heads, bias=False)
            self.in_proj_a = Linear(hidden, self.num_v_heads, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = GatedRMSNorm(self.v_head_dim, config.rms_norm_eps)
        self.out_proj = Linear(self.value_dim, hidden, bias=False)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """conv inputs [T, conv_dim] (q | k | v), z [T, v_heads, dv], b and a [T, v_heads]."""
        num_tokens = x.shape[0]
        if self.layout == "split":
            z = self.in_proj_z(x).view(num_tokens, self.num_v_heads, self.v_head_dim)
            return self.in_proj_qkv(x), z, self.in_proj_b(x), self.in_proj_a(x)
        per_key = self.num_v_heads // self.num_k_heads  # value heads per key head
        qkvz = self.in_proj_qkvz(x).view(num_tokens, self.num_k_heads, -1)
        sizes = [self.k_head_dim, self.k_head_dim, per_key * self.v_head_dim, per_key * self.v_head_dim]
        q, k, v, z = qkvz.split(sizes, dim=-1)
        b, a = self.in_proj_ba(x).view(num_tokens, self.num_k_heads, 2 * per_key).split(per_key, dim=-1)
        mixed = torch.cat([t.reshape(num_tokens, -1) for t in (q, k, v)], dim=-1)
        z = z.reshape(num_tokens, self.num_v_heads, self.v_head_dim)
        return mixed, z, b.reshape(num_tokens, -1), a.reshape(num_tokens, -1)

    def forward(
        self,
        x: torch.Tensor,  # [R, hidden]: the rows of one or several lanes, lane by lane
        slot: int,  # this layer's slot in each lane's RecurrentState
        lanes: list[RecurrentLane],
    ) -> torch.Tensor:
        """The projections over every row at once; the conv and the delta rule per lane, from its
        own committed state (staged back to it for its commit)."""
        num_rows = x.shape[0]
        mixed, z, b, a = self.project(x)
        outs: list[torch.Tensor | None] = [None] * len(lanes)
        for group in _chains_of_equal_length(lanes):  # decode rows, chains: one recurrence for all
            for index, out in zip(group, self._recur_together(mixed, b, a, slot, [lanes[i] for i in group], x.dtype)):
                outs[index] = out
        for index, lane in enumerate(lanes):
            if outs[index] is None:
                rows = slice(lane.first_row, lane.first_row + lane.num_rows)
                outs[index] = self._recur(mixed[rows], b[rows], a[rows], slot, lane, x.dtype)
        done = [out for out in outs if out is not None]
        out = done[0] if len(done) == 1 else torch.cat(done, dim=1)  # [v_heads, R, dv]
        out = self.norm(out.transpose(0, 1).to(x.dtype), z)  # [R, v_heads, dv]
        return self.out_proj(out.reshape(num_rows, self.value_dim))

    def _recur(
        self, mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor, slot: int, lane: RecurrentLane, dtype: torch.dtype
    ) -> torch.Tensor:
        """One lane's conv and delta rule over its T rows: outputs [v_heads, T, dv]."""
        recurrent = lane.recurrent
        window = torch.cat((recurrent.conv_tails[slot], mixed.t()), dim=-1)  # [conv_dim, kernel - 1 + T]
        q, k, v = self._heads(F.silu(self._conv(window, lane)).t(), dtype)
        g, beta = self._decay_and_strength(a, b, q.dtype)
        state = recurrent.delta_states[slot]
        if lane.every_position:
            out, states = recurrent_delta_rule(q, k, v, g, beta, state, lane.parents)
            recurrent.stage(slot, StagedStep(window, states, True, lane.parents))
            return out
        assert lane.parents is None, "a tree keeps every row's state"
        every = lane.snapshot_every
        if every is None:
            out, final, _ = chunked_delta_rule(q, k, v, g, beta, state)
            recurrent.stage(slot, StagedStep(window, final[None], False))
            return out
        # chunks that end on the sequence's multiples of `every`: their states are the snapshots
        chunk = math.gcd(CHUNK_SIZE, every)
        offset = lane.start % chunk
        out, final, chunk_states = chunked_delta_rule(q, k, v, g, beta, state, chunk, offset, keep_chunk_states=True)
        assert chunk_states is not None
        snapshots = {}
        for index, chunk_state in enumerate(chunk_states):
            length = lane.start - offset + (index + 1) * chunk  # the sequence's tokens at this chunk's end
            if lane.start < length <= lane.start + lane.num_rows and length % every == 0:
                snapshots[length - lane.start - 1] = chunk_state
        recurrent.stage(slot, StagedStep(window, final[None], False, snapshots=snapshots))
        return out

    def _recur_together(
        self,
        mixed: torch.Tensor,
        b: torch.Tensor,
        a: torch.Tensor,
        slot: int,
        lanes: list[RecurrentLane],
        dtype: torch.dtype,
    ) -> list[torch.Tensor]:
        """`_recur` for G lanes of T chain rows each that keep every row's state: the same products
        per lane (bitwise what each gives alone), with lanes stacked into the head dimension so the
        per-token recurrence runs once for all of them. Outputs [v_heads, T, dv] per lane."""
        num_lanes, num_tokens, heads = len(lanes), lanes[0].num_rows, self.num_v_heads
        rows = torch.tensor(
            [lane.first_row + t for lane in lanes for t in range(num_tokens)], device=mixed.device
        )  # [G * T]
        tails = torch.stack([lane.recurrent.conv_tails[slot] for lane in lanes])  # [G, conv_dim, kernel - 1]
        windows = torch.cat((tails, mixed[rows].view(num_lanes, num_tokens, -1).transpose(1, 2)), dim=-1)
        weight = self.conv1d.weight  # [conv_dim, 1, kernel]
        columns = torch.tensor(conv_columns(chain_parents(num_tokens), weight.shape[-1]), device=mixed.device)
        conv = (windows[:, :, columns] * weight).sum(dim=-1)  # [G, conv_dim, T]: _conv's products, per lane
        q, k, v = self._heads(F.silu(conv).transpose(1, 2).reshape(num_lanes * num_tokens, -1), dtype)
        g, beta = self._decay_and_strength(a[rows], b[rows], q.dtype)  # [heads, G * T]

        def by_lane(t: torch.Tensor) -> torch.Tensor:  # [heads, G * T, ...] -> [G * heads, T, ...]
            t = t.reshape(heads, num_lanes, num_tokens, *t.shape[2:]).transpose(0, 1)
            return t.reshape(num_lanes * heads, num_tokens, *t.shape[3:])

        initial = torch.cat([lane.recurrent.delta_states[slot] for lane in lanes])  # [G * heads, dk, dv]
        out, states = recurrent_delta_rule(by_lane(q), by_lane(k), by_lane(v), by_lane(g), by_lane(beta), initial)
        outs = []
        for index, lane in enumerate(lanes):
            heads_of_lane = slice(index * heads, (index + 1) * heads)
            lane.recurrent.stage(slot, StagedStep(windows[index], states[:, heads_of_lane], True))
            outs.append(out[heads_of_lane])
        return outs

    def _conv(self, window: torch.Tensor, lane: RecurrentLane) -> torch.Tensor:
        """The depthwise causal conv [conv_dim, T] over `window`.

        A forward that keeps every row's state (decode, verification) reads each token's own
        path, in a tree and along a chain alike, with the same products and sums, so a node's
        output is rounded as the same token's in plain decoding is (bitwise in bfloat16). A
        prefill chunk takes the library's conv.
        """
        weight = self.conv1d.weight  # [conv_dim, 1, kernel]
        if not lane.every_position:
            return F.conv1d(window[None], weight, groups=self.conv_dim)[0]
        num_tokens = window.shape[-1] - weight.shape[-1] + 1
        parents = lane.parents if lane.parents is not None else chain_parents(num_tokens)
        columns = torch.tensor(conv_columns(parents, weight.shape[-1]), device=window.device)  # [T, kernel]
        return (window[:, columns] * weight).sum(dim=-1)  # [conv_dim, T, kernel] -> [conv_dim, T]

    def _decay_and_strength(
        self, a: torch.Tensor, b: torch.Tensor, compute: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per value head and token [heads, T]: the log decay g = -exp(A_log) * softplus(a + dt_bias)
        (in the rule's dtype: in float16 exp(A_log) may overflow) and the write strength sigmoid(b)."""
        g = -self.A_log.to(compute).exp() * F.softplus(a.to(compute) + self.dt_bias.to(compute))
        return g.t(), torch.sigmoid(b).to(compute).t()

    def _heads(self, conv: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k [v_heads, T, dk] (normalised; q scaled) and v [v_heads, T, dv], in the rule's dtype."""
        compute = torch.promote_types(dtype, torch.float32)
        num_tokens, per_key = conv.shape[0], self.num_v_heads // self.num_k_heads
        q, k, v = conv.to(compute).split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q, k = (t.view(num_tokens, self.num_k_heads, self.k_head_dim).repeat_interleave(per_key, dim=1) for t in (q, k))
        q = l2_normalized(q) * self.k_head_dim**-0.5
        v = v.view(num_tokens, self.num_v_heads, self.v_head_dim)
        return q.transpose(0, 1), l2_normalized(k).transpose(0, 1), v.transpose(0, 1)
