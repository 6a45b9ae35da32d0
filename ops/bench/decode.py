"""`arbor bench decode`: decode speed of each speculation mode, and of transformers, on one model.

Arbor's modes share one loaded model (one runner per mode, each with its drafter); transformers
loads the same checkpoint. Every contender decodes every held-out prompt, taking turns prompt by
prompt (the order rotates), after one short warm-up run each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from ops.bench.decode_stats import PromptRun, add_ratios, agreement_before_eos, decode_markdown, losslessness, summarize
from ops.bench.plots import decode_figure
from ops.bench.results import SIDE_BY_SIDE_NOTE, machine_info, results_dir, write_json
from ops.training.prompts import HELD_OUT
from shared.sampling import SamplingParams
from shared.structured_output import StructuredOutput, json_schema_output
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.generate import generate
from worker.engine.grammar_constraint import GrammarConstraint, GrammarMasks, GrammarViolation
from worker.engine.runner import ModelRunner
from worker.serving_model import ServingModel, load_serving_model

WARMUP_TOKENS = 8
PLAIN_TEXT = "arbor none, text"  # a constrained run's contender without the mask


@dataclass(slots=True)
class Contender:
    name: str
    engine: str  # "arbor" or "transformers"
    run: Callable[[list[int], int, int], PromptRun]  # (prompt ids, max tokens, seed)


@dataclass(slots=True, frozen=True)
class DecodeConfig:
    modes: list[str]
    num_prompts: int
    max_tokens: int
    temperature: float
    seed: int
    model: str | None
    dtype: str
    draft_mtp: Path | None
    draft_dflash: Path | None
    assistant: str | None
    prompt_lookup_tokens: int
    transformers: bool
    threads: int | None
    out: str | None
    json_mode: bool = False  # every Arbor mode under response_format json_object, EOS ending each answer
    json_schema: Path | None = None  # every Arbor mode under this JSON schema instead

    def structured(self) -> StructuredOutput | None:
        if self.json_schema is not None:
            return json_schema_output(self.json_schema.read_text(), f"--json-schema {self.json_schema}")
        return StructuredOutput("json_object", "", "--json-mode") if self.json_mode else None


def run_decode_command(args: argparse.Namespace) -> int:
    report, folder = run_decode(config_from_args(args))
    print(decode_markdown(report))
    print(f"results: {folder}")
    return 0


def config_from_args(args: argparse.Namespace) -> DecodeConfig:
    if not 1 <= args.prompts <= len(HELD_OUT):
        raise ValueError(f"--prompts={args.prompts} must be between 1 and {len(HELD_OUT)} (the held-out set)")
    if args.max_tokens < 1 or args.temperature < 0:
        raise ValueError(f"--max-tokens={args.max_tokens} must be >= 1 and --temperature={args.temperature} >= 0")
    return DecodeConfig(
        args.modes,
        args.prompts,
        args.max_tokens,
        args.temperature,
        args.seed,
        args.model,
        args.dtype,
        args.draft_mtp,
        args.draft_dflash,
        args.assistant,
        args.prompt_lookup_tokens,
        not args.no_transformers,
        args.threads,
        args.out,
        args.json_mode,
        args.json_schema,
    )


def run_decode(config: DecodeConfig) -> tuple[dict, Path]:
    if config.threads:
        torch.set_num_threads(config.threads)
    machine = machine_info()
    served = load_serving_model(config.model, "none", dtype=config.dtype)
    contenders, unavailable = arbor_contenders(served, config)
    if config.structured() is not None:  # the mask's cost, side by side: plain decoding of unconstrained text
        contenders.append(Contender(PLAIN_TEXT, "arbor-text", _arbor_run(served.runner, served, config.temperature)))
        unavailable.append({"name": "transformers", "reason": "constrained decoding is not compared with it"})
    elif config.transformers:
        found, missing = transformers_contenders(served, config)
        contenders, unavailable = contenders + found, unavailable + missing
    if not contenders:
        reasons = "; ".join(f"{item['name']}: {item['reason']}" for item in unavailable)
        raise ValueError(f"nothing to run: {reasons}")
    prompts = [encode_prompt(served, text) for text in HELD_OUT[: config.num_prompts]]
    runs = run_interleaved(contenders, prompts, config)
    report = build_report(config, served, contenders, runs, unavailable, machine)
    folder = results_dir(config.out)
    write_json(folder / "decode.json", report)
    (folder / "decode.md").write_text(decode_markdown(report))
    decode_figure(report, folder / "decode.png")
    return report, folder


def arbor_contenders(served: ServingModel, config: DecodeConfig) -> tuple[list[Contender], list[dict]]:
    contenders, unavailable = [], []
    for mode in config.modes:
        name = f"arbor {mode}"
        try:
            runner = served.runner if mode == "none" else _mode_runner(served, mode, _draft_options(mode, config))
        except (ValueError, OSError) as error:  # DrafterError / CheckpointError are ValueErrors
            unavailable.append({"name": name, "reason": str(error).splitlines()[0]})
            continue
        run = _arbor_run(runner, served, config.temperature, config.structured())
        contenders.append(Contender(name, "arbor", run))
    return contenders, unavailable


def _draft_options(mode: str, config: DecodeConfig) -> DraftOptions:
    draft = {
        "auto": config.draft_mtp,
        "mtp": config.draft_mtp,
        "mtp-tree": config.draft_mtp,
        "dflash": config.draft_dflash,
        "tree": config.draft_dflash,
    }.get(mode)
    return DraftOptions(draft=draft)


def _mode_runner(served: ServingModel, mode: str, options: DraftOptions) -> ModelRunner:
    """A runner with `mode`'s drafter over the already loaded target (as load_serving_model builds it)."""
    drafter = load_drafter(mode, served.loaded, options)
    max_nodes = max(options.tree_budget, options.num_draft or 0, 16)
    runner = ModelRunner(served.loaded.decoder, served.loaded.checkpoint.eos_token_ids, drafter, None, max_nodes)
    runner.grammar_masks = served.runner.grammar_masks  # one tokenizer and grammar cache per model
    return runner


