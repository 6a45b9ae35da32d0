"""The `dflash` and `tree` speculation modes: a DFlash block-diffusion drafter in the z-lab format.

Checkpoint: config.json (Qwen3-style sizes, `block_size`, `dflash_config.mask_token_id`,
`dflash_config.target_layer_ids`) and safetensors with `fc.weight` [hidden, len(ids) * hidden],
`hidden_norm.weight`, `norm.weight`, `layers.N.*` (q/k norms included). The target's embedding
and lm_head are shared.

How it drafts, following z-lab's model/dflash.py. Target layer L means the output of decoder
layer L (transformers' hidden_states[L + 1]). For committed tokens at positions p:
    c_p = hidden_norm(fc(cat[target layer outputs at p]))            one context vector per token
    every draft layer i attends to K_i = RoPE_p(k_norm(k_proj_i(c_p))), V_i = v_proj_i(c_p)
Those never depend on the draft layers' inputs, so `observe` computes them once per committed
token into a per-request cache (`observe_many`: for every lane of a step in one projection).
A proposal runs one block, for a root at position L:
    block = [root, mask, mask, ..., mask]  (block_size tokens at positions L .. L + block_size - 1)
through every layer with non-causal attention over (context K/V + the block's own K/V), then the
final norm and the target's lm_head; the logits at the mask positions are the drafts for
positions L + 1 .. L + block_size - 1.

Example, block_size 4, committed a b c (positions 0-2), root d at 3: the block is d M M M at
positions 3-6; its rows 1-3 give distributions for positions 4, 5, 6. `dflash` drafts their
argmax as a chain; `tree` hands their top-k logprobs to the best-first tree builder.

When the target is quantized (weight_formats.py's rule: int4 or int8, on the native kernels where
chosen), fc and the draft layers' linears are int8 on the same kernels (the rule for drafters,
`drafter_formats`): a dense float32 drafter would read more bytes per block than a small target's
whole step, and int4 rounding cost acceptance.

`propose_many` runs every drafting lane's block in one forward (the rows of all blocks through
each linear layer at once, attention per lane over its own context and block), and `propose` is
its one-lane case.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, cast

import torch
from torch import nn

from worker.drafters.draft_checkpoint import (
    DraftCheckpoint,
    bundled_drafter_path,
    load_weights,
    read_draft_checkpoint,
)
from worker.drafters.draft_vocab import DraftVocabulary, read_draft_vocabulary
from worker.engine.drafter_protocol import DrafterError, TargetStates
from worker.engine.sequence import Sequence
from worker.models.checkpoint import CheckpointError
from worker.models.config import ModelConfig
from worker.models.decoder import DecoderLayer, RMSNorm, Span
from worker.models.fast_weights import linears_in_format
from worker.models.kv_cache import KVCache
from worker.models.rope import RotaryEmbedding, apply_rotary
from worker.models.weight_formats import drafter_formats
from worker.speculation.tree import DraftTree, build_best_first_tree

if TYPE_CHECKING:
    from worker.drafters.draft_options import DraftOptions
    from worker.models.loaded_model import LoadedModel

_T = TypeVar("_T")


@dataclass(slots=True, frozen=True)
class DFlashSpec:
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]


class DFlashLayer(DecoderLayer):
    """A Qwen3 decoder layer (same tensors, same forward over a block) whose K/V for the context
    come from the projected target hidden states instead of its own input."""

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K (normed, rotated) and V of x: [kv_heads, T, head_dim] each."""
        attn = self.self_attn
        assert attn.k_norm is not None  # Qwen3 layers: q/k norms always
        num_tokens = x.shape[0]
        k = attn.k_norm(attn.k_proj(x).view(num_tokens, attn.num_kv_heads, attn.head_dim))
        v = attn.v_proj(x).view(num_tokens, attn.num_kv_heads, attn.head_dim)
        return apply_rotary(k.transpose(0, 1), cos, sin), v.transpose(0, 1)


class DFlashModel(nn.Module):
    """The drafter's own tensors (names as in the checkpoint)."""

    def __init__(self, config: ModelConfig, num_target_layers: int):
        super().__init__()
        size, eps = config.hidden_size, config.rms_norm_eps
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(config.num_hidden_layers))
        self.fc = nn.Linear(num_target_layers * size, size, bias=False)
        self.hidden_norm = RMSNorm(size, eps)
        self.norm = RMSNorm(size, eps)

    def draft_layers(self) -> Iterable[DFlashLayer]:
        """`layers`, typed: to a type checker an nn.ModuleList holds plain Modules."""
        return cast(Iterable[DFlashLayer], self.layers)


@dataclass(slots=True)
class DFlashState:
    cache: KVCache  # per draft layer: context K/V in [0, length), block scratch after it


