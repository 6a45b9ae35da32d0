"""`arbor bench agent --recorded`'s figures and markdown: per mode, API and turn, over the repeats.
Torch-free.

Each replay starts on an empty prefill cache, so turn 1 is cold and turns 2+ can hit what the
turns before them left: the figure to read is turn 1's TTFT against turns 2+'s, beside the cached
tokens that explain it, on each API.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from ops.bench.agent_recorded_client import RecordedTurn
from ops.bench.results import SIDE_BY_SIDE_NOTE, fmt, markdown_table


def turn_figures(turn: RecordedTurn) -> dict:
    record = turn.record
    return {
        "turn": turn.turn + 1,
        "ok": record.ok,
        "error": record.error,
        "prompt_tokens": turn.prompt_tokens,
        "cached_tokens": turn.cached_tokens,
        "completion_tokens": record.completion_tokens,
        "ttft_ms": None if record.ttft_s is None else round(1000 * record.ttft_s, 2),
        "e2e_ms": round(1000 * record.e2e_s, 2),
        "decode_tokens_per_s": _rounded(turn.decode_tokens_per_s),
    }


def summarize_api(api: str, replays: Sequence[Sequence[dict]], num_turns: int) -> dict:
    """One API in one mode: each turn's medians over the replays where it succeeded."""
    turns = [
        summarize_turn(index + 1, [replay[index] for replay in replays if len(replay) > index], len(replays))
        for index in range(num_turns)
    ]
    warm = [turn["ttft_ms"] for turn in turns[1:] if turn["ttft_ms"] is not None]
    cold = turns[0]["ttft_ms"] if turns else None
    warm_ttft_ms = _median(warm)
    return {
        "api": api,
        "turns": turns,
        "cold_ttft_ms": cold,
        "warm_ttft_ms": warm_ttft_ms,  # the median of turns 2+'s medians
        "cold_over_warm": _rounded(cold / warm_ttft_ms if cold and warm_ttft_ms else None, 3),
        "decode_tokens_per_s": _median([t["decode_tokens_per_s"] for t in turns if t["decode_tokens_per_s"]]),
        "errors": sum(turn["errors"] for turn in turns),
        "replays": [list(replay) for replay in replays],
    }


def summarize_turn(number: int, figures: Sequence[dict], num_replays: int) -> dict:
    """A replay without this turn (an earlier turn failed, or the replay timed out) counts as an error."""
    ok = [turn for turn in figures if turn["ok"]]
    return {
        "turn": number,
        "replays": len(ok),
        "errors": num_replays - len(ok),
        "prompt_tokens": _median([turn["prompt_tokens"] for turn in ok]),
        "cached_tokens": _median([turn["cached_tokens"] for turn in ok]),
        "min_cached_tokens": min((turn["cached_tokens"] for turn in ok), default=None),
        "ttft_ms": _median([turn["ttft_ms"] for turn in ok if turn["ttft_ms"] is not None]),
        "decode_tokens_per_s": _median([t["decode_tokens_per_s"] for t in ok if t["decode_tokens_per_s"]]),
    }


def recorded_markdown(report: dict) -> str:
    settings, machine = report["settings"], report["machine"]
    lines = [f"# arbor bench agent --recorded {settings['recording']} — {report['timestamp']}", ""]
    lines += [
        f"Model {settings['model']}, speculation {', '.join(f'`{m}`' for m in settings['speculation'])}, "
        f"dtype {settings['dtype']}, temperature {settings['temperature']}; the recording `{settings['source']}` "
        f"({settings['turns']} turns), each turn capped at {settings['max_tokens']} tokens (EOS ignored), "
        f"{settings['repeats']} replay(s) per API and mode; prefill cache {settings['prefill_cache']}; "
        f"machine: {machine['cpu'] or '?'}, {machine['cpu_count']} cores, load average "
        f"{machine['load_average_1m']} at start. Total errors: {report['total_errors']}.",
        "",
        "## Cold turn 1 against warm turns 2+",
        "",
        _overview_table(report["modes"]),
        "",
        "## Per turn",
        "",
        _turn_table(report["modes"]),
        "",
        "TTFT: request sent -> first content (text, thinking or a tool call's JSON), ms, the median over "
        "the replays; cached: prompt tokens the prefill cache served (messages: `cache_read_input_tokens`; "
        "chat: `prompt_tokens_details.cached_tokens`); decode tok/s: tokens after the first ÷ the time "
        "after the first content. ÷ chat: the messages API's TTFT over chat's at the same turn.",
        "",
        f"Measured side by side: {SIDE_BY_SIDE_NOTE}.",
    ]
    return "\n".join(lines) + "\n"


def _overview_table(modes: list[dict]) -> str:
    headers = ["mode", "API", "TTFT turn 1 (cold)", "TTFT turns 2+ (warm)", "cold ÷ warm", "decode tok/s", "errors"]
    rows = [
        [
            mode["mode"],
            api["api"],
            fmt(api["cold_ttft_ms"], 0),
            fmt(api["warm_ttft_ms"], 0),
            fmt(api["cold_over_warm"], 1, "x"),
            fmt(api["decode_tokens_per_s"]),
            str(api["errors"]),
        ]
        for mode in modes
        for api in mode["apis"]
    ]
    return markdown_table(headers, rows)


def _turn_table(modes: list[dict]) -> str:
    headers = ["mode", "API", "turn", "prompt tok", "cached", "TTFT", "÷ chat", "decode tok/s", "replays"]
    rows = []
    for mode in modes:
        chat = next((api for api in mode["apis"] if api["api"] == "chat"), None)
        for api in mode["apis"]:
            for index, turn in enumerate(api["turns"]):
                base = chat["turns"][index]["ttft_ms"] if chat is not None and api is not chat else None
                share = turn["ttft_ms"] / base if base and turn["ttft_ms"] is not None else None
                rows.append(
                    [
                        mode["mode"],
                        api["api"],
                        str(turn["turn"]),
                        fmt(turn["prompt_tokens"], 0),
                        fmt(turn["cached_tokens"], 0),
                        fmt(turn["ttft_ms"], 0),
                        fmt(share, 2, "x") if share is not None else "-",
                        fmt(turn["decode_tokens_per_s"]),
                        f"{turn['replays']}/{turn['replays'] + turn['errors']}",
                    ]
                )
    return markdown_table(headers, rows)


def _median(values: Sequence[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def _rounded(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)
