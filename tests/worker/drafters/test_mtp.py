"""The MTP drafter: Qwen3-Next-format heads load from the target checkpoint, a folder or a file;
broken ones are refused by name; its drafts match an independent recomputation whose decoder
layer is transformers' own (the head's layer is shaped exactly like a target layer)."""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

from shared.sampling import SamplingParams
from tests.support.tiny_drafters import (
    one_torch_thread,
    read_config,
    speculation_checkpoints,
    transformers_layer_outputs,
    write_random_mtp,
)
from worker.drafters.mtp import MtpDrafter
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.drafter_protocol import DrafterError
from worker.engine.runner import ModelRunner
from worker.engine.sequence import Sequence
from worker.models.loader import LoadedModel, load_model

PROMPT = [12, 40, 7, 7, 99, 140, 3, 56, 21, 88, 5]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_torch_thread():
        yield


@functools.cache
def target(family: str = "qwen3") -> LoadedModel:
    return load_model(speculation_checkpoints(family).target, dtype="float64")


def without_embedded_head(model: LoadedModel) -> LoadedModel:
    return dataclasses.replace(model, extra_tensors={})


def mtp_folder(tmp_path: Path, family: str = "qwen3", **kwargs) -> Path:
    return write_random_mtp(tmp_path / "mtp", speculation_checkpoints(family).target, **kwargs)


def load_mtp(model: LoadedModel, draft: Path | None = None, num_draft: int | None = None) -> MtpDrafter:
    drafter = load_drafter("mtp", model, DraftOptions(draft=draft, num_draft=num_draft))
    assert isinstance(drafter, MtpDrafter)
    return drafter


# --- loading and refusing -------------------------------------------------------------------


def test_head_inside_the_target_checkpoint_loads_with_the_family_default():
    drafter = load_mtp(target())
    assert drafter.num_draft == 3
    assert drafter.wants_final_hidden and drafter.hidden_layers == ()  # qwen3: post_norm


def test_head_from_a_folder_and_from_a_bare_file_draft_alike(tmp_path):
    folder = mtp_folder(tmp_path)
    bare = tmp_path / "head.safetensors"
    shutil.copy(folder / "model.safetensors", bare)
    model = without_embedded_head(target())
    from_folder, from_file = load_mtp(model, folder), load_mtp(model, bare)
    assert _drafts(model, from_folder) == _drafts(model, from_file)


def test_explicit_draft_wins_over_the_embedded_head(tmp_path):
    model = target()
    embedded = load_mtp(model)
    given = load_mtp(model, mtp_folder(tmp_path, seed=7))
    weights = load_file(str(tmp_path / "mtp" / "model.safetensors"))
    assert torch.equal(given.head.fc.weight, weights["mtp.fc.weight"].double())
    assert not torch.equal(embedded.head.fc.weight, given.head.fc.weight)


def test_a_target_without_a_head_and_no_draft_is_refused_with_directions():
    with pytest.raises(DrafterError, match=r"needs an MTP head.*--draft PATH.*mtp\.fc"):
        load_mtp(without_embedded_head(target()))


def test_mtp_hidden_setting_in_the_head_config_selects_the_pre_norm_hidden(tmp_path):
    drafter = load_mtp(without_embedded_head(target()), mtp_folder(tmp_path, mtp_hidden="pre_norm"))
    assert drafter.hidden_layers == (target().config.num_hidden_layers - 1,)
    assert not drafter.wants_final_hidden


def test_unknown_mtp_hidden_setting_is_refused(tmp_path):
    with pytest.raises(DrafterError, match="mtp_hidden='middle'"):
        load_mtp(target(), mtp_folder(tmp_path, mtp_hidden="middle"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(reshape={"mtp.fc.weight": (64, 64)}), r"mtp\.fc\.weight has shape \(64, 64\), expected \(64, 128\)"),
        (dict(drop=["mtp.layers.0.self_attn.k_norm.weight"]), r"mtp\.layers\.0\.self_attn\.k_norm\.weight is missing"),
        (dict(drop=["mtp.pre_fc_norm_hidden.weight"]), r"mtp\.pre_fc_norm_hidden\.weight is missing"),
        (dict(reshape={"mtp.layers.1.mlp.up_proj.weight": (128, 64)}), r"unexpected tensor mtp\.layers\.1\.mlp"),
    ],
)
def test_broken_heads_are_refused_naming_the_tensor(tmp_path, kwargs, message):
    with pytest.raises(DrafterError, match=message):
        load_mtp(target(), mtp_folder(tmp_path, **kwargs))


def test_a_head_for_another_hidden_size_is_refused(tmp_path):
    folder = mtp_folder(tmp_path, family="qwen3")
    config = read_config(folder)
    (folder / "config.json").write_text(json.dumps({**config, "hidden_size": 32}))
    with pytest.raises(DrafterError, match="hidden_size=32"):
        load_mtp(target(), folder)


def test_a_missing_draft_path_is_refused(tmp_path):
    with pytest.raises(DrafterError, match="does not exist"):
        load_mtp(target(), tmp_path / "nowhere")