class DFlashDrafter:
    hidden_layers: tuple[int, ...]
    wants_final_hidden = False
    source = ""  # the checkpoint it was read from (file or folder; the step costs' cache key)

    def __init__(
        self,
        model: DFlashModel,
        config: ModelConfig,
        spec: DFlashSpec,
        embed_tokens: nn.Embedding,
        lm_head: nn.Module,
        num_draft: int,
        tree_budget: int | None = None,
        tree_top_k: int = 4,
        draft_vocab: torch.Tensor | None = None,
    ):
        self.model, self.config, self.spec = model, config, spec
        self.embed_tokens, self.lm_head = embed_tokens, lm_head
        self.vocabulary = DraftVocabulary(lm_head, draft_vocab)
        self.hidden_layers = spec.target_layer_ids
        self.num_draft = min(num_draft, spec.block_size - 1)
        self.tree_budget, self.tree_top_k = tree_budget, tree_top_k
        self.name = "tree" if tree_budget is not None else "dflash"
        weight = embed_tokens.weight  # dense, in the activation dtype (lm_head may be packed)
        self.rotary = RotaryEmbedding(config, weight.dtype, weight.device)

    def start(self, sequence: Sequence) -> DFlashState:
        weight = self.embed_tokens.weight
        capacity = sequence.cache.max_tokens + self.spec.block_size
        return DFlashState(KVCache(self.config, capacity, weight.dtype, weight.device))

    def observe(self, state: DFlashState, committed: TargetStates) -> None:
        """Context K/V for the committed tokens, written at their positions in every draft layer."""
        self.observe_many([(state, committed)])

    @torch.inference_mode()
    def observe_many(self, items: list[tuple[DFlashState, TargetStates]]) -> None:
        """`observe` for several lanes: fc and every layer's K/V projections run once over all
        their committed rows; each lane's slice is then copied into its own cache."""
        for state, committed in items:
            assert committed.start == state.cache.length, (committed.start, state.cache.length)
        layer_ids = self.spec.target_layer_ids
        features = torch.cat(
            [torch.cat([committed.hidden[layer] for _, committed in items]) for layer in layer_ids], dim=-1
        )  # [R, len(layer_ids) * hidden]
        context = self.model.hidden_norm(self.model.fc(features))  # [R, hidden]
        positions = [p for _, c in items for p in range(c.start, c.start + len(c.token_ids))]
        assert len(positions) == context.shape[0], (len(positions), context.shape)
        cos, sin = self.rotary(torch.tensor(positions, dtype=torch.long, device=context.device))
        pairs = [layer.keys_values(context, cos, sin) for layer in self.model.draft_layers()]
        keys = torch.stack([k for k, _ in pairs])  # [layers, kv_heads, R, head_dim]
        values = torch.stack([v for _, v in pairs])
        first = 0
        for state, committed in items:
            cache, num = state.cache, len(committed.token_ids)
            start, rows = committed.start, slice(first, first + num)
            cache.reserve(start + num)
            cache.keys[:, :, start : start + num], cache.values[:, :, start : start + num] = (
                keys[:, :, rows],
                values[:, :, rows],
            )
            cache.commit(num)
            first += num

    def propose(self, state: DFlashState, sequence: Sequence) -> DraftTree | None:
        return self.propose_many([(state, sequence)])[0]

    @torch.inference_mode()
    def propose_many(self, items: list[tuple[DFlashState, Sequence]]) -> list[DraftTree | None]:
        """`propose` for several lanes: one block forward over every drafting lane's block, one
        logits product over the rows they draft from, one read-back of all their tokens."""
        depths = [self._num_depths(sequence) for _, sequence in items]
        drafting = [i for i, depth in enumerate(depths) if depth > 0]
        trees: list[DraftTree | None] = [None] * len(items)
        if not drafting:
            return trees
        x = self._blocks([items[i][0] for i in drafting], [items[i][1].root_token for i in drafting])
        counts = [depths[i] for i in drafting]
        logits = self._draft_logits(x, counts)  # [sum(counts), draft vocab]
        if self.tree_budget is None:
            tokens = self.vocabulary.to_target(logits.argmax(dim=-1)).tolist()
            for i, lane_tokens in zip(drafting, _split(tokens, counts), strict=True):
                trees[i] = DraftTree.chain(lane_tokens)
            return trees
        for i, candidates in zip(drafting, _split(self._candidates(logits), counts), strict=True):
            trees[i] = build_best_first_tree(candidates, self._tree_budget(items[i][1]))
        return trees

    def block_logits(self, state: DFlashState, root_token: int) -> torch.Tensor:
        """Draft logits [block_size - 1, draft vocab] for the positions after the root."""
        return self.vocabulary.logits(self.model.norm(self._blocks([state], [root_token])[1:]))

    def _draft_logits(self, x: torch.Tensor, depths: list[int]) -> torch.Tensor:
        """Logits of the rows lanes draft from: a lane's row 0 is its root, its rows 1..depth
        predict the positions after it (x: `_blocks`' output)."""
        if len(depths) == 1:  # one lane: its rows are a slice, no gather
            x = x[1 : 1 + depths[0]]
        else:
            block = self.spec.block_size
            rows = [lane * block + d for lane, depth in enumerate(depths) for d in range(1, depth + 1)]
            x = x[torch.tensor(rows, device=x.device)]
        return self.vocabulary.logits(self.model.norm(x))

    def _blocks(self, states: list[DFlashState], root_tokens: list[int]) -> torch.Tensor:
        """Every lane's block (root, then masks) through the draft layers in one forward: each
        lane's rows attend to its own context and all of its block, without a mask.
        Returns [lanes * block_size, hidden], lane by lane, before the final norm."""
        block, device = self.spec.block_size, self.embed_tokens.weight.device
        masks = [self.spec.mask_token_id] * (block - 1)
        spans: list[Span] = []
        token_ids: list[int] = []
        positions: list[int] = []
        for lane, (state, root) in enumerate(zip(states, root_tokens, strict=True)):
            start = state.cache.length
            assert start + block <= state.cache.max_tokens, (start, block, state.cache.max_tokens)
            state.cache.reserve(start + block)
            spans.append(Span(state.cache, start, lane * block, block, None))
            token_ids += [root, *masks]
            positions += range(start, start + block)
        # built as lists: one host-to-device copy each, not a few small ops per step
        cos, sin = self.rotary(torch.tensor(positions, device=device))
        x = self.embed_tokens(torch.tensor(token_ids, device=device))  # [lanes * block, hidden]
        for index, layer in enumerate(self.model.draft_layers()):
            x = layer.forward_lanes(x, cos, sin, index, spans, None)
        return x

    def _num_depths(self, sequence: Sequence) -> int:
        """Block rows a lane drafts from: its chain's length, or the depths its tree may reach."""
        limit = sequence.draft_limit
        most = self.num_draft if self.tree_budget is None else self.spec.block_size - 1
        return most if limit is None else min(most, limit)

    def _tree_budget(self, sequence: Sequence) -> int:
        # Best-first adds nodes best first, so the tree of a smaller budget is the bigger tree's
        # first nodes: building it to the lane's limit equals truncating the full one.
        assert self.tree_budget is not None
        limit = sequence.draft_limit
        return self.tree_budget if limit is None else min(self.tree_budget, limit)

    def _candidates(self, logits: torch.Tensor) -> list[list[tuple[int, float]]]:
        """Per row (a depth of some lane), the top-k (token, logprob) pairs, best first."""
        logprobs = torch.log_softmax(logits.float(), dim=-1)  # [rows, vocab]
        top = torch.topk(logprobs, min(self.tree_top_k, logprobs.shape[-1]), dim=-1)
        token_ids = self.vocabulary.to_target(top.indices)
        # One read-back for tokens and logprobs: float64 holds every token id and float32 exactly.
        host = torch.stack((token_ids.double(), top.values.double())).tolist()  # [2][rows][k]
        return [
            [(int(token), min(logprob, 0.0)) for token, logprob in zip(tokens, values)]
            for tokens, values in zip(host[0], host[1])
        ]

    def state_bytes(self, state: DFlashState) -> int:
        return state.cache.num_bytes

    # The context K/V at position p depends on the target's hidden states at p alone, so a prefix
    # of N tokens determines exactly the first N context slots: a snapshot is those, copied.

    def export_prefix(self, state: DFlashState, num_tokens: int) -> DFlashState:
        cache = state.cache
        assert 0 < num_tokens <= cache.length, (num_tokens, cache.length)
        snapshot = DFlashState(KVCache(self.config, num_tokens, cache.keys.dtype, cache.keys.device))
        snapshot.cache.load_prefix(cache.keys[:, :, :num_tokens], cache.values[:, :, :num_tokens])
        return snapshot

    def import_prefix(self, sequence: Sequence, snapshot: DFlashState) -> DFlashState:
        state = self.start(sequence)
        num_tokens = snapshot.cache.length
        state.cache.load_prefix(snapshot.cache.keys[:, :, :num_tokens], snapshot.cache.values[:, :, :num_tokens])
        return state


