"""Adaptive speculation's rule, its acceptance per depth and its online step costs, on fixed numbers. Torch-free."""

from __future__ import annotations

import random

import pytest

from worker.speculation.acceptance import DepthAcceptance, expected_tokens, worker_priors
from worker.speculation.adaptive import LaneOutlook, choose_draft_length
from worker.speculation.step_costs import OnlineStepCosts, StepCosts


def costs(**by_lanes: dict[int, float]) -> StepCosts:
    return StepCosts({(int(lanes[1:]), k): s for lanes, row in by_lanes.items() for k, s in row.items()})


def lanes(rate: float, count: int, depth: int = 8) -> list[LaneOutlook]:
    return [LaneOutlook([rate] * depth) for _ in range(count)]


def simulate_chain(rate: float, chain: int, steps: int, seed: int = 0) -> tuple[DepthAcceptance, float, float]:
    """A lane drafting chains of `chain` whose every depth is accepted with `rate` given the one
    before: its recorded acceptance, its realised tokens a step, and accepted ÷ drafted."""
    rng = random.Random(seed)
    acceptance = DepthAcceptance(decay=1.0)
    emitted = accepted = 0
    for _ in range(steps):
        num = 0
        while num < chain and rng.random() < rate:
            num += 1
        acceptance.record(num, offered_next=num < chain)
        emitted += num + 1
        accepted += num
    return acceptance, emitted / steps, accepted / (steps * chain)


