"""PNG figures for the benchmark reports. matplotlib's object API on the Agg canvas: no pyplot state."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def decode_figure(report: dict, path: Path) -> None:
    contenders = report["contenders"]
    names = [c["name"] for c in contenders]
    figure = Figure(figsize=(11, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    rates, forwards = figure.subplots(1, 2)
    bars = rates.barh(names, [c["decode_tokens_per_s"] or 0 for c in contenders], color="tab:blue")
    rates.bar_label(bars, labels=[f"{c['ratio_to_baseline'] or 0:.2f}x" for c in contenders], padding=3)
    rates.set_xlabel(f"decode tokens/s (ratio to {report['baseline']})")
    rates.margins(x=0.18)
    rates.invert_yaxis()
    forwards.barh(names, [c["tokens_per_forward"] or 0 for c in contenders], color="tab:green")
    forwards.set_xlabel("tokens per target forward")
    forwards.invert_yaxis()
    forwards.set_yticklabels([])
    settings = report["settings"]
    figure.suptitle(
        f"{settings['model']}: {settings['num_prompts']} prompts × {settings['max_tokens']} tokens, "
        f"temperature {settings['temperature']}, {settings['threads']} threads (side by side)"
    )
    figure.savefig(path, dpi=110)


def serving_figure(report: dict, path: Path) -> None:
    """Latencies and throughput against streams, one colour per speculation mode; scaling as bars."""
    runs = [(_mode_label(run["mode"]), run["sweep"]) for run in report["modes"]]
    concurrency = sorted({level["concurrency"] for _, sweep in runs for level in sweep})
    figure = Figure(figsize=(12, 8), layout="constrained")
    FigureCanvasAgg(figure)
    (ttft, e2e), (throughput, scaling) = figure.subplots(2, 2)
    _latency_panel(ttft, concurrency, runs, "ttft_ms", "time to first token (ms)")
    _latency_panel(e2e, concurrency, runs, "e2e_ms", "end to end (ms)")
    _throughput_panel(throughput, concurrency, runs)
    _scaling_panel(scaling, report.get("scaling") or [])
    settings = report["settings"]
    where = settings.get("base_url") or f"speculation {', '.join(settings['speculation'])}"
    figure.suptitle(f"{settings['model']}, {where}, {settings['max_tokens']} tokens per request")
    figure.savefig(path, dpi=110)


def _mode_label(mode: str | None) -> str:
    return "server" if mode is None else mode


def _colour(index: int) -> str:
    return f"C{index % 10}"


def _latency_panel(axes, concurrency: list[int], runs: list[tuple[str, list[dict]]], key: str, label: str) -> None:
    for index, (mode, levels) in enumerate(runs):
        x = [level["concurrency"] for level in levels]
        for quantile, style in (("p50", "o-"), ("p99", "s--")):
            values = [_nan(level[key][quantile]) for level in levels]
            axes.plot(x, values, style, color=_colour(index), label=f"{mode} {quantile}")
    _clients_axis(axes, concurrency)
    axes.set_ylim(bottom=0)
    axes.set_ylabel(label)
    axes.legend()


def _throughput_panel(axes, concurrency: list[int], runs: list[tuple[str, list[dict]]]) -> None:
    top = 0.0
    for index, (mode, levels) in enumerate(runs):
        values = [_nan(level["output_tokens_per_s"]) for level in levels]
        axes.plot([level["concurrency"] for level in levels], values, "o-", color=_colour(index), label=mode)
        top = max([top, *(level["output_tokens_per_s"] or 0 for level in levels)])
    axes.set_ylabel("output tokens/s")
    axes.set_ylim(0, 1.1 * top or 1)
    axes.legend()
    _clients_axis(axes, concurrency)


def _nan(value: float | None) -> float:
    return float("nan") if value is None else value


def _clients_axis(axes, concurrency: list[int]) -> None:
    axes.set_xscale("log", base=2)
    axes.set_xticks(concurrency, [str(c) for c in concurrency])
    axes.minorticks_off()
    axes.set_xlabel("concurrent streams")


def _scaling_panel(axes, scaling: list[dict]) -> None:
    if not scaling:
        axes.set_axis_off()
        return
    labels = [f"{row['workers']} worker(s)\n{row['label']}" for row in scaling]
    axes.bar(labels, [row["output_tokens_per_s"] for row in scaling], color="tab:orange")
    axes.set_ylabel(f"output tokens/s at {scaling[0]['concurrency']} clients")
