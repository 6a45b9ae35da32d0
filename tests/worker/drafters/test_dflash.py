"""The DFlash drafter: z-lab-format drafters load, malformed ones are refused naming the field or
tensor, and its block logits match an independent from-scratch implementation of z-lab's
semantics fed with transformers' hidden states."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file

from shared.sampling import SamplingParams
from tests.support.tiny_drafters import (
    one_torch_thread,
    read_config,
    speculation_checkpoints,
    transformers_layer_outputs,
    write_random_dflash,
)
from worker.drafters.dflash import DFlashDrafter
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.drafter_protocol import DrafterError
from worker.engine.runner import ModelRunner
from worker.models.loader import LoadedModel, load_model
from worker.speculation.tree import build_best_first_tree

PROMPT = [12, 40, 7, 7, 99, 140, 3, 56, 21, 88, 5, 17, 230]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_torch_thread():
        yield


@functools.cache
def target(family: str = "qwen3") -> LoadedModel:
    return load_model(speculation_checkpoints(family).target, dtype="float64")


def dflash_folder(tmp_path: Path, family: str = "qwen3", **kwargs) -> Path:
    return write_random_dflash(tmp_path / "dflash", speculation_checkpoints(family).target, **kwargs)


def load_dflash(folder: Path | None, mode: str = "dflash", family: str = "qwen3", **options) -> DFlashDrafter:
    drafter = load_drafter(mode, target(family), DraftOptions(draft=folder, **options))
    assert isinstance(drafter, DFlashDrafter)
    return drafter


# --- loading and refusing -------------------------------------------------------------------


def test_a_drafter_in_the_zlab_format_loads(tmp_path):
    drafter = load_dflash(dflash_folder(tmp_path, block_size=6, target_layer_ids=(1, 0), num_layers=2))
    assert drafter.spec.block_size == 6 and drafter.spec.target_layer_ids == (1, 0)
    assert drafter.hidden_layers == (1, 0) and not drafter.wants_final_hidden
    assert drafter.num_draft == 5 and drafter.name == "dflash"
    assert len(drafter.model.layers) == 2


def test_num_draft_is_capped_by_the_block(tmp_path):
    folder = dflash_folder(tmp_path, block_size=4)
    assert load_dflash(folder, num_draft=2).num_draft == 2
    assert load_dflash(folder, num_draft=9).num_draft == 3


@pytest.mark.parametrize("mode", ["dflash", "tree"])
def test_without_a_draft_the_mode_is_refused_with_directions(mode):
    with pytest.raises(DrafterError, match=rf"'{mode}' needs a DFlash drafter.*--draft PATH"):
        load_dflash(None, mode)


@pytest.mark.parametrize(
    ("edits", "message"),
    [
        (dict(dflash_config=None), "no dflash_config"),
        (dict(dflash_config={"target_layer_ids": [0, 1]}), r"dflash_config\.mask_token_id=None"),
        (dict(dflash_config={"mask_token_id": 5000, "target_layer_ids": [0, 1]}), r"mask_token_id=5000"),
        (dict(dflash_config={"mask_token_id": 5}), r"dflash_config\.target_layer_ids=None"),
        (dict(dflash_config={"mask_token_id": 5, "target_layer_ids": [0, 2]}), r"target_layer_ids has 2, outside"),
        (dict(block_size=None), r"block_size=None"),
        (dict(block_size=1), r"block_size=1"),
        (dict(hidden_size=32), r"hidden_size=32 does not match the target's hidden_size=64"),
        (dict(num_attention_heads=None), r"missing 'num_attention_heads'"),
        (dict(layer_types=["sliding_attention"]), r"layer_types"),
    ],
)
def test_malformed_configs_are_refused_naming_the_field(tmp_path, edits, message):
    with pytest.raises(DrafterError, match=message):
        load_dflash(dflash_folder(tmp_path, target_layer_ids=(0, 1), config_edits=edits))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(reshape={"fc.weight": (64, 64)}), r"fc\.weight has shape \(64, 64\), expected \(64, 128\)"),
        (dict(drop=["layers.0.self_attn.k_norm.weight"]), r"layers\.0\.self_attn\.k_norm\.weight is missing"),
        (dict(drop=["hidden_norm.weight"]), r"hidden_norm\.weight is missing"),
        (
            dict(reshape={"candidate_selector.hidden_projection.weight": (8, 64)}),
            r"unexpected tensor candidate_selector",
        ),
    ],
)
def test_malformed_weights_are_refused_naming_the_tensor(tmp_path, kwargs, message):
    with pytest.raises(DrafterError, match=message):
        load_dflash(dflash_folder(tmp_path, target_layer_ids=(0, 1), **kwargs))


def test_a_folder_without_config_is_refused(tmp_path):
    folder = dflash_folder(tmp_path, target_layer_ids=(0, 1))
    (folder / "config.json").unlink()
    with pytest.raises(DrafterError, match="config.json"):
        load_dflash(folder)


# --- what it drafts -------------------------------------------------------------------------


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """x: [T, heads, d]; the half-split rotation."""
    dim = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.outer(positions.double(), inv_freq)  # [T, d/2]
    cos, sin = torch.cat([angles.cos()] * 2, -1)[:, None], torch.cat([angles.sin()] * 2, -1)[:, None]
    rotated = torch.cat([-x[..., dim // 2 :], x[..., : dim // 2]], dim=-1)
    return x * cos + rotated * sin


class Reference:
    """z-lab's DFlash forward written out for one block, recomputing the whole context each time."""

    def __init__(self, target_folder: Path, drafter_folder: Path):
        self.target = transformers.AutoModelForCausalLM.from_pretrained(target_folder, dtype=torch.float64).eval()
        self.config = read_config(drafter_folder)
        self.w = {name: t.double() for name, t in load_file(str(drafter_folder / "model.safetensors")).items()}

    @torch.no_grad()
    def block_logits(self, committed: list[int], root: int) -> torch.Tensor:
        c, w = self.config, self.w
        eps, block_size = c["rms_norm_eps"], c["block_size"]
        context = _rms(self._features(committed) @ w["fc.weight"].T, w["hidden_norm.weight"], eps)  # [L, hidden]
        block_ids = torch.tensor([root] + [c["dflash_config"]["mask_token_id"]] * (block_size - 1))
        x = self.target.model.embed_tokens(block_ids)
        positions = torch.arange(len(committed) + block_size)
        for i in range(c["num_hidden_layers"]):
            x = self._layer(f"layers.{i}.", x, context, positions)
        return self.target.lm_head(_rms(x, w["norm.weight"], eps)[1:])

    def _features(self, committed: list[int]) -> torch.Tensor:
        """cat of the outputs of the target layers named in target_layer_ids: [L, n * hidden]."""
        outputs, _ = transformers_layer_outputs(self.target, committed)
        return torch.cat([outputs[i] for i in self.config["dflash_config"]["target_layer_ids"]], dim=-1)

    def _layer(self, p: str, x: torch.Tensor, context: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        c, w = self.config, self.w
        eps, heads, kv_heads, d = c["rms_norm_eps"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        h = _rms(x, w[p + "input_layernorm.weight"], eps)
        both = torch.cat([context, h])  # context rows first, then the block
        q = _rms((h @ w[p + "self_attn.q_proj.weight"].T).view(len(h), heads, d), w[p + "self_attn.q_norm.weight"], eps)
        k = _rms(
            (both @ w[p + "self_attn.k_proj.weight"].T).view(len(both), kv_heads, d),
            w[p + "self_attn.k_norm.weight"],
            eps,
        )
        v = (both @ w[p + "self_attn.v_proj.weight"].T).view(len(both), kv_heads, d)
        q, k = _rope(q, positions[len(context) :], c["rope_theta"]), _rope(k, positions, c["rope_theta"])
        k, v = k.repeat_interleave(heads // kv_heads, dim=1), v.repeat_interleave(heads // kv_heads, dim=1)
        scores = torch.einsum("thd,shd->hts", q, k) / d**0.5  # every block row sees everything
        out = torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(len(h), heads * d)
        x = x + out @ w[p + "self_attn.o_proj.weight"].T
        h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        return x + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T


@pytest.mark.parametrize(
    ("family", "target_layer_ids", "block_size"),
    [
        ("qwen3", (0, 1), 4),
        ("qwen3", (1,), 6),
        ("llama", (1, 0), 5),
    ],
)
def test_block_logits_match_a_from_scratch_recomputation(tmp_path, family, target_layer_ids, block_size):
    folder = dflash_folder(tmp_path, family, block_size=block_size, target_layer_ids=target_layer_ids, seed=5)
    reference = Reference(speculation_checkpoints(family).target, folder)
    drafter = load_dflash(folder, family=family)
    runner = ModelRunner(target(family).decoder, [], drafter)
    sequence = runner.start("dflash", PROMPT, SamplingParams(max_tokens=16, ignore_eos=True))
    while sequence.num_to_prefill > 0:
        runner.prefill(sequence, 5)  # context arrives in chunks
    for _ in range(3):  # after the prefill, then after decode steps
        logits = drafter.block_logits(sequence.drafter_state, sequence.root_token)
        expected = reference.block_logits(sequence.token_ids[:-1], sequence.root_token)
        # transformers normalizes in float32 even for float64 weights, hence 1e-5 rather than 1e-10.
        torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)
        assert drafter.propose(sequence.drafter_state, sequence).tokens == expected.argmax(-1).tolist()
        runner.decode_step(sequence)


def test_tree_mode_builds_the_best_first_tree_of_the_block_distributions(tmp_path):
    folder = dflash_folder(tmp_path, block_size=5, target_layer_ids=(0, 1))
    drafter = load_dflash(folder, "tree", tree_budget=7, tree_top_k=3)
    assert drafter.name == "tree"
    runner = ModelRunner(target().decoder, [], drafter)
    sequence = runner.start("tree", PROMPT, SamplingParams(max_tokens=8, ignore_eos=True))
    runner.prefill(sequence, 64)
    logprobs = torch.log_softmax(drafter.block_logits(sequence.drafter_state, sequence.root_token), dim=-1)
    top = torch.topk(logprobs, 3, dim=-1)
    candidates = [list(zip(ids, values)) for ids, values in zip(top.indices.tolist(), top.values.tolist())]
    tree = drafter.propose(sequence.drafter_state, sequence)
    expected = build_best_first_tree(candidates, 7)
    assert (tree.tokens, tree.parents) == (expected.tokens, expected.parents)
    assert tree.num_nodes == 7 and not tree.is_chain


def test_proposing_leaves_the_context_alone(tmp_path):
    drafter = load_dflash(dflash_folder(tmp_path, target_layer_ids=(0, 1)))
    runner = ModelRunner(target().decoder, [], drafter)
    sequence = runner.start("ctx", PROMPT, SamplingParams(max_tokens=8, ignore_eos=True))
    runner.prefill(sequence, 64)
    state = sequence.drafter_state
    first = drafter.block_logits(state, sequence.root_token)
    assert state.cache.length == len(PROMPT) - 1
    torch.testing.assert_close(drafter.block_logits(state, sequence.root_token), first, rtol=0, atol=0)