def load_dflash_drafter(model: LoadedModel, options: DraftOptions, tree: bool) -> DFlashDrafter:
    mode = "tree" if tree else "dflash"
    checkpoint = read_draft_checkpoint(_find_dflash_path(model, options, mode))
    assert checkpoint.folder is not None  # read from a folder: a bare file is refused
    draft_vocab = read_draft_vocabulary(checkpoint.folder, model.config.vocab_size)
    target = model.config
    spec = parse_dflash_spec(checkpoint, target)
    config = _draft_model_config(checkpoint, target)
    decoder = model.decoder
    with torch.device("meta"):
        drafter_model = DFlashModel(config, len(spec.target_layer_ids))
    load_weights(drafter_model, checkpoint.tensors, "", checkpoint.source, decoder.dtype, decoder.device)
    drafter_model.requires_grad_(False)
    if model.formats is not None:  # a quantized target: fc and the layers' linears int8 (drafter_formats)
        linears_in_format(drafter_model, drafter_formats(model.formats), decoder.device)
    drafter = DFlashDrafter(
        drafter_model,
        config,
        spec,
        decoder.model.embed_tokens,
        decoder.lm_head,
        num_draft=options.num_draft or spec.block_size - 1,
        tree_budget=options.tree_budget if tree else None,
        tree_top_k=options.tree_top_k,
        draft_vocab=draft_vocab,
    )
    drafter.source = checkpoint.source
    return drafter


