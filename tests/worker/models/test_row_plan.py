"""The per-row-count format choice, on fixed numbers (no torch, no timing)."""

from __future__ import annotations

import pytest

from worker.models.row_plan import RowPlan, choose_plan

# ms per forward, the shape measured on SmolLM2 (int4 grows with rows, bfloat16 stays flat to ~16)
MEASURED = {
    "int4": {1: 18.0, 2: 20.0, 4: 25.0, 8: 45.0, 16: 90.0, 32: 140.0},
    "bfloat16": {1: 50.0, 2: 51.0, 4: 55.0, 8: 40.0, 16: 73.0, 32: 95.0},
}


def test_int4_below_the_crossing_and_bfloat16_above() -> None:
    plan = choose_plan(MEASURED, preferred="int4")
    assert plan == RowPlan(((4, "int4"), (None, "bfloat16")))
    assert [plan.format_for(n) for n in (1, 3, 4, 5, 8, 100)] == ["int4"] * 3 + ["bfloat16"] * 3


def test_a_near_tie_keeps_the_preferred_format() -> None:
    # at 16 rows bfloat16 is 73 vs 75: under the 5 % margin, so 16 stays int4 ... but 8 does not
    costs = {"int4": {8: 45.0, 16: 75.0}, "bfloat16": {8: 60.0, 16: 73.0}}
    assert choose_plan(costs, preferred="int4") == RowPlan.single("int4")
    assert choose_plan(costs, preferred="int4", min_gain=0.0) == RowPlan(((8, "int4"), (None, "bfloat16")))


def test_buckets_merge_and_may_alternate() -> None:
    costs = {"a": {1: 1.0, 2: 1.0, 4: 9.0, 8: 1.0}, "b": {1: 5.0, 2: 5.0, 4: 2.0, 8: 5.0}}
    assert choose_plan(costs, preferred="a").buckets == ((2, "a"), (4, "b"), (None, "a"))


def test_formats_not_measured_at_a_count_cannot_win_it() -> None:
    # a format given up after 2 rows (too slow) competes only where it was timed
    costs = {"int4": {1: 10.0, 2: 12.0, 4: 30.0}, "int8": {1: 5.0, 2: 40.0}}
    assert choose_plan(costs, preferred="int4").buckets == ((1, "int8"), (None, "int4"))


def test_the_last_bucket_is_open_and_a_single_format_plan_serves_everything() -> None:
    plan = choose_plan({"int4": {1: 1.0}}, preferred="int4")
    assert plan == RowPlan.single("int4") and plan.format_for(10_000) == "int4"
    assert RowPlan(((4, "int4"), (None, "bfloat16"))).describe() == "int4 <= 4 < bfloat16"


def test_the_preferred_format_must_be_measured() -> None:
    with pytest.raises(AssertionError):
        choose_plan({"bfloat16": {1: 1.0}}, preferred="int4")
