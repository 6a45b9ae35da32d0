"""When start-up timing stops measuring a format: fixed numbers, no clocks."""

from __future__ import annotations

from worker.models.row_timing import falling_behind


def test_a_quantized_format_far_behind_and_losing_ground_is_given_up() -> None:
    assert falling_behind("int4", ratio=2.5, previous_ratio=1.6)
    assert not falling_behind("int4", ratio=2.5, previous_ratio=2.8)  # catching up: keep timing it
    assert not falling_behind("int4", ratio=1.9, previous_ratio=1.2)  # behind, but not far
    assert not falling_behind("int4", ratio=9.0, previous_ratio=None)  # the first count decides nothing


def test_a_dense_format_is_never_given_up() -> None:
    # bfloat16 at SmolLM2's measured ratios to int4: 4.0 at one row, 1.9 at two, 2.2 at four (noise),
    # and the best of all from 32 rows on
    assert not falling_behind("bfloat16", ratio=2.2, previous_ratio=1.9)