def _find_dflash_path(model: LoadedModel, options: DraftOptions, mode: str) -> Path:
    if options.draft is not None:
        return options.draft
    bundled = bundled_drafter_path(model.name, "dflash")
    if bundled is not None:
        return bundled
    raise DrafterError(
        f"speculation mode {mode!r} needs a DFlash drafter and none is bundled for model {model.name}: pass "
        f"--draft PATH (a folder with config.json + model.safetensors in the z-lab DFlash format) "
        f"or choose another --speculation mode (ngram needs no drafter)"
    )


def parse_dflash_spec(checkpoint: DraftCheckpoint, target: ModelConfig) -> DFlashSpec:
    """The DFlash fields of config.json, checked against the target."""
    config, source = checkpoint.config, checkpoint.source
    dflash = config.get("dflash_config")
    if not isinstance(dflash, dict):
        raise DrafterError(f"{source}: config.json has no dflash_config object: not a DFlash drafter (z-lab format)")
    block_size = dflash.get("block_size", config.get("block_size"))
    if not isinstance(block_size, int) or block_size < 2:
        raise DrafterError(f"{source}: block_size={block_size!r} must be an integer >= 2")
    mask_token_id = dflash.get("mask_token_id")
    if not isinstance(mask_token_id, int) or not 0 <= mask_token_id < target.vocab_size:
        raise DrafterError(
            f"{source}: dflash_config.mask_token_id={mask_token_id!r} must be a token id "
            f"below the target's vocab_size={target.vocab_size}"
        )
    return DFlashSpec(block_size, mask_token_id, _target_layer_ids(dflash, target, source))


def _target_layer_ids(dflash: dict, target: ModelConfig, source: str) -> tuple[int, ...]:
    ids = dflash.get("target_layer_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        raise DrafterError(
            f"{source}: dflash_config.target_layer_ids={ids!r} must be a non-empty list of layer indices"
        )
    bad = [i for i in ids if not 0 <= i < target.num_hidden_layers]
    if bad:
        raise DrafterError(
            f"{source}: dflash_config.target_layer_ids has {bad[0]}, outside the target's "
            f"{target.num_hidden_layers} layers (0..{target.num_hidden_layers - 1})"
        )
    return tuple(ids)


def _draft_model_config(checkpoint: DraftCheckpoint, target: ModelConfig) -> ModelConfig:
    raw, source = checkpoint.config, checkpoint.source
    if raw.get("hidden_size") != target.hidden_size:
        raise DrafterError(
            f"{source}: hidden_size={raw.get('hidden_size')!r} does not match the target's "
            f"hidden_size={target.hidden_size}"
        )
    layer_types = set(raw.get("layer_types") or ["full_attention"])
    if layer_types != {"full_attention"}:
        raise DrafterError(f"{source}: layer_types={sorted(layer_types)} is not supported (only full_attention)")
    # Qwen3-style whatever model_type says: DFlash layers always carry q/k norms.
    qwen3 = {**raw, "model_type": "qwen3", "vocab_size": target.vocab_size}
    try:
        return ModelConfig.from_hf(qwen3)
    except CheckpointError as error:
        raise DrafterError(f"{source}: {error}") from error


def _split(values: list[_T], counts: list[int]) -> list[list[_T]]:
    """`values` cut into consecutive runs of `counts` (a flat per-row list back into lanes)."""
    runs, first = [], 0
    for count in counts:
        runs.append(values[first : first + count])
        first += count
    return runs
