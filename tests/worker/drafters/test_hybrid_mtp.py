"""The `mtp` mode on hybrid targets (Qwen3.5, Qwen3-Next): their own `mtp.*` head, a full-attention
hybrid layer, loads from the target checkpoint (every tensor used, a missing one named; a
composite Qwen3.5 checkpoint serves it as the text model does); its drafts match a recomputation
whose layer and final norm are transformers' own one-layer model of the family; greedy tokens
equal plain decoding (float64) with a random head and with a planted head whose drafts are mostly
right; seeded sampling is reproducible and a batched lane emits what it emits alone; a
prefill-cache hit drafts what a cold run drafts.

The planted head: on a target whose mixers and MLPs are damped (tied embeddings), the next token
mostly follows from the current one, so a head that passes the embedding of x_{t+1} through
(fc = [I, 0], its layer's outputs zeroed, the target's final norm) predicts what the target will
predict at t+1, and the damped mixers still move the target's argmax now and then.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from shared.sampling import SamplingParams
from tests.support.lanes_in_turn import serve_in_turn
from tests.support.tiny_drafters import one_torch_thread, transformers_layer_outputs
from tests.support.tiny_hybrid_models import HYBRID_FAMILIES, make_tiny_hybrid_model_with_mtp, mtp_layer_folder
from tests.worker.models.hybrid.test_hybrid_batched import run_batched
from tests.worker.models.hybrid.test_hybrid_prefix_cache import BLOCK as PREFIX_BLOCK
from tests.worker.models.hybrid.test_hybrid_prefix_cache import _lanes as shared_prefix_lanes
from tests.worker.speculation.test_lossless import decode, make_prompts
from worker.drafters.hybrid_mtp_head import HybridMtpHead
from worker.drafters.mtp import MtpDrafter
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.drafter_protocol import DrafterError
from worker.engine.runner import ModelRunner
from worker.engine.sequence import Sequence
from worker.engine.stats import SpecStats
from worker.models.hybrid.moe import SparseMoe, SwiGLU
from worker.models.loader import LoadedModel, load_model
from worker.serving.model_stepper import ModelStepper
from worker.serving.prefix_cache import PrefixCache

FAMILIES = sorted(HYBRID_FAMILIES)
GREEDY = SamplingParams(max_tokens=40, ignore_eos=True)
PREFILL_CHUNK = 5
PROMPT = [12, 40, 7, 7, 99, 140, 3, 56, 21, 88, 5]
DAMPING = 0.07  # the target's o_proj, out_proj, down_proj (as test_hybrid_speculation damps them)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_torch_thread():
        yield


@functools.cache
def checkpoint(family: str) -> Path:
    """A tiny hybrid target with an mtp.* head inside its model.safetensors, written once per family."""
    folder = Path(tempfile.mkdtemp(prefix=f"arbor-hybrid-mtp-{family}-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return make_tiny_hybrid_model_with_mtp(folder / "target", family)


@functools.cache
def target(family: str) -> LoadedModel:
    return load_model(checkpoint(family), dtype="float64")


def load_mtp(model: LoadedModel, num_draft: int | None = None) -> MtpDrafter:
    drafter = load_drafter("mtp", model, DraftOptions(num_draft=num_draft))
    assert isinstance(drafter, MtpDrafter)
    return drafter


def with_tensors(model: LoadedModel, edit) -> LoadedModel:
    tensors = dict(model.extra_tensors)
    edit(tensors)
    return dataclasses.replace(model, extra_tensors=tensors)


# --- loading ---------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_every_mtp_tensor_of_the_checkpoint_is_a_head_parameter(family):
    model = target(family)
    drafter = load_mtp(model)
    assert isinstance(drafter.head, HybridMtpHead)
    names = {name for name in load_file(str(checkpoint(family) / "model.safetensors")) if name.startswith("mtp.")}
    assert names == {"mtp." + name for name in drafter.head.state_dict()}
    assert names == set(model.extra_tensors)  # the hybrid loader kept them, and nothing else
    for name in names:
        torch.testing.assert_close(
            drafter.head.state_dict()[name.removeprefix("mtp.")], model.extra_tensors[name].double()
        )
    mlp = drafter.head.layers[0].mlp
    assert isinstance(mlp, SparseMoe if family == "qwen3_next" else SwiGLU)  # layer 0's MLP kind, as vLLM builds it


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", ["mtp.layers.0.self_attn.q_norm.weight", "mtp.pre_fc_norm_hidden.weight"])
def test_a_missing_head_tensor_is_refused_by_name(family, name):
    model = with_tensors(target(family), lambda tensors: tensors.pop(name))
    with pytest.raises(DrafterError, match=re.escape(name) + " is missing"):
        load_mtp(model)


def test_a_tensor_the_head_does_not_own_is_refused():
    model = with_tensors(target("qwen3_next"), lambda t: t.update({"mtp.layers.1.mlp.gate.weight": torch.zeros(4, 64)}))
    with pytest.raises(DrafterError, match=r"unexpected tensor mtp\.layers\.1\.mlp\.gate\.weight"):
        load_mtp(model)


def test_a_head_shaped_for_plain_attention_is_refused():
    """Without the output gate's half, q_proj is a Qwen3 layer's: a hybrid head must not accept it."""

    def ungated(tensors):
        q_proj = tensors["mtp.layers.0.self_attn.q_proj.weight"]
        tensors["mtp.layers.0.self_attn.q_proj.weight"] = q_proj[: q_proj.shape[0] // 2]

    with pytest.raises(DrafterError, match=r"q_proj\.weight has shape"):
        load_mtp(with_tensors(target("qwen3_5_text"), ungated))


def test_a_composite_qwen3_5_checkpoint_serves_its_top_level_head(tmp_path):
    """Qwen3.5 checkpoints keep the text model under `model.language_model.*` and the head at `mtp.*`."""
    text = checkpoint("qwen3_5_text")
    folder = tmp_path / "composite"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_text((text / name).read_text())
    text_config = json.loads((text / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "text_config": text_config}))
    tensors = load_file(str(text / "model.safetensors"))
    renamed = {name.replace("model.", "model.language_model.", 1): t for name, t in tensors.items()}
    save_file(renamed, str(folder / "model.safetensors"))
    composite = load_model(folder, dtype="float64")
    assert sorted(composite.extra_tensors) == sorted(target("qwen3_5_text").extra_tensors)
    states = [_prefilled(model, load_mtp(model))[1].drafter_state for model in (composite, target("qwen3_5_text"))]
    assert states[0].next_hidden is not None
    torch.testing.assert_close(states[0].next_hidden, states[1].next_hidden, rtol=0, atol=0)  # the same head


# --- what it drafts ----------------------------------------------------------------------------


def _zero_centred_rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight)


class Reference:
    """The MTP recurrence recomputed from scratch over the whole sequence at every step.

    The target's final-normed hidden states come from transformers; the head's layer and final
    norm are the one-layer transformers model its tensors were taken from (a Qwen3NextDecoderLayer
    or Qwen3.5 decoder layer of type full_attention), fed inputs_embeds = fc(cat[norm(embed), norm(h)]).
    """

    def __init__(self, family: str):
        folder = checkpoint(family)
        self.target = transformers.AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float64, experts_implementation="eager"
        ).eval()
        layer = transformers.AutoModelForCausalLM.from_pretrained(
            mtp_layer_folder(folder), dtype=torch.float64, experts_implementation="eager"
        )
        self.head = layer.model.eval()
        self.tensors = {n: t.double() for n, t in load_file(str(folder / "model.safetensors")).items()}
        self.eps = self.target.config.rms_norm_eps

    @torch.no_grad()
    def drafts(self, committed: list[int], root: int, num_draft: int) -> tuple[torch.Tensor, list[int]]:
        """(logits of the first draft, the greedy chain) after `committed` + root."""
        _, hidden = transformers_layer_outputs(self.target, committed)  # [L, hidden], post-norm
        next_ids = committed[1:] + [root]
        first_logits, drafts = None, []
        for _ in range(num_draft):
            g = self._head(torch.tensor(next_ids), hidden)  # [len, hidden]
            logits = self.target.lm_head(g[-1])
            first_logits = logits if first_logits is None else first_logits
            drafts.append(int(logits.argmax()))
            next_ids, hidden = next_ids + [drafts[-1]], torch.cat([hidden, g[-1:]])
        return first_logits, drafts

    def _head(self, token_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        t = self.tensors
        embedded = self.target.model.embed_tokens(token_ids)
        z = torch.cat(
            [
                _zero_centred_rms(embedded, t["mtp.pre_fc_norm_embedding.weight"], self.eps),
                _zero_centred_rms(hidden, t["mtp.pre_fc_norm_hidden.weight"], self.eps),
            ],
            dim=-1,
        )  # embedding first, as vLLM's qwen3_next_mtp concatenates
        z = z @ t["mtp.fc.weight"].T
        positions = torch.arange(z.shape[0])[None]
        return self.head(inputs_embeds=z[None], position_ids=positions, use_cache=False).last_hidden_state[0]


def _prefilled(model: LoadedModel, drafter: MtpDrafter, chunk: int = 3) -> tuple[ModelRunner, Sequence]:
    runner = ModelRunner(model.decoder, [], drafter)
    sequence = runner.start("mtp", PROMPT, SamplingParams(max_tokens=16, ignore_eos=True))
    while sequence.num_to_prefill > 0:
        runner.prefill(sequence, chunk)
    return runner, sequence


@pytest.mark.parametrize("family", FAMILIES)
def test_drafts_match_transformers_one_layer_model_as_the_head(family):
    reference = Reference(family)
    model = target(family)
    drafter = load_mtp(model, num_draft=4)
    runner, sequence = _prefilled(model, drafter)
    for _ in range(3):  # after the chunked prefill, then after decode steps that commit 1+ tokens
        state = sequence.drafter_state
        logits, drafts = reference.drafts(sequence.token_ids[:-1], sequence.root_token, num_draft=4)
        # transformers' hybrid norms compute in float32 even for float64 weights
        with torch.inference_mode():
            predicted = drafter.vocabulary.logits(state.next_hidden)
        torch.testing.assert_close(predicted, logits, rtol=0, atol=1e-4)
        assert drafter.propose(state, sequence).tokens == drafts
        assert state.cache.length == sequence.cache.length  # proposing left the committed pairs alone
        runner.decode_step(sequence)


# --- lossless, reproducible, batched ------------------------------------------------------------


def prompts(family: str) -> list[list[int]]:
    return make_prompts(target(family).config.vocab_size, 4, seed=3)


@functools.cache
def damped_target(family: str) -> LoadedModel:
    folder = Path(tempfile.mkdtemp(prefix=f"arbor-hybrid-mtp-damped-{family}-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    model = load_model(make_tiny_hybrid_model_with_mtp(folder / "target", family, tie_word_embeddings=True), "float64")
    with torch.no_grad():
        for name, parameter in model.decoder.named_parameters():
            if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
                parameter.mul_(DAMPING)
    return model


def planted_drafter(model: LoadedModel) -> MtpDrafter:
    """The head passes norm(embed(x_{t+1})) through: fc = [I, 0], the layer adds nothing."""
    drafter = load_mtp(model)
    head = drafter.head
    with torch.no_grad():
        size = head.fc.weight.shape[0]
        head.fc.weight.copy_(torch.cat([torch.eye(size), torch.zeros(size, size)], dim=1))
        head.pre_fc_norm_embedding.weight.zero_()
        head.norm.weight.copy_(model.decoder.model.norm.weight)
        for name, parameter in head.layers[0].named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                parameter.zero_()
    return drafter


def _greedy_run(model: LoadedModel, drafter: MtpDrafter, family: str) -> SpecStats:
    plain = ModelRunner(model.decoder, model.checkpoint.eos_token_ids)
    speculated = ModelRunner(model.decoder, model.checkpoint.eos_token_ids, drafter)
    stats = SpecStats()
    for prompt in prompts(family):
        assert decode(speculated, prompt, GREEDY, stats) == decode(plain, prompt, GREEDY, SpecStats())
    return stats


@pytest.mark.parametrize("family", FAMILIES)
def test_the_random_head_gives_plain_greedy_tokens(family):
    stats = _greedy_run(target(family), load_mtp(target(family)), family)
    assert stats.draft_tokens > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_a_planted_head_has_drafts_accepted_and_rejected_and_gives_plain_greedy_tokens(family):
    model = damped_target(family)
    stats = _greedy_run(model, planted_drafter(model), family)
    # chains accepted past their first token, and some rejected part-way
    assert stats.accepted_per_depth[1:] and stats.accepted_per_depth[1] > 0
    assert 0 < stats.accepted_tokens < stats.draft_tokens


@pytest.mark.parametrize("family", FAMILIES)
def test_the_heads_trees_give_plain_greedy_tokens_and_hold_its_greedy_chain(family):
    """mtp-tree over a hybrid head: lossless, and each tree's first-child path is the greedy
    chain's prefix (a tree row's position, slot and parent output are a chain step's)."""
    model = target(family)
    tree_drafter = load_drafter("mtp-tree", model, DraftOptions(tree_budget=8, tree_top_k=3))
    assert isinstance(tree_drafter, MtpDrafter)
    assert _greedy_run(model, tree_drafter, family).draft_tokens > 0
    chain_drafter = load_mtp(model, num_draft=4)
    runner = ModelRunner(model.decoder, model.checkpoint.eos_token_ids, tree_drafter)
    sequence = runner.start("tree", PROMPT, GREEDY)
    while sequence.num_to_prefill:
        runner.prefill(sequence, 5)
    chain_lane = ModelRunner(model.decoder, model.checkpoint.eos_token_ids, chain_drafter)
    chained = chain_lane.start("chain", PROMPT, GREEDY)
    while chained.num_to_prefill:
        chain_lane.prefill(chained, 5)
    tree = tree_drafter.propose(sequence.drafter_state, sequence)
    chain = chain_drafter.propose(chained.drafter_state, chained)
    assert tree is not None and chain is not None and not tree.is_chain
    first_children, node = [], -1
    while (child := next((i for i, parent in enumerate(tree.parents) if parent == node), None)) is not None:
        first_children.append(tree.tokens[child])
        node = child
    assert first_children == chain.tokens[: len(first_children)] and len(first_children) >= 2


