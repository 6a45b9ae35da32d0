"""One run of `arbor bench agent` summed up: the serving bench's level figures plus speculation,
prefill-cache and well-formedness counts, overall and per workload. Torch-free."""

from __future__ import annotations

import json
from collections.abc import Sequence

from ops.bench.agent_client import TurnResult
from ops.bench.client import RequestRecord, latency_ms, summarize_level

_SOURCE_COUNTS = ("drafts", "draft_tokens", "accepted_tokens")
_COUNTS = ("target_forwards", *_SOURCE_COUNTS)


def summarize_run(
    streams: int, conversations: list[list[TurnResult]], num_conversations: int, duration_s: float
) -> dict:
    turns = [turn for conversation in conversations for turn in conversation]
    unfinished = num_conversations - len(conversations)
    records = [turn.record for turn in turns]
    records += [RequestRecord(error="the run timed out before this conversation") for _ in range(unfinished)]
    workloads = sorted({turn.workload for turn in turns})
    return {
        **summarize_level(streams, records, duration_s),
        "conversations": num_conversations,
        "conversations_done": sum(all(turn.record.ok for turn in conversation) for conversation in conversations),
        **turn_figures(turns),
        "well_formed": well_formed(turns),
        "workloads": {name: _workload(name, [turn for turn in turns if turn.workload == name]) for name in workloads},
    }


def turn_figures(turns: Sequence[TurnResult]) -> dict:
    ok = [turn for turn in turns if turn.record.ok]
    prompt = sum(turn.prompt_tokens for turn in ok)
    cached = sum(turn.cached_tokens for turn in ok)
    return {
        "speculation": speculation_totals(ok),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_share": round(cached / prompt, 4) if prompt else None,
    }


def speculation_totals(turns: Sequence[TurnResult]) -> dict:
    """The turns' `usage.speculation` summed; tokens per forward = completion tokens ÷ target forwards."""
    with_stats = [turn for turn in turns if turn.speculation is not None]
    totals = {name: sum(turn.speculation[name] for turn in with_stats if turn.speculation) for name in _COUNTS}
    sources: dict[str, dict[str, int]] = {}
    for turn in with_stats:
        assert turn.speculation is not None
        for source, counts in turn.speculation.get("sources", {}).items():
            total = sources.setdefault(source, dict.fromkeys(_SOURCE_COUNTS, 0))
            for name in _SOURCE_COUNTS:
                total[name] += counts[name]
    completion = sum(turn.record.completion_tokens for turn in with_stats)
    forwards, drafted = totals["target_forwards"], totals["draft_tokens"]
    return {
        **totals,
        "completion_tokens": completion,
        "tokens_per_forward": round(completion / forwards, 4) if forwards else None,
        "acceptance_rate": round(totals["accepted_tokens"] / drafted, 4) if drafted else None,
        "sources": dict(sorted(sources.items())),
    }


def well_formed(turns: Sequence[TurnResult]) -> dict:
    """Forced turns that came back as a call, and JSON answers that parse and were not cut short."""
    ok = [turn for turn in turns if turn.record.ok]
    forced = [turn for turn in ok if turn.forced_call]
    constrained = [turn for turn in ok if turn.constrained]
    return {
        "forced_calls": len(forced),
        "forced_calls_made": sum(1 for turn in forced if turn.calls),
        "json_answers": len(constrained),
        "json_answers_complete": sum(1 for turn in constrained if _complete_json(turn)),
    }


def _complete_json(turn: TurnResult) -> bool:
    if turn.finish_reason != "stop":
        return False
    try:
        return isinstance(json.loads(turn.text), dict)
    except ValueError:
        return False


def _workload(name: str, turns: list[TurnResult]) -> dict:
    ok = [turn for turn in turns if turn.record.ok]
    figures = turn_figures(ok)
    return {
        "turns": len(turns),
        "errors": len(turns) - len(ok),
        "completion_tokens": sum(turn.record.completion_tokens for turn in ok),
        "tokens_per_forward": figures["speculation"]["tokens_per_forward"],
        "acceptance_rate": figures["speculation"]["acceptance_rate"],
        "cached_share": figures["cached_share"],
        "ttft_ms": latency_ms([turn.record.ttft_s for turn in ok if turn.record.ttft_s is not None]),
        "itl_ms": latency_ms([gap for turn in ok for gap in turn.record.chunk_gaps_s]),
    }
