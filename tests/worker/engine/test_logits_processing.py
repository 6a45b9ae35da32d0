"""Penalties, masks and the one-uniform-per-token sampler, checked by hand and against transformers."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from shared.sampling import SamplingParams
from worker.engine.logits_processing import (
    greedy_token,
    logprobs_of,
    make_generator,
    process_logits,
    sample_from,
)

INF = float("inf")


def _logits(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def _log_probs(*probs: float) -> list[float]:
    return [math.log(p) if p > 0 else -INF for p in probs]


def _kept(processed: torch.Tensor) -> list[list[int]]:
    return [torch.isfinite(row).nonzero().flatten().tolist() for row in processed]


# --- penalties ------------------------------------------------------------------------------------


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits() -> None:
    params = SamplingParams(repetition_penalty=2.0)
    out = process_logits(_logits([2.0, -1.0, 0.5, 3.0]), params, prompt_ids=[0], output_ids=[[1]])
    assert out.tolist() == [[1.0, -2.0, 0.5, 3.0]]  # 2 and 3 never seen


def test_repetition_penalty_counts_each_token_once() -> None:
    params = SamplingParams(repetition_penalty=2.0)
    out = process_logits(_logits([4.0, 4.0]), params, prompt_ids=[0, 0, 0], output_ids=[[0, 0]])
    assert out.tolist() == [[2.0, 4.0]]


def test_frequency_and_presence_penalties_use_generated_tokens_only() -> None:
    logits = _logits([1.0, 1.0, 1.0, 1.0])
    freq = process_logits(logits, SamplingParams(frequency_penalty=0.5), prompt_ids=[3], output_ids=[[2, 2, 1]])
    assert freq.tolist() == [[1.0, 0.5, 0.0, 1.0]]
    pres = process_logits(logits, SamplingParams(presence_penalty=0.25), prompt_ids=[3], output_ids=[[2, 2, 1]])
    assert pres.tolist() == [[1.0, 0.75, 0.75, 1.0]]


def test_penalties_combine_repetition_first_then_frequency_then_presence() -> None:
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    out = process_logits(_logits([2.0, -1.0, 0.5, 3.0]), params, prompt_ids=[0], output_ids=[[1, 1, 2]])
    # repetition: [1, -2, 0.25, 3]; frequency (counts 0,2,1,0): [1, -3, -0.25, 3]; presence: [1, -3.25, -0.5, 3]
    assert out.tolist() == [[1.0, -3.25, -0.5, 3.0]]


def test_each_row_is_penalized_by_its_own_history() -> None:
    params = SamplingParams(presence_penalty=1.0, repetition_penalty=2.0)
    logits = _logits([2.0, 2.0, 2.0], [2.0, 2.0, 2.0], [2.0, 2.0, 2.0])
    out = process_logits(logits, params, prompt_ids=[2], output_ids=[[], [0], [0, 1]])
    assert out.tolist() == [[2.0, 2.0, 1.0], [0.0, 2.0, 1.0], [0.0, 0.0, 1.0]]


def test_repetition_penalty_matches_transformers() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    prompt, outputs = [1, 7, 7, 30], [[], [7, 8], [49, 0, 0]]
    out = process_logits(logits, SamplingParams(repetition_penalty=1.3), prompt, outputs)
    for row, history in enumerate(outputs):
        hf = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([prompt + history]), logits[row : row + 1].clone())
        torch.testing.assert_close(out[row : row + 1], hf)


def test_logit_bias_adds_to_the_listed_tokens_of_every_row() -> None:
    params = SamplingParams(logit_bias={0: -100.0, 2: 1.5})
    out = process_logits(torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]), params, prompt_ids=[], output_ids=[[], [1]])
    assert out.tolist() == [[-99.0, 2.0, 4.5], [-100.0, 0.0, 1.5]]


def test_logit_bias_steers_greedy_and_applies_before_penalties_as_in_vllm() -> None:
    # Biased first, then penalized: token 0's logit (2 + 2) is halved by the repetition penalty.
    params = SamplingParams(logit_bias={0: 2.0}, repetition_penalty=2.0)
    out = process_logits(_logits([2.0, 2.5]), params, prompt_ids=[0], output_ids=[[]])
    assert out.tolist() == [[2.0, 2.5]] and greedy_token(out[0]) == 1
    assert greedy_token(process_logits(_logits([2.0, 2.5]), SamplingParams(logit_bias={0: 0.75}), [], [[]])[0]) == 0


def test_logit_bias_matches_transformers_sequence_bias_for_single_tokens() -> None:
    torch.manual_seed(1)
    logits = torch.randn(2, 40)
    bias = {3: -100.0, 17: 4.0, 39: 0.5}
    out = process_logits(logits, SamplingParams(logit_bias=bias), prompt_ids=[1, 2], output_ids=[[], [5]])
    hf = SequenceBiasLogitsProcessor({(token,): value for token, value in bias.items()})
    torch.testing.assert_close(out, hf(torch.tensor([[1, 2, 5], [1, 2, 5]]), logits.clone()))


def test_min_tokens_bans_the_stop_ids_of_rows_that_have_not_reached_it() -> None:
    params = SamplingParams(min_tokens=2)
    logits = torch.tensor([[1.0, 5.0, 2.0], [1.0, 5.0, 2.0], [1.0, 5.0, 2.0]])
    out = process_logits(logits, params, prompt_ids=[], output_ids=[[], [0], [0, 2]], stop_ids={1})
    assert out[:, 1].tolist() == [-math.inf, -math.inf, 5.0] and out[:, [0, 2]].tolist() == [[1.0, 2.0]] * 3
    assert greedy_token(out[0]) == 2 and greedy_token(out[2]) == 1
    assert process_logits(logits[:1], params, [], [[]]).tolist() == [logits[0].tolist()]  # no stop ids: nothing to ban


def test_greedy_applies_penalties_but_no_masks() -> None:
    params = SamplingParams(temperature=0.0, presence_penalty=0.5, top_k=1, top_p=0.1, min_p=0.9)
    out = process_logits(_logits([3.0, 2.75, 0.0]), params, prompt_ids=[], output_ids=[[0]])
    assert out.tolist() == [[2.5, 2.75, 0.0]]
    assert greedy_token(out[0]) == 1


def test_neutral_params_return_an_unmodified_copy() -> None:
    logits = _logits([1.0, -2.0, 3.0])
    greedy = process_logits(logits, SamplingParams(), prompt_ids=[0, 1, 2], output_ids=[[0, 2]])
    sampled = process_logits(logits, SamplingParams(temperature=1.0), prompt_ids=[0], output_ids=[[1]])
    assert greedy.tolist() == sampled.tolist() == logits.tolist()
    greedy += 1.0
    assert logits.tolist() == [[1.0, -2.0, 3.0]]  # a copy, not a view


def test_working_dtype_is_at_least_float32() -> None:
    params = SamplingParams(temperature=0.5)
    assert process_logits(torch.zeros(1, 4, dtype=torch.bfloat16), params, [], [[]]).dtype == torch.float32
    assert process_logits(torch.zeros(1, 4, dtype=torch.float64), params, [], [[]]).dtype == torch.float64


def test_prompt_ids_may_be_a_tensor() -> None:
    params = SamplingParams(repetition_penalty=2.0)
    out = process_logits(_logits([2.0, 2.0]), params, prompt_ids=torch.tensor([1]), output_ids=[[]])
    assert out.tolist() == [[2.0, 1.0]]


# --- temperature and masks ------------------------------------------------------------------------


def test_temperature_divides_logits() -> None:
    out = process_logits(_logits([1.0, 2.0, -3.0]), SamplingParams(temperature=0.5), [], [[]])
    assert out.tolist() == [[2.0, 4.0, -6.0]]


def test_top_k_keeps_the_k_largest_and_their_ties() -> None:
    logits = _logits([1.0, 3.0, 2.0, 3.0, 0.0])
    assert _kept(process_logits(logits, SamplingParams(temperature=1.0, top_k=2), [], [[]])) == [[1, 3]]
    assert _kept(process_logits(logits, SamplingParams(temperature=1.0, top_k=3), [], [[]])) == [[1, 2, 3]]
    assert _kept(process_logits(logits, SamplingParams(temperature=1.0, top_k=9), [], [[]])) == [[0, 1, 2, 3, 4]]


@pytest.mark.parametrize(("top_p", "kept"), [(0.95, [0, 1, 2]), (0.8, [1, 2]), (0.5, [1]), (0.05, [1])])
def test_top_p_keeps_the_smallest_likely_set_reaching_p(top_p: float, kept: list[int]) -> None:
    # probs 0.1, 0.6, 0.3: ascending cumulative mass 0.1, 0.4, 1.0; drop while it stays <= 1 - top_p
    logits = _logits(_log_probs(0.1, 0.6, 0.3))
    assert _kept(process_logits(logits, SamplingParams(temperature=1.0, top_p=top_p), [], [[]])) == [kept]


@pytest.mark.parametrize(("min_p", "kept"), [(0.2, [0, 1, 2]), (0.5, [0, 1]), (0.7, [0]), (0.0, [0, 1, 2, 3])])
def test_min_p_keeps_tokens_at_least_min_p_times_the_top_probability(min_p: float, kept: list[int]) -> None:
    logits = _logits(_log_probs(0.5, 0.3, 0.15, 0.05))  # thresholds: 0.1, 0.25, 0.35
    assert _kept(process_logits(logits, SamplingParams(temperature=1.0, min_p=min_p), [], [[]])) == [kept]


def test_min_p_applies_before_top_p_as_in_vllm() -> None:
    # probs 0.5, 0.3, 0.2. min_p 0.5 drops 0.2 -> renormalized 0.625, 0.375; top_p 0.6 then keeps only
    # token 0. (top_p first would keep tokens 0 and 1: the ascending mass 0.2, 0.5 stops at 0.2.)
    logits = _logits(_log_probs(0.5, 0.3, 0.2))
    out = process_logits(logits, SamplingParams(temperature=1.0, min_p=0.5, top_p=0.6), [], [[]])
    assert _kept(out) == [[0]]


def test_temperature_applies_before_masks() -> None:
    # At temperature 1, probs are 0.5/0.3/0.2 and top_p 0.75 keeps two tokens; at temperature 0.25
    # the distribution sharpens to ~0.87/0.11/0.02 and the same top_p keeps only the first.
    logits = _logits(_log_probs(0.5, 0.3, 0.2))
    assert _kept(process_logits(logits, SamplingParams(temperature=1.0, top_p=0.75), [], [[]])) == [[0, 1]]
    assert _kept(process_logits(logits, SamplingParams(temperature=0.25, top_p=0.75), [], [[]])) == [[0]]


def test_penalties_apply_before_masks() -> None:
    # Without the penalty, top_k=1 keeps token 0; penalizing token 0 hands the top spot to token 1.
    params = SamplingParams(temperature=1.0, top_k=1, frequency_penalty=1.0)
    assert _kept(process_logits(_logits([2.0, 1.5, 0.0]), params, [], [[0]])) == [[1]]


@pytest.mark.parametrize("seed", range(5))
def test_single_masks_match_transformers_warpers(seed: int) -> None:
    torch.manual_seed(seed)
    logits = torch.randn(4, 64) * 3
    ids = torch.zeros(4, 1, dtype=torch.long)
    cases = [
        (SamplingParams(temperature=0.7), TemperatureLogitsWarper(0.7)),
        (SamplingParams(temperature=1.0, top_k=5), TopKLogitsWarper(5)),
        (SamplingParams(temperature=1.0, top_p=0.7), TopPLogitsWarper(0.7)),
        (SamplingParams(temperature=1.0, min_p=0.1), MinPLogitsWarper(0.1)),
    ]
    for params, warper in cases:
        ours = process_logits(logits, params, [], [[]] * 4)
        torch.testing.assert_close(ours, warper(ids, logits.clone()), rtol=1e-6, atol=1e-6)


# --- drawing --------------------------------------------------------------------------------------


def test_sample_from_is_the_inverse_cdf_of_one_uniform() -> None:
    logits = torch.tensor(_log_probs(0.2, 0.0, 0.5, 0.3))
    cdf = [0.2, 0.2, 0.7, 1.0]
    for seed in range(200):
        u = float(torch.rand(1, generator=make_generator(seed), dtype=torch.float64))
        expected = next(i for i, c in enumerate(cdf) if c > u)
        assert sample_from(logits, make_generator(seed)) == expected


def test_sample_from_consumes_exactly_one_uniform() -> None:
    drawn, reference = make_generator(7), make_generator(7)
    for _ in range(10):
        sample_from(torch.randn(1000), drawn)
        torch.rand(1, generator=reference, dtype=torch.float64)
    assert torch.equal(drawn.get_state(), reference.get_state())


def test_seeded_sampling_is_reproducible_and_seed_dependent() -> None:
    logits = torch.randn(100, generator=torch.Generator().manual_seed(0))

    def draws(seed: int | None) -> list[int]:
        generator = make_generator(seed)
        return [sample_from(logits, generator) for _ in range(50)]

    assert draws(1234) == draws(1234)
    assert draws(-5) == draws(-5)  # negative OpenAI seeds are valid
    assert draws(1234) != draws(1235)
    assert draws(None) != draws(None)  # no seed: fresh randomness per request


def test_masked_tokens_are_never_drawn() -> None:
    params = SamplingParams(temperature=1.5, top_k=3)
    row = process_logits(torch.tensor([[2.0, -20.0, 1.5, 2.5, 1.4, -1.0]]), params, [], [[]])[0]
    generator = make_generator(3)
    assert {sample_from(row, generator) for _ in range(3000)} == {0, 2, 3}  # 1.4 just misses the top 3


def test_sample_from_reproduces_the_processed_distribution() -> None:
    # Chi-square goodness of fit against softmax(processed logits), seeded so it cannot flake.
    params = SamplingParams(temperature=0.8, top_k=5, frequency_penalty=0.3, repetition_penalty=1.2)
    logits = torch.tensor([[1.0, 0.2, -0.5, 1.4, 0.9, -2.0, 0.0]])
    row = process_logits(logits, params, prompt_ids=[3], output_ids=[[0, 0, 4]])[0]
    probs = torch.softmax(row.double(), dim=-1)
    num_draws = 20000
    generator = make_generator(2024)
    counts = torch.bincount(torch.tensor([sample_from(row, generator) for _ in range(num_draws)]), minlength=7)
    support = probs > 0
    assert counts[~support].sum() == 0
    expected = probs[support] * num_draws
    chi2 = float(((counts[support] - expected) ** 2 / expected).sum())
    dof = int(support.sum()) - 1
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(chi2 / 2)))
    assert p_value > 1e-3, (chi2, dof, counts.tolist(), expected.tolist())


def test_greedy_token_breaks_ties_towards_the_lowest_id() -> None:
    assert greedy_token(torch.tensor([0.0, 2.0, 1.0, 2.0])) == 1


# --- logprobs -------------------------------------------------------------------------------------


def test_logprobs_are_log_softmax_of_the_raw_logits_with_sorted_top() -> None:
    logits = torch.tensor([1.0, 3.0, 2.0, -1.0])
    result = logprobs_of(logits, token_id=2, num_top=2)
    expected = torch.log_softmax(logits, dim=-1)
    assert result.token_id == 2
    assert result.logprob == pytest.approx(float(expected[2]))
    assert [t for t, _ in result.top] == [1, 2]
    assert [lp for _, lp in result.top] == pytest.approx([float(expected[1]), float(expected[2])])
    assert logprobs_of(logits, token_id=0, num_top=0).top == []
    assert len(logprobs_of(logits, token_id=0, num_top=20).top) == 4
