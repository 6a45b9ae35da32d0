"""The markdown of `arbor bench agent`. Torch-free."""

from __future__ import annotations

from ops.bench.results import SIDE_BY_SIDE_NOTE, fmt, markdown_table


def agent_markdown(report: dict) -> str:
    settings = report["settings"]
    lines = [f"# arbor bench agent — {report['timestamp']}", "", _setup(report), ""]
    lines += ["## Per mode", "", _mode_table(report["modes"], report["over_none"]), ""]
    lines += _sources(report["modes"])
    lines += ["## Per workload", "", _workload_table(report["modes"]), ""]
    lines += [
        "tok/fwd: completion tokens ÷ target forwards (the worker's counts, from each turn's "
        "`usage.speculation`). accepted: accepted ÷ drafted tokens. cached: prompt tokens served "
        "from the prefill cache. TTFT: request sent -> first content or tool-call chunk; ITL: gaps "
        "between such chunks (a chunk carries several tokens when drafts are accepted). Latencies in "
        "ms, tokens/s over each run's wall time. Calls: forced turns answered with a call; JSON: "
        "schema answers that parse and ended by themselves.",
        "",
        f"Measured side by side: {SIDE_BY_SIDE_NOTE}. Workloads: {', '.join(settings['workloads'])}, "
        f"seed {settings['seed']}.",
    ]
    return "\n".join(lines) + "\n"


def _setup(report: dict) -> str:
    settings, machine = report["settings"], report["machine"]
    modes = ", ".join(f"`{mode}`" for mode in settings["speculation"])
    return (
        f"Model {settings['model']}, speculation {modes}, {settings['dtype']}, temperature "
        f"{settings['temperature']}; {settings['conversations_per_stream']} conversation(s) per stream; "
        f"one worker, prefill cache {settings['prefill_cache']}; machine: {machine['cpu_count']} cores, "
        f"load average {machine['load_average_1m']} at start. Total errors: {report['total_errors']}."
    )


def _mode_table(modes: list[dict], over_none: dict) -> str:
    headers = ["mode", "streams", "turns", "errors", "output tok/s", "÷ none", "tok/fwd", "accepted"]
    headers += ["TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "cached", "calls", "JSON"]
    rows = []
    for mode in modes:
        for run in mode["runs"]:
            spec, checks = run["speculation"], run["well_formed"]
            ratio = over_none.get(mode["mode"], {}).get(str(run["concurrency"]))
            rows.append(
                [
                    mode["mode"],
                    str(run["concurrency"]),
                    str(run["requests"]),
                    str(run["errors"]),
                    fmt(run["output_tokens_per_s"]),
                    fmt(ratio, 2, "x") if ratio is not None else "-",
                    fmt(spec["tokens_per_forward"], 2),
                    _share(spec["acceptance_rate"]),
                    fmt(run["ttft_ms"]["p50"], 0),
                    fmt(run["ttft_ms"]["p99"], 0),
                    fmt(run["itl_ms"]["p50"], 1),
                    fmt(run["itl_ms"]["p99"], 1),
                    _share(run["cached_share"]),
                    f"{checks['forced_calls_made']}/{checks['forced_calls']}",
                    f"{checks['json_answers_complete']}/{checks['json_answers']}",
                ]
            )
    return markdown_table(headers, rows)


def _sources(modes: list[dict]) -> list[str]:
    """One line per run that drafted: accepted of drafted tokens per draft source."""
    lines = []
    for mode in modes:
        for run in mode["runs"]:
            sources = run["speculation"]["sources"]
            if sources:
                parts = ", ".join(
                    f"`{name}` {counts['accepted_tokens']}/{counts['draft_tokens']}" for name, counts in sources.items()
                )
                lines.append(f"- `{mode['mode']}` at {run['concurrency']} stream(s): accepted/drafted tokens {parts}")
    return ["Draft sources:", "", *lines, ""] if lines else []


def _workload_table(modes: list[dict]) -> str:
    headers = ["mode", "streams", "workload", "turns", "tokens", "tok/fwd", "accepted", "cached", "TTFT p50", "ITL p50"]
    rows = [
        [
            mode["mode"],
            str(run["concurrency"]),
            name,
            str(figures["turns"]),
            str(figures["completion_tokens"]),
            fmt(figures["tokens_per_forward"], 2),
            _share(figures["acceptance_rate"]),
            _share(figures["cached_share"]),
            fmt(figures["ttft_ms"]["p50"], 0),
            fmt(figures["itl_ms"]["p50"], 1),
        ]
        for mode in modes
        for run in mode["runs"]
        for name, figures in run["workloads"].items()
    ]
    return markdown_table(headers, rows)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"