# --- what it drafts -------------------------------------------------------------------------


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class Reference:
    """The MTP recurrence recomputed from scratch over the whole sequence at every step.

    The target's hidden states come from transformers; the head's decoder layer and final norm
    run as a one-layer transformers model fed `inputs_embeds` = fc(cat[norm(embed), norm(h)]).
    """

    def __init__(self, folder: Path, tensors: dict[str, torch.Tensor], hidden_source: str):
        self.target = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
        config = read_config(folder)
        config.pop("layer_types", None)  # sized for the target's layer count
        head_config = transformers.AutoConfig.for_model(**{**config, "num_hidden_layers": 1})
        self.head = transformers.AutoModel.from_config(head_config, dtype=torch.float64).eval()
        state = {name.removeprefix("mtp."): t.double() for name, t in tensors.items() if name.startswith("mtp.layers.")}
        state["norm.weight"] = tensors["mtp.norm.weight"].double()
        state["embed_tokens.weight"] = self.target.model.embed_tokens.weight
        self.head.load_state_dict(state, strict=True)
        self.tensors = {name: t.double() for name, t in tensors.items()}
        self.eps, self.hidden_source = config["rms_norm_eps"], hidden_source

    @torch.no_grad()
    def drafts(self, committed: list[int], root: int, num_draft: int) -> tuple[torch.Tensor, list[int]]:
        """(logits of the first draft, the greedy chain) after `committed` + root."""
        hidden = self._target_hidden(committed)  # [L, hidden]
        next_ids = committed[1:] + [root]
        first_logits, drafts = None, []
        for _ in range(num_draft):
            g = self._head(torch.tensor(next_ids), hidden)  # [len, hidden]
            logits = self.target.lm_head(g[-1])
            first_logits = logits if first_logits is None else first_logits
            drafts.append(int(logits.argmax()))
            next_ids, hidden = next_ids + [drafts[-1]], torch.cat([hidden, g[-1:]])
        return first_logits, drafts

    def _target_hidden(self, committed: list[int]) -> torch.Tensor:
        layers, final = transformers_layer_outputs(self.target, committed)
        return final if self.hidden_source == "post_norm" else layers[len(layers) - 1]

    def _head(self, token_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        t = self.tensors
        embedded = _rms(self.target.model.embed_tokens(token_ids), t["mtp.pre_fc_norm_embedding.weight"], self.eps)
        z = torch.cat([embedded, _rms(hidden, t["mtp.pre_fc_norm_hidden.weight"], self.eps)], dim=-1)
        z = z @ t["mtp.fc.weight"].T
        positions = torch.arange(z.shape[0])[None]
        return self.head(inputs_embeds=z[None], position_ids=positions).last_hidden_state[0]


def _run_prefill(model: LoadedModel, drafter: MtpDrafter, chunk: int = 3) -> tuple[ModelRunner, Sequence]:
    runner = ModelRunner(model.decoder, [], drafter)
    sequence = runner.start("mtp", PROMPT, SamplingParams(max_tokens=16, ignore_eos=True))
    while sequence.num_to_prefill > 0:
        runner.prefill(sequence, chunk)
    return runner, sequence


def _drafts(model: LoadedModel, drafter: MtpDrafter) -> list[int]:
    _, sequence = _run_prefill(model, drafter)
    return drafter.propose(sequence.drafter_state, sequence).tokens


@pytest.mark.parametrize("hidden_source", ["post_norm", "pre_norm"])
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_drafts_match_a_from_scratch_recomputation(tmp_path, family, hidden_source):
    folder = speculation_checkpoints(family).target
    head = mtp_folder(tmp_path, family, mtp_hidden=hidden_source, seed=11)
    reference = Reference(folder, load_file(str(head / "model.safetensors")), hidden_source)
    model = without_embedded_head(target(family))
    drafter = load_mtp(model, head, num_draft=4)
    runner, sequence = _run_prefill(model, drafter)
    for _ in range(3):  # after the chunked prefill, then after decode steps that commit 1+ tokens
        state = sequence.drafter_state
        logits, drafts = reference.drafts(sequence.token_ids[:-1], sequence.root_token, num_draft=4)
        # transformers normalizes in float32 even for float64 weights, hence 1e-5 rather than 1e-10.
        with torch.inference_mode():  # the head's prediction of the token after the root
            predicted = drafter.vocabulary.logits(state.next_hidden)
        torch.testing.assert_close(predicted, logits, rtol=0, atol=1e-5)
        assert drafter.propose(state, sequence).tokens == drafts
        assert state.cache.length == sequence.cache.length  # proposing left the committed pairs alone
        runner.decode_step(sequence)


def test_a_one_token_prompt_drafts_nothing_until_a_token_is_committed():
    model = target()
    drafter = load_mtp(model)
    runner = ModelRunner(model.decoder, [], drafter)
    sequence = runner.start("one", [42], SamplingParams(max_tokens=4, ignore_eos=True))
    assert drafter.propose(sequence.drafter_state, sequence) is None
    runner.decode_step(sequence)
    assert drafter.propose(sequence.drafter_state, sequence).num_nodes == 3
