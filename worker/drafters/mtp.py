"""The `mtp` speculation mode: a multi-token-prediction head in the Qwen3-Next / Qwen3.5 format.

Tensors (names as in those checkpoints; embedding and lm_head are the target's):
    mtp.fc.weight                   [hidden, 2 * hidden]
    mtp.pre_fc_norm_embedding.weight, mtp.pre_fc_norm_hidden.weight, mtp.norm.weight   [hidden]
    mtp.layers.0.*                  one decoder layer shaped like a target layer (q/k norms for qwen3)
A hybrid target's head (Qwen3.5, Qwen3-Next) has the same names with a hybrid full-attention layer
and zero-centred norms (hybrid_mtp_head.py); everything below serves both.

One step, as vLLM's qwen3_next_mtp runs it: for a target hidden state h_t (which predicted x_{t+1})
and the token x_{t+1},
    z = fc(cat[pre_fc_norm_embedding(embed(x_{t+1})), pre_fc_norm_hidden(h_t)])
    g = norm(layer(z))  at position t, with the head's own KV cache
    lm_head(g) predicts x_{t+2}
and drafting further reuses the same layer with g in place of h (vLLM feeds back the normed output).

An EAGLE-3-style head conditions step 1 on several target layers instead of h_t: its config.json
lists them (`"mtp_target_layers": [low, middle, high]`, decoder-layer outputs) and it holds one more
tensor, `mtp.target_fc.weight` [hidden, len(layers) * hidden], with
    h_t = target_fc(cat[layer_low(t), layer_middle(t), layer_high(t)])
in place of the final hidden state; everything after that is the same head.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from worker.drafters.draft_checkpoint import (
    DraftCheckpoint,
    bundled_drafter_path,
    load_weights,
    read_draft_checkpoint,
)
from worker.drafters.draft_vocab import DraftVocabulary, read_draft_vocabulary
from worker.drafters.head_rows import HeadRows
from worker.drafters.hybrid_mtp_head import HybridMtpHead, HybridMtpLayer
from worker.drafters.mtp_native import fused_head_layer, head_in_target_format, run_fused_layer
from worker.drafters.mtp_tree import TreeShape, grow_trees
from worker.engine.drafter_protocol import DrafterError, TargetStates
from worker.engine.sequence import Sequence
from worker.kernels.fused_layers import FusedLayers
from worker.models.config import ModelConfig
from worker.models.decoder import DecoderLayer, RMSNorm, Span
from worker.models.hybrid.config import HybridConfig
from worker.models.hybrid.gated_attention import attention_view, partial_rotary
from worker.models.kv_cache import INITIAL_TOKENS, KVCache
from worker.models.rope import RotaryEmbedding
from worker.speculation.tree import DraftTree

if TYPE_CHECKING:
    from worker.drafters.draft_options import DraftOptions
    from worker.models.loaded_model import LoadedModel

MTP_PREFIX = "mtp."
DEFAULT_NUM_DRAFT = 3
# Pairs a head that slept through a stretch (it did not draft) runs when it drafts again: the
# latest ones. Enough for its attention's recent context; its cost is bounded, not the stretch's.
RESTART_CONTEXT = 32
HIDDEN_SOURCES = ("post_norm", "pre_norm", "fused_layers")
TARGET_LAYERS_KEY = "mtp_target_layers"  # config.json: the layers an EAGLE-3-style head fuses
# Which target hidden state the head is conditioned on: "post_norm" is the last layer's output
# after the final norm (what vLLM hands Qwen3-Next's MTP, and transformers' hidden_states[-1]);
# "pre_norm" is the raw output of the last decoder layer. A head trained on the other convention
# says so with "mtp_hidden" in its config.json (or the target's, for an embedded head).
MTP_HIDDEN_BY_FAMILY: dict[str, str] = {
    "qwen3": "post_norm",
    "qwen2": "post_norm",
    "llama": "post_norm",
    "mistral": "post_norm",
    "qwen3_next": "post_norm",  # vLLM's Qwen3NextModel hands its MTP the final-normed hidden state
    "qwen3_5_text": "post_norm",
}


class MtpHead(nn.Module):
    """The `mtp.*` tensors as a module (parameter names without the prefix)."""

    def __init__(self, config: ModelConfig, num_target_layers: int = 0):
        super().__init__()
        size, eps = config.hidden_size, config.rms_norm_eps
        if num_target_layers:  # an EAGLE-3-style head: fuses that many target layers into h_t
            self.target_fc = nn.Linear(num_target_layers * size, size, bias=False)
        self.fc = nn.Linear(2 * size, size, bias=False)
        self.pre_fc_norm_embedding = RMSNorm(size, eps)
        self.pre_fc_norm_hidden = RMSNorm(size, eps)
        self.layers = nn.ModuleList([DecoderLayer(config)])
        self.norm = RMSNorm(size, eps)


@dataclass(slots=True)
class MtpState:
    cache: KVCache  # one layer; its slots hold pairs (h_t, x_{t+1}), in order of t, with holes (head_rows.py)
    target_hidden: torch.Tensor  # [allocated, hidden]: h_t of every committed t (for catching up, snapshots)
    token_ids: list[int] = field(default_factory=list)  # x_t of every committed t (x_{t+1} of pair t)
    next_token: int = -1  # the root: x of the last committed pair
    num_observed: int = 0  # committed tokens, all with h_t in target_hidden
    num_paired: int = 0  # pairs t < num_paired are in the cache or were skipped by a restart
    slot_positions: list[int] = field(default_factory=list)  # [cache.length]: each slot's pair t
    next_hidden: torch.Tensor | None = None  # [hidden] normed head output for the last pair (valid once caught up)
    prefill_end: int = 0  # tokens before the root at start: observations below it are the prompt's
    drafted: bool = False  # the head drafted for the step being committed: it is likely to draft again
    head_rows: int = 0  # rows the head has run for this lane, drafting included (what a dormant head costs)

    @property
    def caught_up(self) -> bool:
        return self.num_paired == self.num_observed


class MtpDrafter:
    """Drafts a chain (`mtp`) or a best-first tree (`mtp-tree`: `tree_budget` set) from the head.

    When the head observes: eagerly (one forward over a step's committed pairs, batched over the
    lanes) while it is useful, that is over the prompt and after a step it drafted for; lazily
    otherwise: a lane whose steps are drafted by another source (auto's suffix decoding) or not
    at all (adaptive speculation at this load) keeps only the target's hidden states, which the
    target computed anyway. When the head drafts again it catches up on the pairs it slept
    through, at most RESTART_CONTEXT of them (the latest): the cost of a dormant stretch is
    bounded whatever its length, and its context keeps the prompt and what it saw before.
    """

    source = ""  # the checkpoint it was read from (file or folder; the step costs' cache key)

    def __init__(
        self,
        head: MtpHead | HybridMtpHead,
        target_config: ModelConfig | HybridConfig,
        embed_tokens: nn.Embedding,
        lm_head: nn.Module,
        hidden_source: str,
        num_draft: int = DEFAULT_NUM_DRAFT,
        draft_vocab: torch.Tensor | None = None,
        target_layers: tuple[int, ...] = (),  # "fused_layers": the layers target_fc fuses, in its order
        tree: TreeShape | None = None,
        fused: FusedLayers | None = None,
    ):
        assert hidden_source in HIDDEN_SOURCES, hidden_source
        assert (hidden_source == "fused_layers") == bool(target_layers), (hidden_source, target_layers)
        self.head, self.embed_tokens, self.lm_head = head, embed_tokens, lm_head
        self.vocabulary = DraftVocabulary(lm_head, draft_vocab)
        self.hidden_source, self.num_draft = hidden_source, num_draft
        self.tree_shape = tree or TreeShape()  # what a tree from the head may be (auto asks for trees too)
        self.tree_mode = tree is not None
        self.name = "mtp-tree" if self.tree_mode else "mtp"
        self.tree_budget: int | None = self.tree_shape.budget if self.tree_mode else None  # rows a verification needs
        self.fused = fused  # the head's layer as one native call (mtp_native.py), or None: per op
        last_layer = target_config.num_hidden_layers - 1
        self.hidden_layers: tuple[int, ...] = (last_layer,) if hidden_source == "pre_norm" else target_layers
        self.wants_final_hidden = hidden_source == "post_norm"
        weight = embed_tokens.weight  # dense, in the activation dtype (lm_head may be packed)
        self.rotary: RotaryEmbedding
        if isinstance(target_config, HybridConfig):  # K/V of the gated attention's sizes, RoPE on part of a head
            self.cache_config = attention_view(target_config, 1, target_config.head_dim)
            self.rotary = partial_rotary(target_config, weight.dtype, weight.device)
        else:
            self.cache_config = dataclasses.replace(target_config, num_hidden_layers=1)
            self.rotary = RotaryEmbedding(target_config, weight.dtype, weight.device)

    def start(self, sequence: Sequence) -> MtpState:
        weight = self.embed_tokens.weight
        max_tokens = sequence.cache.max_tokens
        rows = min(max_tokens, INITIAL_TOKENS)  # both grow with the lane (KVCache.reserve, _hidden_room)
        hidden = torch.empty(rows, self.cache_config.hidden_size, dtype=weight.dtype, device=weight.device)
        cache = KVCache(self.cache_config, max_tokens, weight.dtype, weight.device)
        return MtpState(cache, hidden, prefill_end=sequence.num_tokens - 1)

    def observe(self, state: MtpState, committed: TargetStates) -> None:
        """Keep the committed tokens' h_t; run the head over their pairs now if it is likely to draft next."""
        self.observe_many([(state, committed)])

    @torch.inference_mode()
    def observe_many(self, items: list[tuple[MtpState, TargetStates]]) -> None:
        """`observe` for several lanes: one head forward over all the eager lanes' pairs."""
        eager = []
        for state, committed in items:
            assert committed.start == state.num_observed, (committed.start, state.num_observed)
            num = len(committed.token_ids)
            _hidden_room(state, committed.start + num)
            state.target_hidden[committed.start : committed.start + num] = self._target_hidden(committed)
            state.token_ids.extend(committed.token_ids)
            state.next_token, state.num_observed = committed.next_token, committed.start + num
            if committed.start < state.prefill_end or state.drafted:
                eager.append(state)
            state.drafted = False
        self.catch_up(eager)

    def catch_up(self, states: list[MtpState]) -> None:
        """Run the head over every pair each lane has not seen (the latest RESTART_CONTEXT at most)."""
        behind = [state for state in states if not state.caught_up]
        if not behind:
            return
        lanes = [self._pairs_to_run(state) for state in behind]
        pairs = zip(behind, lanes, strict=True)
        hidden = torch.cat([state.target_hidden[lane.positions] for state, lane in pairs])  # [R, hidden]: h_t of each
        out = self.run_head(lanes, hidden)  # [R, hidden]
        last = -1
        for state, lane in zip(behind, lanes, strict=True):
            last += lane.num_rows
            state.cache.commit(lane.num_rows)
            state.head_rows += lane.num_rows
            state.slot_positions.extend(lane.positions)
            state.num_paired = state.num_observed
            state.next_hidden = out[last]

    def _pairs_to_run(self, state: MtpState) -> HeadRows:
        """The pairs the head has not seen, as a run after its committed slots. A stretch the
        lane generated while the head slept is skipped but for its last RESTART_CONTEXT pairs;
        the prompt's pairs never are (a lane that imported a prefix snapshot with holes runs
        them, as a cold lane would have during its prefill)."""
        first, end = state.num_paired, state.num_observed
        recent = max(first, state.prefill_end, end - RESTART_CONTEXT)  # ranges, not a walk over the stretch
        pairs = [*range(first, min(state.prefill_end, end)), *range(recent, end)]
        next_ids = [state.token_ids[t + 1] if t + 1 < state.num_observed else state.next_token for t in pairs]
        return HeadRows(state.cache, next_ids, pairs, state.cache.length)

    def propose(self, state: MtpState, sequence: Sequence) -> DraftTree | None:
        return self.propose_many([(state, sequence)])[0]

    @torch.inference_mode()
    def propose_many(self, items: list[tuple[MtpState, Sequence]]) -> list[DraftTree | None]:
        """Each lane's chain, or tree in `mtp-tree` mode (at most its draft limit's nodes)."""
        if self.tree_mode:
            budgets = [_limited(self.tree_shape.budget, sequence.draft_limit) for _, sequence in items]
            return self.propose_trees([state for state, _ in items], budgets)
        lengths = [_limited(self.num_draft, sequence.draft_limit) for _, sequence in items]
        return self.propose_chains([state for state, _ in items], lengths)

    @torch.inference_mode()
    def propose_chains(self, states: list[MtpState], lengths: list[int]) -> list[DraftTree | None]:
        """A greedy chain of lengths[i] tokens for lane i: each draft step is one head forward and
        one logits product for all lanes; steps after the first write scratch slots past the committed pairs."""
        ready = self._ready(states)
        drafts: list[list[int]] = [[] for _ in states]
        active = [i for i in ready if lengths[i] > 0]
        if not active:
            return [None] * len(states)
        hidden = torch.stack([states[i].next_hidden for i in active])  # type: ignore[misc]  # [B, hidden]
        for depth in range(max(lengths[i] for i in active)):
            if depth > 0:  # the head over each lane's last draft, in scratch slots past its committed pairs
                lanes = [self._draft_row(states[i], [drafts[i][-1]], depth) for i in active]
                hidden = self.run_head(lanes, hidden)
                for i in active:
                    states[i].head_rows += 1
            vocabulary = self.vocabulary
            tokens = vocabulary.to_target(vocabulary.logits(hidden).argmax(dim=-1)).tolist()
            for i, token in zip(active, tokens, strict=True):
                drafts[i].append(int(token))
            keep = [j for j, i in enumerate(active) if len(drafts[i]) < lengths[i]]
            active = [active[j] for j in keep]
            if not active:
                break
            hidden = hidden[keep]
        return [DraftTree.chain(tokens) if tokens else None for tokens in drafts]

    @torch.inference_mode()
    def propose_trees(self, states: list[MtpState], budgets: list[int]) -> list[DraftTree | None]:
        """A best-first tree of budgets[i] nodes for lane i (mtp_tree.py)."""
        ready = self._ready(states)
        trees: list[DraftTree | None] = [None] * len(states)
        active = [i for i in ready if budgets[i] > 0]
        if active:
            lanes = [states[i] for i in active]
            grown = grow_trees(self.run_head, self.vocabulary, lanes, [budgets[i] for i in active], self.tree_shape)
            for i, tree in zip(active, grown, strict=True):
                trees[i] = tree
        return trees

    def _ready(self, states: list[MtpState]) -> list[int]:
        """Catch the lanes up and mark them drafting; the indices of those with a pair to draft from."""
        self.catch_up(states)
        for state in states:
            state.drafted = True
        return [i for i, state in enumerate(states) if state.next_hidden is not None]

    def _draft_row(self, state: MtpState, token_ids: list[int], depth: int) -> HeadRows:
        """A chain's row at `depth` (>= 1): pair (g, x) at position num_observed - 1 + depth."""
        slot = state.cache.length + depth - 1
        return HeadRows(state.cache, token_ids, [state.num_observed - 1 + depth], slot)

    def state_bytes(self, state: MtpState) -> int:
        hidden = state.target_hidden
        return state.cache.num_bytes + hidden.numel() * hidden.element_size()

    # A prefix of N tokens determines the pairs (h_t, x_{t+1}) for t < N-1 and h_{N-1}, but not
    # the last pair: x_N lies past the prefix. So a snapshot keeps the slots of pairs t < N-1 up to
    # the first hole a restart left (what a cold lane holds after its prefill), the target hidden
    # states h_0..h_{N-1} and tokens x_0..x_{N-1} (which also let a snapshot be cut shorter); the
    # lane that imports it runs the pairs after those, as the prompt's, when it next observes or drafts.

    def export_prefix(self, state: MtpState, num_tokens: int) -> MtpState:
        assert 0 < num_tokens <= state.num_observed, (num_tokens, state.num_observed)
        weight = self.embed_tokens.weight
        num_slots = _unbroken_slots(state.slot_positions, num_tokens - 1)
        snapshot = MtpState(
            KVCache(self.cache_config, max(num_slots, 1), weight.dtype, weight.device),
            state.target_hidden[:num_tokens].clone(),
            state.token_ids[:num_tokens],
            num_observed=num_tokens,
            num_paired=num_slots,
            slot_positions=state.slot_positions[:num_slots],
        )
        if num_slots:
            snapshot.cache.load_prefix(state.cache.keys[:, :, :num_slots], state.cache.values[:, :, :num_slots])
        return snapshot

    @torch.inference_mode()
    def import_prefix(self, sequence: Sequence, snapshot: MtpState) -> MtpState:
        state = self.start(sequence)
        num_tokens, num_slots = snapshot.num_observed, len(snapshot.slot_positions)
        if num_slots:
            state.cache.load_prefix(snapshot.cache.keys[:, :, :num_slots], snapshot.cache.values[:, :, :num_slots])
        _hidden_room(state, num_tokens)
        state.target_hidden[:num_tokens] = snapshot.target_hidden[:num_tokens]
        state.token_ids = list(snapshot.token_ids)
        state.next_token = sequence.token_ids[num_tokens]  # x_N
        state.num_observed, state.num_paired = num_tokens, snapshot.num_paired
        state.slot_positions = list(snapshot.slot_positions)
        return state  # the pairs left (at least the last) run with the next eager observation or draft

    def _target_hidden(self, committed: TargetStates) -> torch.Tensor:
        """The head's step-1 hidden input for the committed rows [n, hidden]."""
        if self.hidden_source == "post_norm":
            assert committed.final_hidden is not None, "the runner must pass final_hidden to the MTP drafter"
            return committed.final_hidden
        if self.hidden_source == "pre_norm":
            return committed.hidden[self.hidden_layers[0]]
        layers = torch.cat([committed.hidden[layer] for layer in self.hidden_layers], dim=-1)  # [n, k * hidden]
        return self.head.get_submodule("target_fc")(layers)

    def run_head(self, lanes: list[HeadRows], hidden: torch.Tensor) -> torch.Tensor:
        """The head over several lanes' rows at once ([R, hidden] in, out): pairs (hidden, token),
        K/V written to each lane's slots from `start` (past its committed ones: not committed here)."""
        head = self.head
        device = hidden.device
        for lane in lanes:
            lane.cache.reserve(lane.start + lane.num_rows)
        token_ids = torch.tensor([t for lane in lanes for t in lane.token_ids], device=device)
        embedded = head.pre_fc_norm_embedding(self.embed_tokens(token_ids))  # [R, hidden]
        x = head.fc(torch.cat([embedded, head.pre_fc_norm_hidden(hidden)], dim=-1))  # [R, hidden]
        cos, sin = self.rotary(torch.tensor([p for lane in lanes for p in lane.positions], device=device))
        fused = self.fused
        if fused is not None and x.dtype == torch.float32:
            x = run_fused_layer(fused, x, cos, sin, lanes)
        else:
            x = self.run_layer_per_op(x, cos, sin, lanes)
        return head.norm(x)  # [R, hidden]

    def run_layer_per_op(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lanes: list[HeadRows]
    ) -> torch.Tensor:
        """The head's layer in PyTorch ops (the reference the fused call is tested against)."""
        spans, first = [], 0
        for lane in lanes:
            spans.append(Span(lane.cache, lane.start, first, lane.num_rows, lane.mask(x.device)))
            first += lane.num_rows
        layer = self.head.layers[0]
        assert isinstance(layer, DecoderLayer | HybridMtpLayer)
        return layer.forward_lanes(x, cos, sin, 0, spans, None)


def load_mtp_drafter(model: LoadedModel, options: DraftOptions, tree: bool = False) -> MtpDrafter:
    """The MTP head for `model` (a LoadedModel): from --draft, else the target checkpoint, else
    bundled; `tree`: it drafts best-first trees of options.tree_budget nodes (`mtp-tree`)."""
    checkpoint = _find_mtp_checkpoint(model, options.draft)
    decoder = model.decoder
    config: ModelConfig | HybridConfig = decoder.config
    _check_hidden_size(checkpoint, config)
    target_layers = _target_layers(checkpoint, config)
    with torch.device("meta"):
        head = HybridMtpHead(config) if isinstance(config, HybridConfig) else MtpHead(config, len(target_layers))
        if target_layers and isinstance(head, HybridMtpHead):
            head.add_module(
                "target_fc", nn.Linear(len(target_layers) * config.hidden_size, config.hidden_size, bias=False)
            )
    load_weights(head, checkpoint.tensors, MTP_PREFIX, checkpoint.source, decoder.dtype, decoder.device)
    head.requires_grad_(False)
    head_in_target_format(head, model.formats, decoder.device)  # int8 beside a quantized target (mtp_native.py)
    source = "fused_layers" if target_layers else hidden_source(checkpoint, config)
    draft_vocab = read_draft_vocabulary(checkpoint.folder, config.vocab_size) if checkpoint.folder else None
    drafter = MtpDrafter(
        head,
        config,
        decoder.model.embed_tokens,
        decoder.lm_head,
        source,
        options.num_draft or DEFAULT_NUM_DRAFT,
        draft_vocab,
        target_layers,
        TreeShape(options.tree_budget, options.tree_top_k) if tree else None,
        fused_head_layer(head, config, model.formats) if isinstance(config, ModelConfig) else None,
    )
    drafter.source = checkpoint.source
    return drafter


def _find_mtp_checkpoint(model: LoadedModel, draft: Path | None) -> DraftCheckpoint:
    # An explicit --draft wins over a head inside the target checkpoint: the user asked for it.
    if draft is not None:
        return read_draft_checkpoint(draft, allow_bare_file=True)
    embedded = {name: t for name, t in model.extra_tensors.items() if name.startswith(MTP_PREFIX)}
    if embedded:
        return DraftCheckpoint(model.checkpoint.config, embedded, model.checkpoint.source or model.name)
    bundled = bundled_drafter_path(model.name, "mtp")
    if bundled is not None:
        return read_draft_checkpoint(bundled, allow_bare_file=True)
    raise DrafterError(
        f"speculation mode 'mtp' needs an MTP head, and model {model.name} has no mtp.* tensors: pass "
        f"--draft PATH (a folder with config.json + model.safetensors, or a .safetensors file, holding "
        f"mtp.fc, mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, mtp.layers.0.*, mtp.norm) "
        f"or choose another --speculation mode (ngram needs no drafter)"
    )


def _check_hidden_size(checkpoint: DraftCheckpoint, config: ModelConfig | HybridConfig) -> None:
    size = checkpoint.config.get("hidden_size")
    if size is not None and size != config.hidden_size:
        raise DrafterError(
            f"{checkpoint.source}: hidden_size={size} does not match the target's hidden_size={config.hidden_size}"
        )


def _target_layers(checkpoint: DraftCheckpoint, config: ModelConfig | HybridConfig) -> tuple[int, ...]:
    """The decoder layers an EAGLE-3-style head fuses (config.json `mtp_target_layers`; () for the others)."""
    layers = checkpoint.config.get(TARGET_LAYERS_KEY, [])
    num_layers = config.num_hidden_layers
    if not isinstance(layers, list) or not all(isinstance(i, int) and 0 <= i < num_layers for i in layers):
        raise DrafterError(
            f"{checkpoint.source}: {TARGET_LAYERS_KEY}={layers!r} must list decoder layers in [0, {num_layers})"
        )
    return tuple(layers)


def hidden_source(checkpoint: DraftCheckpoint, config: ModelConfig | HybridConfig) -> str:
    source = checkpoint.config.get("mtp_hidden", MTP_HIDDEN_BY_FAMILY.get(config.model_type, "post_norm"))
    if source not in HIDDEN_SOURCES:
        raise DrafterError(f"{checkpoint.source}: mtp_hidden={source!r} must be one of {', '.join(HIDDEN_SOURCES)}")
    return source


def _unbroken_slots(slot_positions: list[int], num_pairs: int) -> int:
    """Slots holding pairs 0, 1, 2, ... without a hole, of the first `num_pairs` pairs: what a
    snapshot of a prefix keeps (what a cold lane would hold after its prefill). Positions increase
    slot by slot, so slot i holds pair i up to the first hole and a later pair after it."""
    low, high = 0, min(len(slot_positions), num_pairs)
    while low < high:
        middle = (low + high) // 2
        if slot_positions[middle] == middle:
            low = middle + 1
        else:
            high = middle
    return low


def _limited(num_nodes: int, draft_limit: int | None) -> int:
    return num_nodes if draft_limit is None else min(num_nodes, draft_limit)


def _hidden_room(state: MtpState, num_tokens: int) -> None:
    """Room for h_t of the first `num_tokens` tokens: grows as the head's KVCache does (at least
    doubling, up to the lane's longest context), so a lane's memory follows its length."""
    allocated = state.target_hidden.shape[0]
    if num_tokens <= allocated:
        return
    size = min(max(num_tokens, 2 * allocated), state.cache.max_tokens)
    grown = state.target_hidden.new_empty(size, state.target_hidden.shape[1])
    grown[:allocated] = state.target_hidden
    state.target_hidden = grown
