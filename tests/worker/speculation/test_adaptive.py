"""Adaptive speculation's rule: the draft length with the most tokens per second at this load. Torch-free."""

from __future__ import annotations

import pytest

from worker.speculation.adaptive import StepCosts, choose_draft_length, expected_tokens, lane_acceptance


def costs(**by_lanes: dict[int, float]) -> StepCosts:
    return StepCosts({(int(lanes[1:]), k): s for lanes, row in by_lanes.items() for k, s in row.items()})


def test_expected_tokens_of_a_chain():
    assert expected_tokens(0.5, 0) == 1
    assert expected_tokens(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(1.0, 4) == 5


def test_the_worked_example_keeps_plain_decoding_at_16_lanes():
    model = costs(n1={0: 0.017, 1: 0.019, 3: 0.022}, n16={0: 0.050, 1: 0.080, 3: 0.140})
    assert choose_draft_length(model, [0.6] * 16) == 0


def test_one_lane_with_cheap_verification_drafts_the_most():
    model = costs(n1={0: 0.017, 1: 0.019, 3: 0.022}, n16={0: 0.050, 1: 0.080, 3: 0.140})
    assert choose_draft_length(model, [0.6]) == 3


def test_drafts_shrink_as_the_batch_grows():
    model = costs(
        n1={0: 0.010, 1: 0.011, 3: 0.013}, n4={0: 0.015, 1: 0.020, 3: 0.030}, n16={0: 0.050, 1: 0.090, 3: 0.170}
    )
    lengths = [choose_draft_length(model, [0.7] * lanes) for lanes in (1, 4, 16, 32)]
    assert lengths == sorted(lengths, reverse=True) and lengths[0] == 3 and lengths[-1] == 0


def test_a_drafter_that_is_never_accepted_is_switched_off_even_alone():
    model = costs(n1={0: 0.017, 1: 0.018, 3: 0.020})
    assert choose_draft_length(model, [0.0]) == 0


def test_costs_interpolate_between_measured_lane_counts_and_extrapolate_past_them():
    model = costs(n1={0: 1.0}, n4={0: 4.0}, n16={0: 10.0})
    assert model.cost(2, 0) == pytest.approx(2.0)
    assert model.cost(10, 0) == pytest.approx(7.0)
    assert model.cost(28, 0) == pytest.approx(16.0)


def test_a_lane_without_drafts_takes_the_workers_acceptance():
    assert lane_acceptance(0, 0, default=0.4) == 0.4
    assert lane_acceptance(10, 7, default=0.4) == 0.7
