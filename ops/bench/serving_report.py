"""The markdown of `arbor bench serving`. Torch-free."""

from __future__ import annotations

from ops.bench.api_compare import apis_markdown
from ops.bench.results import SIDE_BY_SIDE_NOTE, fmt, markdown_table


def serving_markdown(report: dict) -> str:
    settings = report["settings"]
    lines = [f"# arbor bench serving — {report['timestamp']}", "", _setup(report), ""]
    lines += _comparison(report["comparison"])
    for run in report["modes"]:
        lines += [f"## {_sweep_title(run['mode'], settings)}", "", _level_table(run["sweep"]), ""]
        lines += _goals(run["goals"])
    lines += _scaling(report["scaling"], report["scaling_speedup"])
    lines += apis_markdown(report.get("apis") or {})
    lines += [
        "TTFT: request sent -> first text chunk. ITL: gaps between text chunks. TPOT: (end - first text) / "
        "(tokens - 1). Latencies in ms, rates over each level's wall time.",
        "",
    ]
    if not settings.get("base_url"):
        lines.append(f"Measured side by side where it compares: {SIDE_BY_SIDE_NOTE}.")
    return "\n".join(lines) + "\n"


def _setup(report: dict) -> str:
    settings, machine = report["settings"], report["machine"]
    eos = "EOS ignored" if settings.get("ignore_eos", True) else "EOS ends a request"
    load = (
        f"Model {settings['model']}, {settings['max_tokens']} tokens per request ({eos}), temperature "
        f"{settings['temperature']}, streaming chat clients over HTTP"
    )
    tail = f"machine: {machine['cpu_count']} cores, load average {machine['load_average_1m']} at start. "
    tail += f"Total errors: {report['total_errors']}."
    if settings.get("base_url"):
        return f"{load} to the server at {settings['base_url']}; {tail}"
    return (
        f"{load}; speculation {', '.join(f'`{mode}`' for mode in settings['speculation'])}, {settings['dtype']}; "
        f"workers: up to {settings['max_lanes_per_worker']} lanes each, "
        f"stream interval {settings.get('stream_interval', 1)} token(s), "
        f"publish interval {settings.get('publish_interval_ms', 0):g} ms "
        f"(budget {settings.get('publish_budget', 0):g} of the owner's time), "
        f"prefill cache off, torch threads: {settings['worker_threads']}; {tail}"
    )


def _sweep_title(mode: str | None, settings: dict) -> str:
    if mode is None:
        return f"Concurrency sweep, {settings['base_url']}"
    return f"Concurrency sweep, speculation `{mode}` ({settings['worker_counts'][0]} worker(s))"


def _goals(goals: dict) -> list[str]:
    """One line: the 16-over-1 ratios, and the ratios to `none` where it ran beside this mode."""
    parts = []
    if goals["tokens_per_s_16_over_1"] is not None:
        parts.append(f"output tokens/s at 16 streams ÷ at 1: {fmt(goals['tokens_per_s_16_over_1'], 2)}x")
    if goals["itl_p50_16_over_1"] is not None:
        parts.append(f"ITL p50 at 16 streams ÷ at 1: {fmt(goals['itl_p50_16_over_1'], 2)}x")
    over_none = goals.get("tokens_per_s_over_none")
    if over_none:
        levels = ", ".join(f"{fmt(value, 2)}x at {streams}" for streams, value in over_none.items())
        parts.append(f"output tokens/s ÷ `none`'s: {levels}")
    return [f"Goals: {'; '.join(parts)}.", ""] if parts else []


def _level_table(levels: list[dict]) -> str:
    headers = [
        "streams",
        "requests",
        "errors",
        "req/s",
        "output tok/s",
        "TTFT p50",
        "TTFT p99",
        "ITL p50",
        "ITL p99",
        "TPOT p50",
        "e2e p50",
        "e2e p99",
    ]
    rows = [
        [
            str(level["concurrency"]),
            str(level["requests"]),
            str(level["errors"]),
            fmt(level["requests_per_s"], 2),
            fmt(level["output_tokens_per_s"]),
            fmt(level["ttft_ms"]["p50"], 0),
            fmt(level["ttft_ms"]["p99"], 0),
            fmt(level["itl_ms"]["p50"], 0),
            fmt(level["itl_ms"]["p99"], 0),
            fmt(level["tpot_ms"]["p50"], 0),
            fmt(level["e2e_ms"]["p50"], 0),
            fmt(level["e2e_ms"]["p99"], 0),
        ]
        for level in levels
    ]
    return markdown_table(headers, rows)


