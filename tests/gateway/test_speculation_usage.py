"""`usage.speculation` from the workers' final-event stats, summed over a request's choices."""

from __future__ import annotations

from gateway.accumulate import ChoiceState, Outcome
from gateway.speculation_usage import speculation_usage, usage_of
from shared.protocol import FinalEvent, FinalStats, Usage


def _final(choice: int, completion: int, stats: FinalStats) -> FinalEvent:
    usage = Usage(prompt_tokens=10, completion_tokens=completion)
    return FinalEvent(id="r", attempt=1, seq=0, choice=choice, finish_reason="length", usage=usage, stats=stats)


def _stats(forwards: int, drafts: int, drafted: int, accepted: int, sources: dict) -> FinalStats:
    return FinalStats(
        speculation="mtp",
        target_forwards=forwards,
        drafts=drafts,
        draft_tokens=drafted,
        accepted_tokens=accepted,
        draft_sources=sources,
    )


def test_choices_add_up_by_source_and_the_rates_follow():
    outcome = Outcome(2)
    mtp = {"drafts": 4, "draft_tokens": 12, "accepted_tokens": 6}
    outcome.add(_final(0, 16, _stats(10, 4, 12, 6, {"mtp": mtp})))
    grammar = {"drafts": 2, "draft_tokens": 5, "accepted_tokens": 5}
    outcome.add(
        _final(
            1,
            20,
            _stats(
                10, 5, 8, 10, {"mtp": mtp | {"drafts": 3, "draft_tokens": 3, "accepted_tokens": 5}, "grammar": grammar}
            ),
        )
    )
    usage = speculation_usage(outcome.choices)
    assert (usage.mode, usage.target_forwards, usage.drafts, usage.draft_tokens, usage.accepted_tokens) == (
        "mtp",
        20,
        9,
        20,
        16,
    )
    assert usage.tokens_per_forward == 1.8 and usage.acceptance_rate == 0.8
    assert usage.sources["mtp"].model_dump() == {"drafts": 7, "draft_tokens": 15, "accepted_tokens": 11}
    assert usage.sources["grammar"].accepted_tokens == 5


def test_usage_carries_speculation_only_when_asked():
    outcome = Outcome(1)
    outcome.add(_final(0, 3, _stats(3, 0, 0, 0, {})))
    assert "speculation" not in usage_of(outcome, False).model_dump(exclude_unset=True)
    asked = usage_of(outcome, True).model_dump(exclude_unset=True)["speculation"]
    assert asked["tokens_per_forward"] == 1.0 and asked["acceptance_rate"] is None and asked["sources"] == {}


def test_a_choice_without_stats_counts_nothing():
    assert speculation_usage([ChoiceState()]).target_forwards == 0