def _arbor_run(
    runner: ModelRunner, served: ServingModel, temperature: float, structured: StructuredOutput | None = None
):
    """A constrained answer ends where its grammar is complete (EOS is the only token left then)."""

    def run(prompt_ids: list[int], max_tokens: int, seed: int) -> PromptRun:
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            ignore_eos=structured is None,
            structured=structured,
        )
        started = time.perf_counter()
        result = generate(runner, served.tokenizer, prompt_ids, params, request_id="bench")
        stats = result.stats
        return PromptRun(
            result.token_ids,
            stats.generated_tokens,
            stats.decode_s,
            time.perf_counter() - started,
            stats.target_forwards,
            stats.drafts,
            stats.accepted_tokens,
            stats.draft_s,
            stats.verify_s,
        )

    return run


def transformers_contenders(served: ServingModel, config: DecodeConfig) -> tuple[list[Contender], list[dict]]:
    from ops.bench.hf_reference import load_reference

    names = [
        "transformers generate",
        f"transformers prompt lookup ({config.prompt_lookup_tokens})",
        "transformers assistant",
    ]
    try:
        reference = load_reference(config.model, config.dtype)
    except (ValueError, OSError, ImportError) as error:
        reason = f"transformers cannot load {config.model or served.name}: {str(error).splitlines()[0]}"
        return [], [{"name": name, "reason": reason} for name in names]
    pad_id = next(iter(served.loaded.checkpoint.eos_token_ids), 0)
    contenders = [
        Contender(names[0], "transformers", _hf_run(reference, config, pad_id)),
        Contender(
            names[1],
            "transformers",
            _hf_run(reference, config, pad_id, prompt_lookup_num_tokens=config.prompt_lookup_tokens),
        ),
    ]
    if config.assistant is None:
        return contenders, [{"name": names[2], "reason": _no_assistant_reason(served, config)}]
    assistant = load_reference(config.assistant, config.dtype)
    contenders.append(
        Contender(
            f"{names[2]} ({Path(config.assistant).name})",
            "transformers",
            _hf_run(reference, config, pad_id, assistant_model=assistant),
        )
    )
    return contenders, []


def _no_assistant_reason(served: ServingModel, config: DecodeConfig) -> str:
    smallest = " (SmolLM2-135M is already the smallest model of its family)" if config.model is None else ""
    return (
        f"no assistant model fits {served.name}: assisted generation needs a smaller model with the same "
        f"tokenizer and none is installed here{smallest}; pass --assistant PATH"
    )


def _hf_run(model, config: DecodeConfig, pad_id: int, **extra: object):
    from ops.bench.hf_reference import hf_generate

    def run(prompt_ids: list[int], max_tokens: int, seed: int) -> PromptRun:
        result = hf_generate(model, prompt_ids, max_tokens, config.temperature, seed, pad_id, **extra)
        return PromptRun(result.token_ids, result.num_decoded, result.decode_s, result.wall_s, result.num_forwards)

    return run


def _constraint_check(config: DecodeConfig, runs: list[PromptRun], served: ServingModel) -> dict | None:
    structured = config.structured()
    return None if structured is None else constraint_check(structured, runs, served)


