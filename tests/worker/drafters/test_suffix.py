"""The `suffix` drafter on a tiny real target: lossless, drafting from the request's own tokens and
from finished requests' outputs, its prefix snapshots, and the proposal API with its score."""

from __future__ import annotations

import functools

import pytest

from ops.bench.repetitive import extraction_prompts, replay
from shared.sampling import SamplingParams
from tests.support.tiny_drafters import one_torch_thread, speculation_checkpoints
from worker.drafters.registry import DraftOptions, load_drafter
from worker.drafters.suffix import SuffixDrafter, SuffixOptions
from worker.engine.runner import ModelRunner
from worker.engine.sequence import Sequence
from worker.models.loader import LoadedModel, load_model
from worker.serving.model_stepper import LaneStart, ModelStepper

GREEDY = SamplingParams(max_tokens=40, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=40, ignore_eos=True, temperature=1.0, top_p=0.9, seed=11)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_torch_thread():
        yield


@functools.cache
def model() -> LoadedModel:
    return load_model(speculation_checkpoints("qwen3").target, dtype="float64")


def runner_with(drafter: SuffixDrafter | None) -> ModelRunner:
    return ModelRunner(model().decoder, model().checkpoint.eos_token_ids, drafter)


def run(runner: ModelRunner, request_id: str, prompt: list[int], params: SamplingParams) -> Sequence:
    sequence = runner.start(request_id, prompt, params)
    while sequence.num_to_prefill > 0:
        runner.prefill(sequence, 5)
    while not sequence.finished:
        runner.decode_step(sequence)
    return sequence


def repeating_prompt() -> list[int]:
    return ([40, 41, 42, 43, 44, 45, 46, 47] * 4)[:30]


def test_registered_as_a_speculation_mode():
    drafter = load_drafter("suffix", model(), DraftOptions(tree_budget=6))
    assert isinstance(drafter, SuffixDrafter)
    assert drafter.tree_budget == 6 and drafter.options.max_nodes == 6
    assert load_drafter("suffix", model(), DraftOptions(num_draft=3)).tree_budget == 3


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "seeded"])
def test_output_equals_plain_decoding_while_drafts_are_accepted(params):
    plain, suffix = runner_with(None), runner_with(SuffixDrafter())
    accepted = 0
    for index, prompt in enumerate([repeating_prompt(), [7, 8, 9, 10, 11], repeating_prompt()[3:]] * 2):
        expected = run(plain, f"p{index}", prompt, params).output_ids
        sequence = run(suffix, f"s{index}", prompt, params)
        assert sequence.output_ids == expected, index
        accepted += sequence.stats.accepted_tokens
    assert accepted > 0, "no draft was ever accepted: the test would prove nothing"


def test_a_finished_output_goes_into_the_worker_tree_and_drafts_the_next_request():
    drafter = SuffixDrafter()
    runner = runner_with(drafter)
    prompt = [30, 31, 32, 33, 34, 35]  # no repeats: its own tree has nothing to draft from
    first = run(runner, "first", prompt, GREEDY)
    assert "first" in drafter.global_tree
    assert first.stats.tokens_per_forward < 2.0
    again = run(runner, "again", prompt, GREEDY)  # greedy: the same answer, drafted from the first
    assert again.output_ids == first.output_ids
    assert again.stats.tokens_per_forward > 3.0


def test_an_unfinished_request_teaches_the_worker_tree_nothing():
    drafter = SuffixDrafter()
    runner = runner_with(drafter)
    sequence = runner.start("cut", [30, 31, 32], GREEDY)
    runner.prefill(sequence, 5)
    runner.decode_step(sequence)
    assert drafter.global_tree.num_sequences == 0


def test_the_proposal_names_its_source_and_expected_tokens():
    drafter = SuffixDrafter(SuffixOptions(max_nodes=4))
    runner = runner_with(drafter)
    prompt = [30, 31, 32, 33, 34, 35]
    first = run(runner, "first", prompt, GREEDY)
    sequence = runner.start("second", prompt + first.output_ids[:6], GREEDY)
    runner.prefill(sequence, 100)
    proposal = drafter.proposal(sequence.drafter_state, sequence)
    assert proposal is not None
    assert proposal.source == "global" and proposal.match_length >= 6
    assert proposal.tree.tokens == first.output_ids[6:10]  # one earlier answer: a chain, each path certain
    assert proposal.score == pytest.approx(4.0) and proposal.expected_tokens == pytest.approx(5.0)


def test_own_tokens_are_drafted_from_where_the_tail_occurred_before():
    drafter = SuffixDrafter(SuffixOptions(max_nodes=3))
    runner = runner_with(drafter)
    prompt = [50, 51, 52, 53, 54, 55, 56, 60, 50, 51, 52]
    sequence = runner.start("own", prompt, GREEDY)
    runner.prefill(sequence, 100)
    proposal = drafter.proposal(sequence.drafter_state, sequence)
    assert proposal is not None and proposal.source == "request"
    assert proposal.tree.tokens == [53, 54, 55] and proposal.match_length == 3


def test_a_prefix_snapshot_drafts_as_the_state_it_came_from():
    drafter = SuffixDrafter()
    runner = runner_with(drafter)
    prompt = repeating_prompt()
    original = runner.start("original", prompt, GREEDY)
    runner.prefill(original, 100)
    target, snapshot = runner.export_prefix(original, 16)  # as the paired prefill cache stores it
    assert snapshot.tokens == prompt[:16] and snapshot.tree is None
    assert drafter.state_bytes(snapshot) == 8 * 16
    copy = runner.start("copy", prompt, GREEDY)
    runner.attach_prefix(copy, target, snapshot)
    snapshot.tokens.append(-1)  # the imported state shares nothing with the snapshot
    runner.prefill(copy, 100)
    assert copy.drafter_state.tokens == original.drafter_state.tokens
    assert drafter.propose(copy.drafter_state, copy) == drafter.propose(original.drafter_state, original)
    assert drafter.propose(copy.drafter_state, copy) is not None


def test_the_replay_helper_measures_more_tokens_per_forward_with_suffix_drafts():
    prompts = extraction_prompts(model().tokenizer, 3)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    plain = replay(runner_with(None), prompts + prompts, params)
    suffix = replay(runner_with(SuffixDrafter()), prompts + prompts, params)
    assert plain.tokens_per_forward == 1.0
    assert suffix.generated_tokens == plain.generated_tokens
    assert suffix.tokens_per_forward > 1.3  # the repeated requests are drafted from the first answers


def test_a_request_a_stop_string_ends_teaches_the_worker_tree_too():
    drafter = SuffixDrafter()
    stepper = ModelStepper(runner_with(drafter))
    state = stepper.start(LaneStart("stopped", [30, 31, 32], GREEDY))
    while stepper.num_to_prefill(state):
        stepper.prefill(state, 8)
    emitted = stepper.decode(state) + stepper.decode(state)
    stepper.stop(state)  # as the text pipeline does on a stop string
    assert "stopped" in drafter.global_tree
    assert drafter.global_tree.find(emitted) is not None
