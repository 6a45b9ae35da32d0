"""bench decode --formats: the agreement measure and the format names, on fixed numbers."""

from __future__ import annotations

import pytest

from ops.bench.formats import AGREEMENT_PROMPTS, FORMAT_PRECISIONS, greedy_agreement, parse_formats


def test_greedy_agreement_counts_identical_prompts_and_tokens_before_the_first_difference() -> None:
    reference = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]]
    other = [[1, 2, 3, 4], [5, 6, 0, 8], [0, 9, 9, 9]]  # prompt 2 differs at token 2, prompt 3 at 0
    assert greedy_agreement(reference, other) == {
        "identical_prompts": 1,
        "num_prompts": 3,
        "tokens_before_first_difference": round((4 + 2 + 0) / 12, 4),
    }


def test_a_shorter_output_agrees_up_to_its_end() -> None:
    assert greedy_agreement([[1, 2, 3, 4]], [[1, 2]])["tokens_before_first_difference"] == 0.5


def test_formats_parse_and_unknown_ones_are_refused_by_name() -> None:
    assert parse_formats("float32, int4,auto") == ["float32", "int4", "auto"]
    assert FORMAT_PRECISIONS["float32"][:2] == ("float32", "none")  # the exact path
    with pytest.raises(ValueError, match="int3"):
        parse_formats("float32,int3")


def test_twenty_agreement_prompts() -> None:
    assert len(AGREEMENT_PROMPTS) == 20 and len(set(AGREEMENT_PROMPTS)) == 20
