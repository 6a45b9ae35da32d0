"""Draft vocabularies (draft_vocab.json): drafting over a subset of the target's tokens is cheaper
and changes nothing in the output. Drafts only ever come from the subset, greedy output still
equals plain decoding, and a broken file is refused by name."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from shared.sampling import SamplingParams
from tests.support.tiny_drafters import one_torch_thread, speculation_checkpoints, write_random_mtp
from worker.drafters.draft_vocab import DraftVocabulary, read_draft_vocabulary, write_draft_vocabulary
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.drafter_protocol import DrafterError
from worker.engine.runner import ModelRunner
from worker.models.loader import LoadedModel, load_model

PROMPTS = [[12, 40, 7, 7, 99, 140, 3, 56, 21, 88, 5], [5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [200, 3, 17]]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_torch_thread():
        yield


@functools.cache
def target() -> LoadedModel:
    return load_model(speculation_checkpoints("qwen3").target, dtype="float64")


def half_the_vocabulary() -> torch.Tensor:
    return torch.arange(0, target().config.vocab_size, 2)  # the even token ids


def test_logits_over_the_subset_are_the_full_heads_logits_at_those_tokens():
    head = nn.Linear(8, 50, bias=True).double()
    ids = torch.tensor([3, 17, 42, 0])
    vocabulary = DraftVocabulary(head, ids)
    hidden = torch.randn(2, 8, dtype=torch.float64)
    torch.testing.assert_close(vocabulary.logits(hidden), head(hidden)[:, ids])
    assert vocabulary.to_target(torch.tensor([2, 0])).tolist() == [42, 3]
    whole = DraftVocabulary(head)
    assert whole.size == 50 and whole.to_target(torch.tensor([7])).tolist() == [7]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "expected a JSON object with a token_ids list"),
        ('{"ids": [1]}', "expected a JSON object with a token_ids list"),
        ('{"token_ids": []}', "non-empty list of token ids below"),
        ('{"token_ids": [1, 99999]}', "below the target's vocab_size=320"),
        ('{"token_ids": [1, 2, 1]}', "duplicates"),
    ],
)
def test_a_broken_draft_vocab_file_is_refused_by_name(tmp_path, content, message):
    (tmp_path / "draft_vocab.json").write_text(content)
    with pytest.raises(DrafterError, match=message) as error:
        read_draft_vocabulary(tmp_path, 320)
    assert "draft_vocab.json" in str(error.value)


def test_no_file_means_the_whole_vocabulary(tmp_path):
    assert read_draft_vocabulary(tmp_path, 320) is None


@functools.cache
def drafter_folders() -> dict[str, Path]:
    """The tiny MTP head and DFlash drafter, each with draft_vocab.json = the even token ids."""
    root = Path(__import__("tempfile").mkdtemp(prefix="arbor-draft-vocab-"))
    mtp = write_random_mtp(root / "mtp", speculation_checkpoints("qwen3").target)
    dflash = root / "dflash"
    shutil.copytree(speculation_checkpoints("qwen3").dflash, dflash)
    for folder in (mtp, dflash):
        write_draft_vocabulary(folder, half_the_vocabulary())
    return {"mtp": mtp, "dflash": dflash, "tree": dflash}


def decode(mode: str, prompt: list[int], drafted: list[int]) -> list[int]:
    model = target()
    drafter = None
    if mode != "none":
        drafter = load_drafter(mode, model, DraftOptions(draft=drafter_folders()[mode]))
        assert drafter.vocabulary.size == len(half_the_vocabulary())
        propose = drafter.propose

        def recording(state, sequence):
            tree = propose(state, sequence)
            if tree is not None:
                drafted.extend(tree.tokens)
            return tree

        drafter.propose = recording
    runner = ModelRunner(model.decoder, model.checkpoint.eos_token_ids, drafter)
    sequence = runner.start("vocab", prompt, SamplingParams(max_tokens=40, ignore_eos=True))
    while sequence.num_to_prefill > 0:
        runner.prefill(sequence, 64)
    while not sequence.finished:
        runner.decode_step(sequence)
    return sequence.output_ids


@pytest.mark.parametrize("mode", ["mtp", "dflash", "tree"])
def test_drafts_come_from_the_subset_and_greedy_output_is_unchanged(mode):
    drafted: list[int] = []
    for prompt in PROMPTS:
        assert decode(mode, prompt, drafted) == decode("none", prompt, [])
    assert drafted, "nothing was drafted: the test would prove nothing"
    assert all(token % 2 == 0 for token in drafted), sorted(set(t for t in drafted if t % 2))
    emitted = {t for prompt in PROMPTS for t in decode("none", prompt, [])}
    assert any(t % 2 for t in emitted), "the target itself must still emit tokens outside the subset"
