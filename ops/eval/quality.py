"""`arbor bench quality`: `arbor eval` per weight format and per speculation mode, each on a stack
of its own, and the gates a release must pass:

    speculation   every mode's generations are byte-identical to `none`'s (greedy, same format),
                  and its loglikelihoods equal `none`'s within float noise (LOGLIKELIHOOD_ATOL):
                  prompt scoring runs the same prefill whatever the drafter
    format        the default format's word perplexity within PERPLEXITY_TOLERANCE of float32's

Configurations are `label=speculation:dtype:quantize` (see DEFAULT_CONFIGS); the first with
dtype float32 is the format reference, and each mode is compared with the `none` run of its format.
Writes quality.json (every run's metrics, wall time, gates) and quality.md beside the runs' folders.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ops.bench.stack import Stack
from ops.eval.run import EvalRun, run_eval
from ops.eval.tasks import ARITHMETIC_TASK, MC_TASK, PPL_TASK, TASKS

PERPLEXITY_TOLERANCE = 0.03  # relative, default format against float32
LOGLIKELIHOOD_ATOL = 1e-3  # per scored sequence, a mode against none (float noise, summed over its tokens)
DEFAULT_CONFIGS = (
    "float32=none:float32:none",
    "int8=none:auto:int8",
    "int4=none:auto:int4",
    "default=none:auto:auto",
    "auto=auto:auto:auto",
    "mtp=mtp:auto:auto",
    "dflash=dflash:auto:auto",
    "tree=tree:auto:auto",
    "ngram=ngram:auto:auto",
    "suffix=suffix:auto:auto",
)


@dataclass(frozen=True, slots=True)
class Config:
    label: str
    speculation: str
    dtype: str
    quantize: str

    @classmethod
    def parse(cls, text: str) -> Config:
        label, _, rest = text.partition("=")
        parts = rest.split(":")
        if not label or len(parts) != 3:
            raise ValueError(f"--configs: {text!r} is not label=speculation:dtype:quantize")
        return cls(label, *parts)


@dataclass(slots=True)
class Outcome:
    config: Config
    metrics: dict[str, float]
    wall_s: float
    loglikelihoods: list[float]  # every scored sequence, task by task, in lm-eval's order
    generations: list[str]
    gates: dict[str, bool] = field(default_factory=dict)


def run_quality(
    model: str | None, configs: list[Config], num_items: int, out: Path, ready_timeout_s: float = 600.0
) -> list[Outcome]:
    out.mkdir(parents=True, exist_ok=True)
    outcomes = [_evaluate(model, config, num_items, out / config.label, ready_timeout_s) for config in configs]
    check_gates(outcomes)
    (out / "quality.json").write_text(json.dumps([_as_json(outcome) for outcome in outcomes], indent=2))
    table = quality_table(outcomes)
    (out / "quality.md").write_text(table)
    print(table)
    return outcomes


def _evaluate(model: str | None, config: Config, num_items: int, out: Path, ready_timeout_s: float) -> Outcome:
    out.mkdir(parents=True, exist_ok=True)
    env = {"ARBOR_QUANTIZE": config.quantize}
    stack = Stack(out, model, config.speculation, None, config.dtype, None, ready_timeout_s, extra_env=env)
    with stack.start(1):
        started = time.monotonic()
        run = run_eval(stack.base_url, out / "eval", stack.model_name, num_items, TASKS)
        wall_s = time.monotonic() - started
    return Outcome(config, headline(run), wall_s, loglikelihoods(run), generations(run))


def headline(run: EvalRun) -> dict[str, float]:
    results = run.results
    return {
        "word_perplexity": results[PPL_TASK]["word_perplexity,none"],
        "bits_per_byte": results[PPL_TASK]["bits_per_byte,none"],
        "acc": results[MC_TASK]["acc,none"],
        "acc_norm": results[MC_TASK]["acc_norm,none"],
        "exact_match": results[ARITHMETIC_TASK]["exact_match,first_number"],
    }


def loglikelihoods(run: EvalRun) -> list[float]:
    """Each document's rolling loglikelihood, then each choice's (samples hold [[ll]], [[[ll, greedy]], ...])."""
    found = [float(sample["resps"][0][0]) for sample in _by_doc(run, PPL_TASK)]
    for sample in _by_doc(run, MC_TASK):
        found += [float(resp[0][0]) for resp in sample["resps"]]
    return found


def _by_doc(run: EvalRun, task: str) -> list[dict[str, Any]]:
    return sorted(run.samples[task], key=lambda sample: sample["doc_id"])


def generations(run: EvalRun) -> list[str]:
    return [str(sample["resps"][0][0]) for sample in _by_doc(run, ARITHMETIC_TASK)]


def check_gates(outcomes: list[Outcome]) -> None:
    """Each outcome's gates, in place (a gate whose reference run is missing is not set)."""
    reference = next((o for o in outcomes if o.config.dtype == "float32" and o.config.speculation == "none"), None)
    for outcome in outcomes:
        config = outcome.config
        plain = next(
            (
                o
                for o in outcomes
                if o.config.speculation == "none"
                and (o.config.dtype, o.config.quantize) == (config.dtype, config.quantize)
            ),
            None,
        )
        if config.speculation != "none" and plain is not None:
            outcome.gates["generations_equal_none"] = outcome.generations == plain.generations
            outcome.gates["loglikelihoods_equal_none"] = len(outcome.loglikelihoods) == len(
                plain.loglikelihoods
            ) and all(abs(a - b) <= LOGLIKELIHOOD_ATOL for a, b in zip(outcome.loglikelihoods, plain.loglikelihoods))
        if config.speculation == "none" and reference is not None and outcome is not reference:
            ratio = outcome.metrics["word_perplexity"] / reference.metrics["word_perplexity"]
            outcome.gates["perplexity_within_tolerance"] = abs(ratio - 1.0) <= PERPLEXITY_TOLERANCE


def quality_table(outcomes: list[Outcome]) -> str:
    lines = [
        f"perplexity gate: within {PERPLEXITY_TOLERANCE:.0%} of float32; speculation gate: generations identical "
        f"to none and loglikelihoods within {LOGLIKELIHOOD_ATOL:g}",
        "",
        "| config | speculation | dtype | quantize | word ppl | bits/byte | acc | acc_norm | exact match "
        "| eval s | gates |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for outcome in outcomes:
        config, metrics = outcome.config, outcome.metrics
        gates = ", ".join(f"{name} {'ok' if passed else 'FAIL'}" for name, passed in outcome.gates.items()) or "-"
        lines.append(
            f"| {config.label} | {config.speculation} | {config.dtype} | {config.quantize} "
            f"| {metrics['word_perplexity']:.4g} | {metrics['bits_per_byte']:.4f} | {metrics['acc']:.3f} "
            f"| {metrics['acc_norm']:.3f} | {metrics['exact_match']:.3f} | {outcome.wall_s:.0f} | {gates} |"
        )
    return "\n".join(lines) + "\n"


def passed(outcomes: list[Outcome]) -> bool:
    return all(all(outcome.gates.values()) for outcome in outcomes)


def _as_json(outcome: Outcome) -> dict[str, Any]:
    return {
        "config": asdict(outcome.config),
        "metrics": outcome.metrics,
        "wall_s": round(outcome.wall_s, 2),
        "gates": outcome.gates,
        "generations": outcome.generations,
    }
