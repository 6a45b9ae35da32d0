"""Per-prompt decode runs -> per-contender figures, ratios, the losslessness check, the markdown. Torch-free.

A contender's decode rate is tokens over decode time summed across prompts (not a mean of
per-prompt rates, which would overweight short, fast prompts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ops.bench.results import SIDE_BY_SIDE_NOTE, fmt, markdown_table, ratio


@dataclass(slots=True)
class PromptRun:
    token_ids: list[int]
    num_decoded: int  # tokens the decode time covers
    decode_s: float
    wall_s: float  # prefill and everything else included
    num_forwards: int  # target forwards that produced tokens
    num_drafts: int | None = None  # None: the engine does not report drafts (transformers)
    num_accepted: int | None = None
    draft_s: float | None = None  # Arbor: time in the drafter's propose
    verify_s: float | None = None  # Arbor: target forward + acceptance + the drafter's observe


def summarize(name: str, engine: str, runs: Sequence[PromptRun]) -> dict:
    num_decoded = sum(run.num_decoded for run in runs)
    decode_s = sum(run.decode_s for run in runs)
    num_tokens = sum(len(run.token_ids) for run in runs)
    wall_s = sum(run.wall_s for run in runs)
    num_forwards = sum(run.num_forwards for run in runs)
    drafts = None if runs[0].num_drafts is None else sum(run.num_drafts or 0 for run in runs)
    accepted = None if runs[0].num_accepted is None else sum(run.num_accepted or 0 for run in runs)
    # 1 + accepted / drafts, as vLLM reports it; 1.0 when nothing was ever drafted
    acceptance_length = None if drafts is None or accepted is None else 1.0 + (accepted / drafts if drafts else 0.0)
    return {
        "name": name,
        "engine": engine,
        "available": True,
        "tokens": num_tokens,
        "decode_s": round(decode_s, 4),
        "wall_s": round(wall_s, 4),
        "decode_tokens_per_s": ratio(num_decoded, decode_s),
        "wall_tokens_per_s": ratio(num_tokens, wall_s),
        "target_forwards": num_forwards,
        "drafts": drafts,
        "accepted_tokens": accepted,
        "tokens_per_forward": ratio(num_tokens, num_forwards),
        "acceptance_length": acceptance_length,
        "per_prompt_decode_tokens_per_s": [ratio(run.num_decoded, run.decode_s) for run in runs],
        **_step_costs(runs, num_forwards),
    }


def _step_costs(runs: Sequence[PromptRun], num_forwards: int) -> dict:
    """Milliseconds per decode step spent drafting and verifying: which side bounds a mode's speed."""
    if runs[0].draft_s is None or not num_forwards:
        return {}
    draft_s = sum(run.draft_s or 0.0 for run in runs)
    verify_s = sum(run.verify_s or 0.0 for run in runs)
    return {"draft_ms_per_step": 1000 * draft_s / num_forwards, "verify_ms_per_step": 1000 * verify_s / num_forwards}


def add_ratios(summaries: list[dict], baseline: str) -> None:
    base = next(summary for summary in summaries if summary["name"] == baseline)
    for summary in summaries:
        summary["ratio_to_baseline"] = ratio(summary["decode_tokens_per_s"], base["decode_tokens_per_s"])
        summary["wall_ratio_to_baseline"] = ratio(summary["wall_tokens_per_s"], base["wall_tokens_per_s"])


def losslessness(runs_by_mode: dict[str, list[PromptRun]], reference: str, sampled: bool) -> dict:
    """Every Arbor mode's token ids equal the reference mode's, prompt by prompt.

    Greedy, or sampled with the same seed per prompt: each emitted token consumes one uniform
    draw in every mode, so even sampled outputs must match token for token.
    """
    expected = [run.token_ids for run in runs_by_mode[reference]]
    mismatched = {
        mode: sum(run.token_ids != ids for run, ids in zip(runs, expected, strict=True))
        for mode, runs in runs_by_mode.items()
        if mode != reference
    }
    return {
        "reference": reference,
        "modes": list(runs_by_mode),
        "num_prompts": len(expected),
        "sampling": "seeded sampling" if sampled else "greedy",
        "compared": len(runs_by_mode) > 1,
        "identical": not any(mismatched.values()),
        "mismatched_prompts": mismatched,
    }


def agreement_before_eos(reference: list[PromptRun], other: list[PromptRun], eos_ids: Sequence[int]) -> dict:
    # transformers' min_new_tokens suppresses EOS while Arbor's ignore_eos emits it and continues,
    # so the two can only agree up to the first EOS.
    same = sum(
        _before_eos(a.token_ids, eos_ids) == _before_eos(b.token_ids, eos_ids)
        for a, b in zip(reference, other, strict=True)
    )
    return {"identical_prompts": same, "num_prompts": len(reference)}


def _before_eos(token_ids: list[int], eos_ids: Sequence[int]) -> list[int]:
    cut = next((i for i, token in enumerate(token_ids) if token in eos_ids), len(token_ids))
    return token_ids[:cut]


