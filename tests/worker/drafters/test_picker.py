"""The `auto` mode's picker on a tiny real target with an MTP head: each lane's draft comes from the
source that promises more (a suffix match once the text repeats, the head on fresh text), both are
named in the stats, the head's acceptance per depth is learnt from what the target committed, and
the output is plain decoding's."""

from __future__ import annotations

import functools

import pytest

from shared.sampling import SamplingParams
from tests.support.tiny_drafters import one_torch_thread, speculation_checkpoints
from worker.drafters.picker import CHAIN, TREE, PickerState, SourcePicker
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.runner import ModelRunner
from worker.engine.sequence import Sequence
from worker.models.loader import LoadedModel, load_model
from worker.speculation.tree import ROOT, DraftTree

GREEDY = SamplingParams(max_tokens=40, ignore_eos=True)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_torch_thread():
        yield


@functools.cache
def model() -> LoadedModel:
    return load_model(speculation_checkpoints("qwen3").target, dtype="float64")


def runner(mode: str) -> ModelRunner:
    return ModelRunner(model().decoder, model().checkpoint.eos_token_ids, load_drafter(mode, model(), DraftOptions()))


def run(runner: ModelRunner, request_id: str, prompt: list[int], params: SamplingParams = GREEDY) -> Sequence:
    sequence = runner.start(request_id, prompt, params)
    while sequence.num_to_prefill > 0:
        runner.prefill(sequence, 16)
    while not sequence.finished:
        runner.decode_step(sequence)
    return sequence


PROMPT = [7, 19, 23, 5, 88, 61, 30, 12, 9, 44]


def test_a_repeated_request_drafts_from_the_suffix_and_fresh_text_from_the_head():
    auto, plain = runner("auto"), runner("none")
    assert isinstance(auto.drafter, SourcePicker) and auto.drafter.model is not None
    expected = run(plain, "plain", PROMPT).output_ids
    first = run(auto, "first", PROMPT)
    assert first.output_ids == expected
    assert first.stats.by_source.get("mtp") is not None, first.stats.by_source  # nothing to match yet: the head
    again = run(auto, "again", PROMPT)  # the worker's suffix tree holds the first one's output now
    assert again.output_ids == expected
    suffix = again.stats.by_source.get("suffix")
    assert suffix is not None and suffix.accepted_tokens >= 20, again.stats.by_source
    assert again.stats.tokens_per_forward > first.stats.tokens_per_forward


def test_seeded_sampling_is_plain_samplings():
    params = SamplingParams(max_tokens=30, temperature=1.0, top_p=0.9, seed=5, ignore_eos=True)
    auto = runner("auto")
    run(auto, "teach", PROMPT, params)
    assert run(auto, "seeded", PROMPT, params).output_ids == run(runner("none"), "plain", PROMPT, params).output_ids


def test_the_heads_acceptance_is_learnt_from_what_was_committed():
    auto = runner("auto")
    picker = auto.drafter
    assert isinstance(picker, SourcePicker)
    sequence = run(auto, "learn", PROMPT)
    state = sequence.drafter_state
    head = sequence.stats.by_source["mtp"]
    attempts = state.model_acceptance.attempts
    assert attempts.get((1, 0), 0.0) > 0, "every head draft was scored at depth 1"
    rate = state.model_acceptance.rate(1, 0, 0.5)
    assert 0.0 <= rate <= 1.0
    assert head.drafts > 0
    # a head that was never right, first choice or runner-up, is not worth a draft node
    refused = DraftTree([5, 6, 7, 8], [ROOT] * 4, [1] * 4)
    for _ in range(30):
        state.model_acceptance.record(refused, [])
    picker.row_price = 0.1
    assert picker._model_cut(state, 8) == (CHAIN, 0, 1.0)


def _taught(first_choice_accepted: bool, runner_up_accepted: bool) -> PickerState:
    """A lane whose head drafted 40 trees of four depth-1 siblings a child each, with fixed outcomes."""
    state = PickerState(suffix=None)  # type: ignore[arg-type]  # the head's half only
    tree = DraftTree(list(range(5, 13)), [ROOT] * 4 + [0, 1, 2, 3], [1] * 4 + [2] * 4)
    accepted = [0, 4] if first_choice_accepted else [1, 5] if runner_up_accepted else []
    for _ in range(40):
        state.model_acceptance.record(tree, accepted)
    return state


def test_a_head_whose_runner_up_is_often_right_drafts_a_tree_where_rows_are_cheap():
    picker = runner("auto").drafter
    assert isinstance(picker, SourcePicker)
    state = _taught(first_choice_accepted=False, runner_up_accepted=True)
    picker.row_price = 0.05
    shape, nodes, worth = picker._model_cut(state, 8)
    assert shape == TREE and nodes >= 2 and worth > 1.5
    never = _taught(first_choice_accepted=False, runner_up_accepted=False)
    picker.row_price = 0.1
    assert picker._model_cut(never, 8) == (CHAIN, 0, 1.0)
    picker.row_price = 5.0  # rows far dearer than anything they could bring
    assert picker._model_cut(state, 8) == (CHAIN, 0, 1.0)


def test_a_dearer_row_cuts_the_draft_shorter():
    auto = runner("auto")
    picker = auto.drafter
    assert isinstance(picker, SourcePicker)
    run(auto, "teach", PROMPT)
    sequence = auto.start("again", PROMPT, GREEDY)
    while sequence.num_to_prefill > 0:
        auto.prefill(sequence, 16)
    auto.decode_step(sequence)  # its output starts as the first one's did: the worker's tree matches it
    cuts = []
    for price in (0.0, 0.3, 3.0):
        picker.row_price = price
        cuts.append(picker._suffix_cut(sequence.drafter_state, sequence, 8)[0])
    assert cuts[0] >= cuts[1] >= cuts[2] and cuts[0] > 0 and cuts[2] == 0, cuts
