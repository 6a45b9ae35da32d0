"""`arbor bench decode --formats`: weight formats x speculation modes side by side, in one run.

One serving model per format (`FORMAT_PRECISIONS`: a name -> --dtype, --quantize and --kernels), every mode
of `--modes` on each, all contenders interleaved prompt by prompt as `arbor bench decode` does, so
the ratios come from one run on a shared machine. Beside tokens/s the report gives, per format:

- the cost of one forward at 1, 2, 4, 8, 16 rows, as it serves decoding (the decode format; best
  of a few, so a neighbour's load adds less);
- losslessness within the format (every mode's tokens == plain decoding's in that format);
- greedy agreement with the first format's plain decoding (prompts identical, and the share of
  tokens before the first difference).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from ops.bench.decode import (
    Contender,
    DecodeConfig,
    arbor_contenders,
    config_from_args,
    encode_prompt,
    run_interleaved,
)
from ops.bench.decode_stats import PromptRun, add_ratios, losslessness, summarize
from ops.bench.results import SIDE_BY_SIDE_NOTE, machine_info, results_dir, write_json
from ops.training.prompts import HELD_OUT
from worker.models.row_timing import forward_cost, new_timing_cache
from worker.serving_model import ServingModel, load_serving_model

FORMAT_PRECISIONS: dict[str, tuple[str, str, str]] = {  # name -> (--dtype, --quantize, --kernels)
    "float32": ("float32", "none", "auto"),  # the exact path
    "float64": ("float64", "none", "auto"),
    "bfloat16": ("bfloat16", "none", "auto"),  # dense bfloat16 everywhere
    "int8": ("auto", "int8", "auto"),
    "int4": ("auto", "int4", "auto"),
    "auto": ("auto", "auto", "auto"),  # the default: what `arbor generate` and the worker load
    "auto-torch": ("auto", "auto", "torch"),  # the default format on PyTorch's kernels (bfloat16 activations)
    "auto-native": ("auto", "auto", "native"),  # ... on Arbor's (two-term int8 activations), wherever they build
    "auto-native-int8": ("auto", "auto", "native-int8"),  # ... with one-term int8 activations (llama.cpp's)
}
STEP_ROWS = (1, 2, 4, 8, 16)
# Twenty prompts for greedy agreement: the twelve held out from drafter training, and eight more.
EXTRA_PROMPTS = [
    "Explain why the sky is blue in two sentences.",
    "Write a haiku about a lighthouse.",
    "What are three differences between a list and a tuple in Python?",
    "Summarize the plot of Romeo and Juliet in one paragraph.",
    "Give me a recipe for a simple tomato soup.",
    "How does a binary search work? Answer briefly.",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "Write a SQL query that counts orders per customer.",
]
AGREEMENT_PROMPTS = list(HELD_OUT) + EXTRA_PROMPTS


def parse_formats(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in FORMAT_PRECISIONS]
    if not names or unknown:
        raise ValueError(f"--formats={text!r}: choose from {','.join(FORMAT_PRECISIONS)}")
    return names


def load_format(model: str | None, name: str, cache_dir: Path | None = None) -> ServingModel:
    dtype, quantize, kernels = FORMAT_PRECISIONS[name]
    return load_serving_model(model, "none", dtype=dtype, quantize=quantize, kernels=kernels, cache_dir=cache_dir)


def run_formats(config: DecodeConfig, formats: list[str]) -> tuple[dict, Path]:
    if config.threads:
        torch.set_num_threads(config.threads)
    machine = machine_info()
    served = {name: load_format(config.model, name) for name in formats}
    contenders: list[Contender] = []
    unavailable: list[dict] = []
    for name, model in served.items():
        found, missing = arbor_contenders(model, config)
        contenders += [replace(c, name=f"{c.name} [{name}]") for c in found]
        unavailable += [{**item, "name": f"{item['name']} [{name}]"} for item in missing]
    first = served[formats[0]]
    prompts = [encode_prompt(first, text) for text in HELD_OUT[: config.num_prompts]]
    runs = run_interleaved(contenders, prompts, config)
    report = _report(config, formats, served, contenders, runs, unavailable, machine)
    folder = results_dir(config.out)
    write_json(folder / "formats.json", report)
    (folder / "formats.md").write_text(formats_markdown(report))
    return report, folder


def _report(
    config: DecodeConfig,
    formats: list[str],
    served: dict[str, ServingModel],
    contenders: list[Contender],
    runs: dict[str, list[PromptRun]],
    unavailable: list[dict],
    machine: dict,
) -> dict:
    summaries = [summarize(c.name, c.engine, runs[c.name]) for c in contenders]
    baseline = f"arbor none [{formats[0]}]"
    add_ratios(summaries, baseline)
    reference = [run.token_ids for run in runs[baseline]]
    per_format = {}
    for name in formats:
        mine = {c.name: runs[c.name] for c in contenders if c.name.endswith(f"[{name}]")}
        plain = f"arbor none [{name}]"
        per_format[name] = {
            "precision": dict(zip(("dtype", "quantize", "kernels"), FORMAT_PRECISIONS[name], strict=True)),
            "formats": _describe_formats(served[name]),
            "step_ms": step_costs(served[name]),
            "losslessness": losslessness(mine, plain, config.temperature > 0) if plain in mine else None,
            "agreement_with_first": greedy_agreement(reference, [run.token_ids for run in runs[plain]]),
        }
    return {
        "timestamp": time.strftime("%Y-%m-%d %H:%M:%S"),
        "settings": {
            "model": config.model or "SmolLM2-135M-Instruct (default)",
            "formats": formats,
            "modes": config.modes,
            "num_prompts": config.num_prompts,
            "max_tokens": config.max_tokens,
            "threads": torch.get_num_threads(),
            "temperature": config.temperature,
        },
        "machine": machine,
        "baseline": baseline,
        "note": SIDE_BY_SIDE_NOTE,
        "contenders": summaries,
        "formats": per_format,
        "unavailable": unavailable,
    }


def _describe_formats(model: ServingModel) -> str:
    formats = model.loaded.formats
    return "exact path (dense, unfused)" if formats is None or formats.is_exact_path else formats.describe()


def step_costs(model: ServingModel, rows: Sequence[int] = STEP_ROWS) -> dict[int, float]:
    """ms of one forward with logits at each row count, in the format decoding uses."""
    decoder = model.loaded.decoder
    cache = new_timing_cache(decoder, max(rows))
    with torch.inference_mode():
        return {n: round(forward_cost(decoder, cache, n) * 1e3, 2) for n in rows}


def greedy_agreement(reference: list[list[int]], other: list[list[int]]) -> dict:
    """How close greedy outputs stay to a reference: prompts identical token for token, and the
    share of all tokens that come before each prompt's first difference (1.0: no difference)."""
    identical = sum(a == b for a, b in zip(reference, other, strict=True))
    before = sum(_common_prefix(a, b) for a, b in zip(reference, other, strict=True))
    total = sum(len(a) for a in reference)
    return {
        "identical_prompts": identical,
        "num_prompts": len(reference),
        "tokens_before_first_difference": round(before / total, 4) if total else 1.0,
    }


