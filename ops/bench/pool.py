"""`arbor bench pool`: the gateway-vs-in-process pairs of several `arbor bench serving` runs, pooled.

One run's median moves with the minutes it ran in (on a shared 2-core VM, ±2-4% between runs of
100 pairs). Pooling the pairs of several runs, spread over time, gives the figure with an interval
that covers that drift too. Torch-free.

    arbor bench pool bench-results/a bench-results/b/serving.json ...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ops.bench.pairs import QUIET_CORES, is_quiet, pooled, rate_ratio
from ops.bench.results import markdown_table

RATIOS = (("e2e", "over end-to-end time"), ("tpot", "after the first text"))


def run_pool_command(args: argparse.Namespace) -> int:
    runs = [(str(path), load_pairs(path)) for path in args.results]
    print(pool_markdown(runs))
    return 0


def load_pairs(path: Path) -> list[dict]:
    """The pairs of a serving report (its folder or its serving.json); ValueError naming the file."""
    file = path / "serving.json" if path.is_dir() else path
    try:
        report = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{file}: not a readable serving report ({error})") from None
    pairs = (report.get("comparison") or {}).get("pairs")
    if not pairs:
        raise ValueError(
            f"{file}: no gateway/in-process pairs (run with --compare-requests N, from a version that records them)"
        )
    return pairs


def pool_markdown(runs: list[tuple[str, list[dict]]]) -> str:
    def row(name: str, pairs: list[dict], quiet_only: bool = False) -> list[str]:
        kept = [pair for pair in pairs if not quiet_only or is_quiet(pair)]
        rate = rate_ratio(kept)
        return [
            name,
            str(len(kept)),
            "—" if rate is None else f"{rate:.3f}",
            *(_cell(pooled(kept, kind)) for kind, _ in RATIOS),
        ]

    everything = [pair for _, pairs in runs for pair in pairs]
    rows = [row(name, pairs) for name, pairs in runs]
    rows += [
        row(f"**pooled, {len(runs)} runs**", everything),
        row(f"pooled, quiet pairs (others < {QUIET_CORES:g} core)", everything, quiet_only=True),
    ]
    headers = [
        "run",
        "pairs",
        "tokens/s ratio, end to end",
        *(f"paired ratio {what} (95% interval)" for _, what in RATIOS),
    ]
    return "\n".join(
        [
            "# Gateway + Redis vs in-process generate, pooled pair by pair",
            "",
            markdown_table(headers, rows),
            "",
            "Tokens/s ratio: all gateway tokens over all gateway time, against the same for in-process "
            "generate. Each pair: in-process time over gateway time, same prompt, run back to back; "
            "medians with a 95% bootstrap interval of the median.",
            "",
        ]
    )


def _cell(summary: dict | None) -> str:
    if summary is None:
        return "—"
    low, high = summary["ci95"]
    return f"{summary['median']:.3f} ({low:.3f}-{high:.3f})"