def test_expected_tokens_of_a_chain():
    assert expected_tokens([0.5] * 3, 0) == 1
    assert expected_tokens([0.5] * 3, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens([1.0] * 4, 4) == 5
    assert expected_tokens([0.8, 0.5, 0.0], 3) == pytest.approx(1 + 0.8 + 0.4)


@pytest.mark.parametrize("rate", [0.3, 0.6])
def test_the_conditional_rate_predicts_what_a_chain_emits_where_accepted_over_drafted_does_not(rate):
    acceptance, realised, accepted_over_drafted = simulate_chain(rate, chain=3, steps=20000)
    predicted = expected_tokens(acceptance.rates(3, [0.5] * 3), 3)
    assert predicted == pytest.approx(realised, rel=0.05)
    naive = expected_tokens([accepted_over_drafted] * 3, 3)  # the rule this one replaced
    assert naive < 0.9 * realised, (naive, realised)
    assert predicted == pytest.approx(sum(rate**d for d in range(4)), rel=0.03)


def test_rates_differ_by_depth_and_unseen_depths_take_the_prior():
    acceptance = DepthAcceptance(decay=1.0, prior_weight=0.0)
    for _ in range(10):
        acceptance.record(2, offered_next=False)  # chains of 2, both accepted
    for _ in range(10):
        acceptance.record(0, offered_next=True)
    assert acceptance.rates(3, [0.25] * 3) == pytest.approx([0.5, 1.0, 0.25])


def test_recent_steps_weigh_most():
    acceptance = DepthAcceptance(decay=0.9)
    for _ in range(100):
        acceptance.record(3, offered_next=False)
    for _ in range(30):
        acceptance.record(0, offered_next=True)
    assert acceptance.rate(1, 0.5) < 0.15  # without decay: (100 + 1) / (130 + 2) = 0.77


def test_the_workers_priors_follow_depth_by_depth():
    worker = DepthAcceptance(decay=1.0, prior_weight=0.0)
    assert worker_priors(worker, 2) == [0.5, 0.5]
    worker.record(1, offered_next=True)
    assert worker_priors(worker, 3) == [1.0, 0.0, 0.0]


def test_the_worked_example_keeps_plain_decoding_at_16_lanes():
    model = costs(n1={0: 0.017, 1: 0.019, 3: 0.022}, n16={0: 0.050, 1: 0.080, 3: 0.140})
    assert choose_draft_length(model, lanes(0.6, 16)) == 0


def test_one_lane_with_cheap_verification_drafts_the_most():
    model = costs(n1={0: 0.017, 1: 0.019, 3: 0.022}, n16={0: 0.050, 1: 0.080, 3: 0.140})
    assert choose_draft_length(model, lanes(0.6, 1)) == 3


def test_the_conditional_rate_drafts_where_accepted_over_drafted_would_not():
    # one lane, verification of 3 drafts costing 30 % more: with p = 0.3 at each depth a chain of 3
    # emits 1.42 tokens (pays: 1.42/1.3 > 1.03); accepted ÷ drafted (0.14) predicts 1.16 (does not)
    model = costs(n1={0: 0.010, 3: 0.013})
    assert choose_draft_length(model, lanes(0.3, 1)) == 3
    assert choose_draft_length(model, lanes(0.14, 1)) == 0


def test_drafts_shrink_as_the_batch_grows():
    model = costs(
        n1={0: 0.010, 1: 0.011, 3: 0.013}, n4={0: 0.015, 1: 0.020, 3: 0.030}, n16={0: 0.050, 1: 0.090, 3: 0.170}
    )
    lengths = [choose_draft_length(model, lanes(0.7, count)) for count in (1, 4, 16, 32)]
    assert lengths == sorted(lengths, reverse=True) and lengths[0] == 3 and lengths[-1] == 0


def test_a_drafter_that_is_never_accepted_is_switched_off_even_alone():
    model = costs(n1={0: 0.017, 1: 0.018, 3: 0.020})
    assert choose_draft_length(model, lanes(0.0, 1)) == 0


def test_a_trees_nodes_reach_less_depth_than_a_chain_of_as_many():
    tree = LaneOutlook([0.9] * 4, tree_depths=[1, 1, 2, 2, 3, 3, 4, 4])
    assert [tree.depth_at(k) for k in (1, 2, 3, 4, 8, 10)] == [1, 1, 2, 2, 4, 6]
    assert tree.expected_tokens(4) < LaneOutlook([0.9] * 4).expected_tokens(4)


def test_costs_interpolate_between_measured_lane_counts_and_extrapolate_past_them():
    model = costs(n1={0: 1.0}, n4={0: 4.0}, n16={0: 10.0})
    assert model.cost(2, 0) == pytest.approx(2.0)
    assert model.cost(10, 0) == pytest.approx(7.0)
    assert model.cost(28, 0) == pytest.approx(16.0)


def test_a_non_monotonic_start_up_table_is_corrected_by_the_steps_run():
    # measured under load at start-up: one draft looked dearer than three, and both far dearer than
    # they are; the steps the worker runs say 42, 44 and 48 ms
    online = OnlineStepCosts(costs(n1={0: 0.0417, 1: 0.0886, 3: 0.0761}))
    assert choose_draft_length(online, lanes(0.5, 1)) == 0
    for k, seconds in ((0, 0.042), (1, 0.044), (3, 0.048)):
        for _ in range(5):
            online.record(num_lanes=1, num_rows=1 + k, seconds=seconds)
    assert online.cost(1, 1) == pytest.approx(0.044)
    assert online.cost(1, 1) < online.cost(1, 3)
    assert choose_draft_length(online, lanes(0.5, 1)) == 3


def test_one_stalled_step_does_not_move_a_cost():
    online = OnlineStepCosts(costs(n1={0: 0.010, 3: 0.012}))
    for seconds in (0.010, 0.011, 0.500, 0.010, 0.011):  # a neighbour stalled one step
        online.record(1, 1, seconds)
    assert online.cost(1, 0) == pytest.approx(0.011)


def test_a_length_not_run_takes_the_machines_present_load():
    online = OnlineStepCosts(costs(n1={0: 0.010, 3: 0.012}))
    for _ in range(5):
        online.record(1, 1, 0.020)  # the machine got twice as slow
    assert online.cost(1, 3) == pytest.approx(0.024)


def test_a_stale_neighbouring_length_is_run_once_every_explore_after_steps():
    online = OnlineStepCosts(costs(n1={0: 0.010, 1: 0.011, 4: 0.012, 8: 0.016}), explore_after=10)
    explored = []
    for _ in range(40):
        choice = online.explore(current=0)
        k = 0 if choice is None else choice
        if choice is not None:
            explored.append(choice)
        online.record(1, 1 + k, 0.010)
    assert explored and set(explored) == {1}, "plain decoding wins: only one node is tried, never eight"
    assert len(explored) <= 40 // 10
    assert online.explore(current=4) in (1, 8)


def test_a_rows_price_is_the_longest_drafts_extra_cost_per_node():
    online = OnlineStepCosts(costs(n1={0: 0.010, 1: 0.011, 8: 0.018}, n16={0: 0.040, 1: 0.060, 8: 0.200}))
    assert online.row_price(1) == pytest.approx(0.1)  # (18 - 10) / (8 * 10)
    assert online.row_price(16) == pytest.approx(0.5)  # (200 - 40) / (8 * 40)