def _comparison(comparison: dict | None) -> list[str]:
    if comparison is None:
        return []
    rows = [
        [
            name,
            str(path["ok"]),
            fmt(path["tokens_per_s"]),
            fmt(path.get("decode_tokens_per_s")),
            fmt(path["ttft_ms"]["p50"], 0),
            fmt(path["e2e_ms"]["p50"], 0),
        ]
        for name, path in (
            ("gateway + Redis", comparison["gateway"]),
            ("in-process generate", comparison["in_process"]),
        )
    ]
    table = markdown_table(["path", "requests", "tokens/s", "after first text", "TTFT p50 (ms)", "e2e p50 (ms)"], rows)
    return [
        "## Gateway + Redis vs in-process generate (1 client, sequential, alternating)",
        "",
        table,
        "",
        f"Tokens/s ratio gateway / in-process: {fmt(comparison['tokens_per_s_ratio'], 3)} over end-to-end "
        f"time, {fmt(comparison.get('decode_tokens_per_s_ratio'), 3)} after the first text; "
        f"added TTFT p50: {fmt(comparison['added_ttft_p50_ms'], 1)} ms.",
        "",
        *_paired(comparison),
        *_other_load(comparison.get("other_load")),
    ]


def _paired(comparison: dict) -> list[str]:
    lines = []
    for key, what in (("paired_ratio", "Over end-to-end time"), ("paired_decode_ratio", "After the first text")):
        paired = comparison.get(key)
        if paired:
            low, high = paired["ci95"]
            lines += [
                f"{what}, request by request (each gateway request over the in-process one run next to it): "
                f"median ratio {paired['median']:.3f}, 95% interval of the median {low:.3f}-{high:.3f} "
                f"({paired['pairs']} pairs).",
                "",
            ]
    return lines


def _other_load(load: dict | None) -> list[str]:
    """The pairs during which other processes left the serving path its second core."""
    if not load or load["cores_p50"] is None:
        return []
    line = (
        f"Other processes on the machine took {load['cores_p50']:.2f} of a core during a pair (median; p90 "
        f"{load['cores_p90']:.2f}). The serving path needs a second core, in-process generate does not"
    )
    quiet, quiet_decode = load["paired_ratio_quiet"], load["paired_decode_ratio_quiet"]
    if quiet is None:
        return [line + f"; no pair had others under {load['quiet_below_cores']:g} of a core.", ""]
    line += (
        f". On the {quiet['pairs']} pairs where others took under {load['quiet_below_cores']:g} of a core: "
        f"median ratio {quiet['median']:.3f} over end-to-end time ({quiet['ci95'][0]:.3f}-{quiet['ci95'][1]:.3f})"
    )
    if quiet_decode:
        line += (
            f", {quiet_decode['median']:.3f} after the first text "
            f"({quiet_decode['ci95'][0]:.3f}-{quiet_decode['ci95'][1]:.3f})"
        )
    return [line + ".", ""]


def _scaling(rows: list[dict], speedup: dict) -> list[str]:
    if not rows:
        return []
    table = markdown_table(
        ["workers", "run", "requests", "errors", "req/s", "output tok/s", "TTFT p50", "e2e p50"],
        [
            [
                str(row["workers"]),
                row["label"],
                str(row["requests"]),
                str(row["errors"]),
                fmt(row["requests_per_s"], 2),
                fmt(row["output_tokens_per_s"]),
                fmt(row["ttft_ms"]["p50"], 0),
                fmt(row["e2e_ms"]["p50"], 0),
            ]
            for row in rows
        ],
    )
    ratios = ", ".join(f"{workers} workers: {fmt(value, 2)}x" for workers, value in speedup.items())
    return [
        f"## Scaling at {rows[0]['concurrency']} clients",
        "",
        table,
        "",
        f"Output tokens/s over {rows[0]['workers']} worker(s) (mean of the runs before and after): {ratios}.",
        "",
    ]