def constraint_check(structured: StructuredOutput, runs: list[PromptRun], served: ServingModel) -> dict:
    """Constrained answers checked outside the engine (json.loads, and jsonschema for a schema),
    and what the constraint costs: reading the tokenizer and compiling the grammar on a fresh
    worker (its first request), and each row's mask, replayed over the answers."""
    import jsonschema

    eos_ids = served.loaded.checkpoint.eos_token_ids
    schema = json.loads(structured.spec) if structured.kind == "json_schema" else {"type": "object"}
    valid = 0
    for run in runs:
        ids = run.token_ids[:-1] if run.token_ids and run.token_ids[-1] in eos_ids else run.token_ids
        try:
            jsonschema.validate(json.loads(served.tokenizer.decode(ids)), schema)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    masks = GrammarMasks.for_model(served.loaded)
    started = time.perf_counter()
    masks.compile(StructuredOutput("regex", "a", "warm-up").check())  # reads the tokenizer
    tokenizer_s = time.perf_counter() - started
    started = time.perf_counter()
    masks.compile(structured.check())
    compile_s = time.perf_counter() - started
    mask_times, within = _replay(masks, structured, runs, frozenset(eos_ids))
    return {
        "num_prompts": len(runs),
        "within_grammar": within,
        "valid": valid,
        "first_request_tokenizer_ms": round(tokenizer_s * 1e3, 2),
        "first_request_compile_ms": round(compile_s * 1e3, 2),
        "mask_us_p50": round(statistics.median(mask_times) * 1e6, 1) if mask_times else None,
        "mask_us_p99": round(sorted(mask_times)[int(0.99 * (len(mask_times) - 1))] * 1e6, 1) if mask_times else None,
    }


def _replay(
    masks: GrammarMasks, structured: StructuredOutput, runs: list[PromptRun], stop_ids: frozenset[int]
) -> tuple[list[float], int]:
    """Every answer through a fresh constraint, row by row as the verifier asks: the seconds each
    row's mask took, and how many answers the grammar accepts to their last token."""
    times, within = [], 0
    for run in runs:
        constraint = GrammarConstraint(masks, masks.compile(structured.check()), stop_ids)
        try:
            for step in range(len(run.token_ids) + 1):
                started = time.perf_counter()
                constraint.mask(run.token_ids[:step], step)
                times.append(time.perf_counter() - started)
            within += 1
        except GrammarViolation:
            pass
    return times, within


def encode_prompt(served: ServingModel, text: str) -> list[int]:
    if served.template is None:
        return served.encode_text(text)
    return served.encode_chat([{"role": "user", "content": text}])


def run_interleaved(
    contenders: list[Contender], prompts: list[list[int]], config: DecodeConfig
) -> dict[str, list[PromptRun]]:
    """Prompt by prompt, every contender in turn, the order rotating so none always goes first."""
    runs: dict[str, list[PromptRun]] = {c.name: [] for c in contenders}
    total = len(contenders) * (len(prompts) + 1)
    with tqdm(total=total, desc="bench decode", unit="run", file=sys.stderr) as progress:
        for contender in contenders:
            progress.set_postfix_str(f"warm-up {contender.name}")
            contender.run(prompts[0], min(WARMUP_TOKENS, config.max_tokens), config.seed)
            progress.update()
        for index, prompt_ids in enumerate(prompts):
            shift = index % len(contenders)
            for contender in contenders[shift:] + contenders[:shift]:
                progress.set_postfix_str(f"prompt {index + 1}: {contender.name}")
                runs[contender.name].append(contender.run(prompt_ids, config.max_tokens, config.seed + index))
                progress.update()
    return runs


def build_report(
    config: DecodeConfig,
    served: ServingModel,
    contenders: list[Contender],
    runs: dict[str, list[PromptRun]],
    unavailable: list[dict],
    machine: dict,
) -> dict:
    summaries = [summarize(c.name, c.engine, runs[c.name]) for c in contenders]
    baseline = "arbor none" if "arbor none" in runs else summaries[0]["name"]
    add_ratios(summaries, baseline)
    arbor_runs = {c.name.removeprefix("arbor "): runs[c.name] for c in contenders if c.engine == "arbor"}
    reference = "none" if "none" in arbor_runs else next(iter(arbor_runs), None)
    report = {
        "benchmark": "decode",
        "timestamp": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine,
        "settings": {
            "model": served.name,
            "dtype": config.dtype,
            "threads": torch.get_num_threads(),
            "modes": config.modes,
            "num_prompts": config.num_prompts,
            "max_tokens": config.max_tokens,
            "temperature": config.temperature,
            "seed": config.seed,
            "prompt_lookup_num_tokens": config.prompt_lookup_tokens,
            "json_mode": config.json_mode,
            "json_schema": None if config.json_schema is None else config.json_schema.name,
        },
        "note": SIDE_BY_SIDE_NOTE,
        "baseline": baseline,
        "contenders": summaries,
        "unavailable": unavailable,
        "lossless": losslessness(arbor_runs, reference, config.temperature > 0) if reference else None,
        "transformers_agreement": None,
        "constraint_check": _constraint_check(config, arbor_runs[reference], served) if reference else None,
    }
    if config.temperature == 0 and reference is not None and "transformers generate" in runs:  # any arbor runs
        report["transformers_agreement"] = agreement_before_eos(
            arbor_runs[reference], runs["transformers generate"], served.loaded.checkpoint.eos_token_ids
        )
    return report