SAMPLED = [
    SamplingParams(max_tokens=12 + 3 * index, ignore_eos=True, temperature=1.0, top_p=0.9, seed=300 + index)
    for index in range(6)
]


@pytest.mark.parametrize("family", FAMILIES)
def test_seeded_sampled_runs_are_reproducible_and_a_batched_lane_emits_what_it_emits_alone(family):
    model = damped_target(family)
    runner = ModelRunner(model.decoder, model.checkpoint.eos_token_ids, planted_drafter(model))
    lane_prompts = make_prompts(model.config.vocab_size, len(SAMPLED), seed=9)
    lanes = [
        (f"lane-{i}", prompt, params) for i, (prompt, params) in enumerate(zip(lane_prompts, SAMPLED, strict=True))
    ]
    stats = SpecStats()
    alone = {name: decode(runner, prompt, params, stats) for name, prompt, params in lanes}
    assert alone == {name: decode(runner, prompt, params, SpecStats()) for name, prompt, params in lanes}
    assert stats.accepted_tokens > 0
    batched, lanes_per_step, _ = run_batched(runner, lanes)
    assert max(lanes_per_step) > 1, "lanes did share steps"
    assert batched == alone


def _serve_recording_drafts(family: str, cache: PrefixCache | None) -> tuple[dict, list, int]:
    model = target(family)
    drafter = load_mtp(model)
    proposed: list[tuple[str, list[int]]] = []
    propose = drafter.propose  # lanes served in turn draft one at a time

    def recording(state, sequence):
        tree = propose(state, sequence)
        proposed.append((sequence.request_id, tree.tokens if tree else []))
        return tree

    drafter.propose = recording  # type: ignore[method-assign]
    stepper = ModelStepper(ModelRunner(model.decoder, model.checkpoint.eos_token_ids, drafter), cache)
    outputs = serve_in_turn(stepper, shared_prefix_lanes(model.config.vocab_size, 4))
    return outputs, proposed, stepper.counters.prefix_cache_hits


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_cache_hits_draft_what_a_cold_run_drafts(family):
    """A hit continues the head from its snapshot of the prefix (its own K/V, the target hidden states)."""
    cold, cold_drafts, _ = _serve_recording_drafts(family, None)
    warm, warm_drafts, hits = _serve_recording_drafts(family, PrefixCache(1 << 30, PREFIX_BLOCK))
    assert hits > 0
    assert warm == cold
    assert warm_drafts == cold_drafts and cold_drafts
