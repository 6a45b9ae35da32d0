"""`usage.speculation`: what speculative decoding did for one request, when the request asks for it
(`include_speculation_stats: true`), from the workers' final-event stats.

In the spirit of vLLM's per-request spec-decode metrics, but opt-in per request rather than per
server, and inside `usage` so that it streams with `stream_options.include_usage`. Counts are
summed over the request's choices (and prompts, for a completions batch).
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.accumulate import ChoiceState, Outcomes
from gateway.completion_bodies import DraftSourceUsage, SpeculationUsage, UsageInfo

_COUNTS = ("drafts", "draft_tokens", "accepted_tokens")


def usage_of(outcome: Outcomes, with_speculation: bool) -> UsageInfo:
    usage = outcome.usage()
    if with_speculation:
        usage.speculation = speculation_usage(outcome.choices)  # assigned: set, so it is sent
    return usage


def speculation_usage(choices: Sequence[ChoiceState]) -> SpeculationUsage:
    stats = [state.stats for state in choices if state.stats is not None]
    forwards = sum(s.target_forwards for s in stats)
    draft_tokens = sum(s.draft_tokens for s in stats)
    accepted = sum(s.accepted_tokens for s in stats)
    completion = sum(state.completion_tokens for state in choices)
    sources: dict[str, dict[str, int]] = {}
    for s in stats:
        for source, counts in s.draft_sources.items():
            total = sources.setdefault(source, dict.fromkeys(_COUNTS, 0))
            for name in _COUNTS:
                total[name] += counts.get(name, 0)
    return SpeculationUsage(
        mode=next((s.speculation for s in stats if s.speculation), None),
        target_forwards=forwards,
        drafts=sum(s.drafts for s in stats),
        draft_tokens=draft_tokens,
        accepted_tokens=accepted,
        tokens_per_forward=round(completion / forwards, 4) if forwards else None,
        acceptance_rate=round(accepted / draft_tokens, 4) if draft_tokens else None,
        sources={source: DraftSourceUsage(**counts) for source, counts in sorted(sources.items())},
    )
