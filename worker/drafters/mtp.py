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
from worker.drafters.hybrid_mtp_head import HybridMtpHead, HybridMtpLayer
from worker.engine.drafter_protocol import DrafterError, TargetStates
from worker.engine.sequence import Sequence
from worker.kernels.native_linear import drafter_on_native, native_linear_of
from worker.models.config import ModelConfig
from worker.models.decoder import DecoderLayer, LaneRows, RMSNorm, lane_spans
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
    cache: KVCache  # one layer; slot t holds the pair (h_t, x_{t+1}) for every committed t
    target_hidden: torch.Tensor  # [max_tokens, hidden]: h_t for every committed t (prefix snapshots need it)
    next_hidden: torch.Tensor | None = None  # [hidden] normed head output for the last pair: step 1's g
    num_observed: int = 0  # committed tokens whose h_t is in target_hidden
    # observations deferred while the lane does not draft (adaptive speculation): the head runs
    # over them in one forward when it drafts again, instead of once a step for nothing
    pending: list[TargetStates] = field(default_factory=list)


class MtpDrafter:
    name = "mtp"

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
    ):
        assert hidden_source in HIDDEN_SOURCES, hidden_source
        assert (hidden_source == "fused_layers") == bool(target_layers), (hidden_source, target_layers)
        self.head, self.embed_tokens, self.lm_head = head, embed_tokens, lm_head
        self.vocabulary = DraftVocabulary(lm_head, draft_vocab)
        self.hidden_source, self.num_draft = hidden_source, num_draft
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
        return MtpState(KVCache(self.cache_config, max_tokens, weight.dtype, weight.device), hidden)

    def observe(self, state: MtpState, committed: TargetStates) -> None:
        """Commit the pairs (h_t, x_{t+1}) for the committed tokens; the last pair pairs with the new root."""
        self.observe_many([(state, committed)])

    @torch.inference_mode()
    def propose(self, state: MtpState, sequence: Sequence) -> DraftTree | None:
        """Chain num_draft steps; steps after the first write scratch slots past the committed length."""
        self._flush([(state, sequence)])
        hidden = state.next_hidden
        if hidden is None:  # nothing committed yet (a one-token prompt)
            return None
        vocabulary = self.vocabulary
        tokens = [int(vocabulary.to_target(vocabulary.logits(hidden).argmax()))]
        position = state.cache.length
        for _ in range(self._num_draft(sequence) - 1):
            out = self._run(state.cache, [tokens[-1]], hidden[None], position)
            hidden = out[0]
            tokens.append(int(vocabulary.to_target(vocabulary.logits(hidden).argmax())))
            position += 1
        return DraftTree.chain(tokens)

    @torch.inference_mode()
    def observe_many(self, items: list[tuple[MtpState, TargetStates]]) -> None:
        """`observe` for several lanes: one head forward over all their pairs."""
        merged = [(state, self._with_pending(state, committed)) for state, committed in items]
        items = [(state, committed) for state, committed in merged if committed is not None]
        if not items:
            return
        hidden = [self._target_hidden(committed) for _, committed in items]  # [n_i, hidden] each
        lanes = []
        for state, committed in items:
            assert committed.start == state.cache.length, (committed.start, state.cache.length)
            next_ids = committed.token_ids[1:] + [committed.next_token]
            positions = list(range(committed.start, committed.start + len(next_ids)))
            lanes.append(LaneRows(next_ids, positions, state.cache))
        out = self._run_lanes(lanes, torch.cat(hidden))
        first = 0
        for (state, committed), lane, lane_hidden in zip(items, lanes, hidden, strict=True):
            num = len(lane.token_ids)
            state.cache.commit(num)
            _hidden_room(state, committed.start + num)
            state.target_hidden[committed.start : committed.start + num] = lane_hidden
            state.num_observed = committed.start + num
            state.next_hidden = out[first + num - 1]
            first += num

    @torch.inference_mode()
    def propose_many(self, items: list[tuple[MtpState, Sequence]]) -> list[DraftTree | None]:
        """`propose` for several lanes: each draft step is one head forward and one logits product for all."""
        self._flush(items)
        ready = [i for i, (state, _) in enumerate(items) if state.next_hidden is not None]
        drafts: list[list[int]] = [[] for _ in items]
        if not ready:
            return [None] * len(items)
        wanted = {i: self._num_draft(items[i][1]) for i in ready}
        hidden = torch.stack([items[i][0].next_hidden for i in ready])  # type: ignore[misc]  # [B, hidden]
        active = ready
        for depth in range(max(wanted.values())):
            if depth > 0:  # the head over each lane's last draft, in scratch slots past its committed pairs
                lanes = [
                    LaneRows([drafts[i][-1]], [items[i][0].cache.length + depth - 1], items[i][0].cache) for i in active
                ]
                starts = [lane.positions[0] for lane in lanes]
                hidden = self._run_lanes(lanes, hidden, starts)
            vocabulary = self.vocabulary
            tokens = vocabulary.to_target(vocabulary.logits(hidden).argmax(dim=-1)).tolist()
            for i, token in zip(active, tokens, strict=True):
                drafts[i].append(int(token))
            keep = [j for j, i in enumerate(active) if len(drafts[i]) < wanted[i]]
            active = [active[j] for j in keep]
            if not active:
                break
            hidden = hidden[keep]
        return [DraftTree.chain(tokens) if tokens else None for tokens in drafts]

    def _with_pending(self, state: MtpState, committed: TargetStates) -> TargetStates | None:
        """`committed` with the deferred observations before it, as one; None: defer it too."""
        if not committed.drafting:
            state.pending.append(self._compact(committed))
            return None
        if not state.pending:
            return committed
        parts, state.pending = [*state.pending, committed], []
        token_ids = [token for part in parts for token in part.token_ids]
        return self._states(token_ids, parts[0].start, parts, committed.next_token, torch.cat)

    def _compact(self, committed: TargetStates) -> TargetStates:
        """A copy holding only the rows this drafter reads (not a view into the step's tensors)."""
        return self._states(
            committed.token_ids, committed.start, [committed], committed.next_token, lambda rows: rows[0].clone()
        )

    def _states(
        self, token_ids: list[int], start: int, parts: list[TargetStates], next_token: int, join
    ) -> TargetStates:
        """TargetStates with the rows this drafter reads from `parts`, each field's rows `join`ed."""
        layers = {layer: join([part.hidden[layer] for part in parts]) for layer in self.hidden_layers}
        final = join([part.final_hidden for part in parts]) if self.wants_final_hidden else None
        return TargetStates(token_ids, start, layers, final, next_token)

    def _flush(self, items: list[tuple[MtpState, Sequence]]) -> None:
        """Run the head over the observations lanes deferred, before they draft."""
        waiting = [(state, state.pending.pop()) for state, _ in items if state.pending]
        if waiting:
            for _, last in waiting:
                last.drafting = True
            self.observe_many(waiting)

    def _num_draft(self, sequence: Sequence) -> int:
        limit = sequence.draft_limit
        return self.num_draft if limit is None else min(self.num_draft, limit)

    def state_bytes(self, state: MtpState) -> int:
        hidden = state.target_hidden
        return state.cache.num_bytes + hidden.numel() * hidden.element_size()

    # A prefix of N tokens determines the pairs (h_t, x_{t+1}) for t < N-1 and h_{N-1}, but not
    # the last pair: x_N lies past the prefix. So a snapshot keeps pairs [0, N-1) plus the target
    # hidden states h_0..h_{N-1} (the latter also let a snapshot be cut shorter), and importing
    # runs the head over (h_{N-1}, x_N) with x_N read from the new sequence, as observe would.

    def export_prefix(self, state: MtpState, num_tokens: int) -> MtpState:
        assert 0 < num_tokens <= state.num_observed, (num_tokens, state.num_observed)
        weight = self.embed_tokens.weight
        num_pairs = num_tokens - 1
        snapshot = MtpState(
            KVCache(self.cache_config, max(num_pairs, 1), weight.dtype, weight.device),
            state.target_hidden[:num_tokens].clone(),
            num_observed=num_tokens,
        )
        snapshot.cache.load_prefix(state.cache.keys[:, :, :num_pairs], state.cache.values[:, :, :num_pairs])
        return snapshot

    @torch.inference_mode()
    def import_prefix(self, sequence: Sequence, snapshot: MtpState) -> MtpState:
        state = self.start(sequence)
        num_tokens = snapshot.num_observed
        num_pairs = num_tokens - 1
        state.cache.load_prefix(snapshot.cache.keys[:, :, :num_pairs], snapshot.cache.values[:, :, :num_pairs])
        _hidden_room(state, num_tokens)
        state.target_hidden[:num_tokens] = snapshot.target_hidden[:num_tokens]
        state.num_observed = num_tokens
        last_hidden = snapshot.target_hidden[num_pairs:num_tokens]  # [1, hidden]: h_{N-1}
        out = self._run(state.cache, [sequence.token_ids[num_tokens]], last_hidden, num_pairs)  # x_N
        state.cache.commit(1)
        state.next_hidden = out[-1]  # its logits wait for propose: a step that does not draft skips the head
        return state

    def _target_hidden(self, committed: TargetStates) -> torch.Tensor:
        """The head's step-1 hidden input for the committed rows [n, hidden]."""
        if self.hidden_source == "post_norm":
            assert committed.final_hidden is not None, "the runner must pass final_hidden to the MTP drafter"
            return committed.final_hidden
        if self.hidden_source == "pre_norm":
            return committed.hidden[self.hidden_layers[0]]
        layers = torch.cat([committed.hidden[layer] for layer in self.hidden_layers], dim=-1)  # [n, k * hidden]
        return self.head.get_submodule("target_fc")(layers)

    def _run(self, cache: KVCache, token_ids: list[int], hidden: torch.Tensor, start: int) -> torch.Tensor:
        """The head over T pairs at positions [start, start+T); K/V written to those (uncommitted) slots."""
        lane = LaneRows(token_ids, list(range(start, start + len(token_ids))), cache)
        return self._run_lanes([lane], hidden, [start])  # [T, hidden]

    def _run_lanes(self, lanes: list[LaneRows], hidden: torch.Tensor, starts: list[int] | None = None) -> torch.Tensor:
        """The head over several lanes' rows at once ([R, hidden] in, out), each lane's attention
        over its own cache (`starts`: where each lane's rows go, past its committed pairs)."""
        head = self.head
        device = hidden.device
        token_ids = torch.tensor([t for lane in lanes for t in lane.token_ids], device=device)
        embedded = head.pre_fc_norm_embedding(self.embed_tokens(token_ids))  # [R, hidden]
        x = head.fc(torch.cat([embedded, head.pre_fc_norm_hidden(hidden)], dim=-1))  # [R, hidden]
        cos, sin = self.rotary(torch.tensor([p for lane in lanes for p in lane.positions], device=device))
        layer = head.layers[0]
        assert isinstance(layer, DecoderLayer | HybridMtpLayer)
        x = layer.forward_lanes(x, cos, sin, 0, lane_spans(lanes, device, starts), None)
        return head.norm(x)  # [R, hidden]


def load_mtp_drafter(model: LoadedModel, options: DraftOptions) -> MtpDrafter:
    """The MTP head for `model` (a LoadedModel): from --draft, else the target checkpoint, else bundled."""
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
    native = native_linear_of(decoder.lm_head)
    if native is not None:  # the head's layer on the target's native kernels, in int4
        drafter_on_native(head, native)
    source = "fused_layers" if target_layers else _hidden_source(checkpoint, config)
    draft_vocab = read_draft_vocabulary(checkpoint.folder, config.vocab_size) if checkpoint.folder else None
    return MtpDrafter(
        head,
        config,
        decoder.model.embed_tokens,
        decoder.lm_head,
        source,
        options.num_draft or DEFAULT_NUM_DRAFT,
        draft_vocab,
        target_layers,
    )


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


def _hidden_source(checkpoint: DraftCheckpoint, config: ModelConfig | HybridConfig) -> str:
    source = checkpoint.config.get("mtp_hidden", MTP_HIDDEN_BY_FAMILY.get(config.model_type, "post_norm"))
    if source not in HIDDEN_SOURCES:
        raise DrafterError(f"{checkpoint.source}: mtp_hidden={source!r} must be one of {', '.join(HIDDEN_SOURCES)}")
    return source


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