def _common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def formats_markdown(report: dict) -> str:
    settings = report["settings"]
    lines = [
        f"# arbor bench decode --formats — {report['timestamp']}",
        "",
        f"Model {settings['model']}, {settings['threads']} torch threads, {settings['num_prompts']} held-out "
        f"prompts x {settings['max_tokens']} tokens, temperature {settings['temperature']}; machine: "
        f"{report['machine']['cpu_count']} cores, load average {report['machine']['load_average_1m']} at start. "
        f"Ratios are to `{report['baseline']}`.",
        "",
        "| contender | decode tokens/s | ratio | tokens/forward |",
        "|---|---:|---:|---:|",
    ]
    for c in report["contenders"]:
        lines.append(
            f"| {c['name']} | {c['decode_tokens_per_s']:.1f} | {c['ratio_to_baseline']:.2f} | "
            f"{c.get('tokens_per_forward') or 1.0:.2f} |"
        )
    rows = STEP_ROWS
    lines += ["", "| format | held as | " + " | ".join(f"{n} rows ms" for n in rows) + " | agreement |"]
    lines.append("|---|---|" + "---:|" * (len(rows) + 1))
    for name, info in report["formats"].items():
        agreement = info["agreement_with_first"]
        costs = " | ".join(f"{info['step_ms'][n]:.1f}" for n in rows)
        lines.append(
            f"| {name} | {info['formats']} | {costs} | {agreement['identical_prompts']}/{agreement['num_prompts']} "
            f"identical, {agreement['tokens_before_first_difference']:.3f} before a difference |"
        )
    lines += ["", report["note"], ""]
    return "\n".join(lines)


def run_formats_command(args: argparse.Namespace) -> int:
    """`arbor bench decode --formats ...`: every mode in every weight format, side by side."""
    report, folder = run_formats(config_from_args(args), parse_formats(args.formats))
    print(formats_markdown(report))
    print(f"results: {folder}")
    return 0
