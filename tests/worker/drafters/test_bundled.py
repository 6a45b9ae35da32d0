"""The drafters shipped for the default model (worker/drafters/bundled/SmolLM2-135M-Instruct/):
they load, match their config and the target, stay within the size budget, are picked up when no
mode is chosen, keep greedy output identical to plain decoding, and draft well enough that a broken
or mismatched drafter (which would accept almost nothing) fails the tokens-per-forward floor."""

from __future__ import annotations

import functools
import json

import pytest

from ops.training.prompts import HELD_OUT
from shared.sampling import SamplingParams
from shared.settings import DEFAULT_MODEL_NAME, WorkerSettings
from worker.drafters.dflash import parse_dflash_spec
from worker.drafters.draft_checkpoint import bundled_drafter_path, read_draft_checkpoint
from worker.drafters.draft_vocab import read_draft_vocabulary
from worker.drafters.picker import SourcePicker
from worker.engine.generate import generate
from worker.serving_model import ServingModel, load_serving_model

MAX_BYTES = 25 * 1024 * 1024
PROMPT = [{"role": "user", "content": HELD_OUT[0]}]  # never trained on
MAX_TOKENS = 48
# Floors well under what the committed drafters measure on this prompt (docs/DRAFTERS.md), and
# well over what a drafter that is broken, or trained for another model, gets (~1.0).
TOKENS_PER_FORWARD_FLOOR = {"mtp": 1.2, "dflash": 1.08, "tree": 1.2}


@functools.cache
def served(mode: str) -> ServingModel:
    return load_serving_model(None, mode, num_threads=1)


@functools.cache
def greedy(mode: str):
    model = served(mode)
    return generate(
        model.runner, model.tokenizer, model.encode_chat(PROMPT), SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    )


@pytest.mark.parametrize("kind", ["mtp", "dflash"])
def test_bundled_drafter_matches_its_config_and_the_size_budget(kind):
    folder = bundled_drafter_path(DEFAULT_MODEL_NAME, kind)
    assert folder is not None, f"no bundled {kind} drafter for {DEFAULT_MODEL_NAME}"
    total = sum(path.stat().st_size for path in folder.iterdir())
    assert total <= MAX_BYTES, f"{folder}: {total / 2**20:.1f} MB > 25 MB"
    checkpoint = read_draft_checkpoint(folder)
    target = served("none").loaded.config
    assert checkpoint.config["hidden_size"] == target.hidden_size
    assert checkpoint.config["target"] == DEFAULT_MODEL_NAME
    assert {t.dtype for t in checkpoint.tensors.values()} == {__import__("torch").bfloat16}
    if kind == "mtp":
        assert all(name.startswith("mtp.") for name in checkpoint.tensors)
    else:
        spec = parse_dflash_spec(checkpoint, target)
        assert spec.block_size == json.loads((folder / "config.json").read_text())["block_size"]
    vocabulary = read_draft_vocabulary(folder, target.vocab_size)
    assert vocabulary is not None and 1000 < len(vocabulary) < target.vocab_size


def test_the_default_model_drafts_from_its_bundled_head_by_default(monkeypatch):
    monkeypatch.delenv("SPECULATION", raising=False)
    assert WorkerSettings().speculation == "auto"
    drafter = served("auto").runner.drafter
    assert isinstance(drafter, SourcePicker) and drafter.model is not None and drafter.model.name == "mtp"


@pytest.mark.parametrize("mode", ["mtp", "dflash", "tree"])
def test_bundled_drafters_are_lossless_and_draft_well(mode):
    plain, speculative = greedy("none"), greedy(mode)
    assert speculative.token_ids == plain.token_ids
    stats = speculative.stats
    tokens_per_forward = stats.generated_tokens / stats.target_forwards
    assert tokens_per_forward >= TOKENS_PER_FORWARD_FLOOR[mode], f"{mode}: {tokens_per_forward:.2f} tokens/forward"