def decode_markdown(report: dict) -> str:
    settings = report["settings"]
    lines = [
        f"# arbor bench decode — {report['timestamp']}",
        "",
        f"Model {settings['model']}, {settings['dtype']}, {settings['threads']} torch threads, "
        f"{settings['num_prompts']} held-out prompts × {_token_budget(settings)}, "
        f"temperature {settings['temperature']}, seed {settings['seed']}; "
        f"machine: {report['machine']['cpu_count']} cores, load average {report['machine']['load_average_1m']} "
        f"at start. Ratios are to `{report['baseline']}`.",
        "",
        *_json_mode_lines(report),
        _contender_table(report["contenders"]),
        "",
    ]
    lines += [f"- {item['name']}: unavailable: {item['reason']}" for item in report["unavailable"]]
    lines += ["", _lossless_line(report["lossless"])]
    if report.get("transformers_agreement"):
        agreement = report["transformers_agreement"]
        lines.append(
            f"- transformers generate (plain) gives the same tokens as Arbor up to the first EOS on "
            f"{agreement['identical_prompts']}/{agreement['num_prompts']} prompts."
        )
    if any("draft_ms_per_step" in c for c in report["contenders"]):
        lines += [
            "",
            "Where a decode step's time goes (Arbor): drafting is the drafter's `propose`; verifying is "
            "the target forward over root + drafts, the acceptance walk and the drafter's `observe`.",
            "",
            _step_cost_table(report["contenders"]),
        ]
    lines += [
        "",
        "Decode tokens/s: Arbor counts every generated token over its decode steps (`stats.decode_s`); "
        "transformers counts the tokens after the prefill's over the time after it. Wall tokens/s include "
        "prefill.",
        "",
        f"Measured side by side: {SIDE_BY_SIDE_NOTE}.",
    ]
    return "\n".join(lines) + "\n"


def _token_budget(settings: dict) -> str:
    if settings.get("json_mode") or settings.get("json_schema"):
        return f"up to {settings['max_tokens']} new tokens (constrained answers end at EOS, plain text ignores it)"
    return f"{settings['max_tokens']} new tokens (EOS ignored)"


def _json_mode_lines(report: dict) -> list[str]:
    check = report.get("constraint_check")
    if check is None:
        return []
    settings = report["settings"]
    what = f"the JSON schema `{settings['json_schema']}`" if settings.get("json_schema") else "`json_object`"
    return [
        f"**Constrained** by {what} for every Arbor mode: each answer ends where its grammar is complete, "
        f"so answers are shorter than the token budget. `arbor none, text` decodes unconstrained text "
        f"beside them (EOS ignored): the mask's cost. Plain decoding's answers: {check['within_grammar']}/"
        f"{check['num_prompts']} within the grammar to their last token, {check['valid']} complete and valid. "
        f"A fresh worker's first request reads the tokenizer in "
        f"{check['first_request_tokenizer_ms']:.0f} ms and compiles the grammar in "
        f"{check['first_request_compile_ms']:.1f} ms; a row's mask takes {check['mask_us_p50']} us (p50), "
        f"{check['mask_us_p99']} us (p99).",
        "",
    ]


def _step_cost_table(contenders: list[dict]) -> str:
    headers = [
        "mode",
        "ms per step",
        "drafting (propose)",
        "verifying (forward + observe)",
        "tokens/forward",
        "ms per token",
    ]
    rows = []
    for c in contenders:
        if "draft_ms_per_step" not in c:
            continue
        step = c["draft_ms_per_step"] + c["verify_ms_per_step"]
        rows.append(
            [
                c["name"],
                fmt(step),
                fmt(c["draft_ms_per_step"]),
                fmt(c["verify_ms_per_step"]),
                fmt(c["tokens_per_forward"], 2),
                fmt(step / c["tokens_per_forward"]),
            ]
        )
    return markdown_table(headers, rows)


def _contender_table(contenders: list[dict]) -> str:
    headers = [
        "contender",
        "decode tokens/s",
        "ratio",
        "tokens/forward",
        "acceptance length",
        "wall tokens/s",
        "wall ratio",
    ]
    rows = [
        [
            c["name"],
            fmt(c["decode_tokens_per_s"]),
            fmt(c["ratio_to_baseline"], 2, "x"),
            fmt(c["tokens_per_forward"], 2),
            fmt(c["acceptance_length"], 2),
            fmt(c["wall_tokens_per_s"]),
            fmt(c["wall_ratio_to_baseline"], 2, "x"),
        ]
        for c in contenders
    ]
    return markdown_table(headers, rows)


def _lossless_line(check: dict | None) -> str:
    if check is None:
        return "- Losslessness: no Arbor mode ran."
    if not check["compared"]:
        return f"- Losslessness: only `{check['reference']}` ran, nothing to compare."
    verdict = "yes" if check["identical"] else f"NO (mismatched prompts: {check['mismatched_prompts']})"
    return (
        f"- Losslessness ({check['sampling']}): token ids identical to `{check['reference']}` for "
        f"{', '.join(m for m in check['modes'] if m != check['reference'])} on all {check['num_prompts']} "
        f"prompts: {verdict}."
    )
