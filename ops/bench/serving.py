"""`arbor bench serving`: the real stack under streaming clients, then in-process generate beside it.

Order of a run, on one stack (embedded Redis, gateway, the first worker count):
1. gateway + Redis vs in-process generate: one client, sequential requests, the two paths
   alternating request by request (same model, mode, dtype and threads);
2. the concurrency sweep, lowest level first;
3. scaling at the highest level: the other worker counts, then the first count again, so the
   baseline brackets them (A B A) and a drift in machine load shows up as A != A.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from ops.bench.client import RequestRecord, SseClient, chat_body, latency_ms, run_level, stream_chat
from ops.bench.machine_load import OtherLoad
from ops.bench.pairs import QUIET_CORES, is_quiet, pooled
from ops.bench.plots import serving_figure
from ops.bench.results import (
    SIDE_BY_SIDE_NOTE,
    machine_info,
    parse_int_list,
    percentile,
    ratio,
    results_dir,
    write_json,
)
from ops.bench.serving_report import serving_markdown
from ops.bench.stack import Stack, raise_keyboard_interrupt_on_sigterm
from ops.training.prompts import HELD_OUT
from shared.settings import WorkerSettings

WARMUP_TOKENS = 8


@dataclass(slots=True, frozen=True)
class ServingConfig:
    worker_counts: list[int]
    concurrency: list[int]
    requests_per_level: int | None  # None: 2 × concurrency, at least 8
    max_tokens: int
    temperature: float
    model: str | None
    speculation: str
    draft: str | None
    compare_requests: int
    worker_threads: int | None
    dtype: str
    ready_timeout_s: float
    level_timeout_s: float
    out: str | None

    def num_requests(self, concurrency: int) -> int:
        return self.requests_per_level or max(8, 2 * concurrency)


def run_serving_command(args: argparse.Namespace) -> int:
    report, folder = run_serving(config_from_args(args))
    print(serving_markdown(report))
    print(f"results: {folder}")
    return 0 if report["total_errors"] == 0 else 1


def config_from_args(args: argparse.Namespace) -> ServingConfig:
    if args.max_tokens < 1 or args.compare_requests < 0 or (args.requests_per_level or 1) < 1:
        raise ValueError(
            f"--max-tokens={args.max_tokens} and --requests-per-level={args.requests_per_level} must "
            f"be at least 1, --compare-requests={args.compare_requests} at least 0"
        )
    return ServingConfig(
        parse_int_list(args.workers, "--workers"),
        parse_int_list(args.concurrency, "--concurrency"),
        args.requests_per_level,
        args.max_tokens,
        args.temperature,
        args.model,
        args.speculation,
        args.draft,
        args.compare_requests,
        args.worker_threads,
        args.dtype,
        args.ready_timeout,
        args.level_timeout,
        args.out,
    )


def run_serving(config: ServingConfig) -> tuple[dict, Path]:
    folder = results_dir(config.out)  # the processes' logs go here too
    machine = machine_info()
    previous_handler = signal.getsignal(signal.SIGTERM)
    raise_keyboard_interrupt_on_sigterm()
    stack = Stack(
        folder,
        config.model,
        config.speculation,
        config.draft,
        config.dtype,
        config.worker_threads,
        config.ready_timeout_s,
        max(config.worker_counts),
    )
    try:
        with stack, tqdm(total=_total_requests(config), desc="bench serving", unit="req", file=sys.stderr) as bar:
            bar.set_postfix_str(f"starting Redis, the gateway and {config.worker_counts[0]} worker(s)")
            stack.start(config.worker_counts[0])
            _warm_up(stack, config)
            comparison = compare_in_process(stack, config, bar) if config.compare_requests else None
            sweep = [_level(stack, config, concurrency, bar) for concurrency in config.concurrency]
            scaling = run_scaling(stack, config, max(sweep, key=lambda level: level["concurrency"]), bar)
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
    report = build_report(config, stack.model_name, machine, sweep, comparison, scaling)
    write_json(folder / "serving.json", report)
    (folder / "serving.md").write_text(serving_markdown(report))
    serving_figure(report, folder / "serving.png")
    return report, folder


def _total_requests(config: ServingConfig) -> int:
    top = max(config.concurrency)
    scaling_runs = len(config.worker_counts) if len(config.worker_counts) > 1 else 0
    return (
        2 * config.compare_requests
        + sum(config.num_requests(c) for c in config.concurrency)
        + scaling_runs * config.num_requests(top)
    )


def _bodies(model_name: str, config: ServingConfig, count: int) -> list[dict]:
    return [
        chat_body(model_name, HELD_OUT[i % len(HELD_OUT)], config.max_tokens, config.temperature) for i in range(count)
    ]


def _level(stack: Stack, config: ServingConfig, concurrency: int, bar: tqdm) -> dict:
    bar.set_postfix_str(f"{len(stack.workers)} worker(s), {concurrency} client(s)")
    bodies = _bodies(stack.model_name, config, config.num_requests(concurrency))
    level = asyncio.run(
        run_level(
            stack.base_url, bodies, concurrency, config.level_timeout_s, config.level_timeout_s, lambda _: bar.update()
        )
    )
    return {"workers": len(stack.workers), **level}


def run_scaling(stack: Stack, config: ServingConfig, base_run: dict, bar: tqdm) -> list[dict]:
    """The sweep's top level (first worker count), each other count, then the first count again."""
    base = config.worker_counts[0]
    if len(config.worker_counts) < 2:
        return []
    top = max(config.concurrency)
    rows = [{**base_run, "label": "before"}]
    for count in config.worker_counts[1:]:
        _set_workers(stack, config, count, bar)
        rows.append({**_level(stack, config, top, bar), "label": ""})
    _set_workers(stack, config, base, bar)
    rows.append({**_level(stack, config, top, bar), "label": "after"})
    return rows


def _set_workers(stack: Stack, config: ServingConfig, count: int, bar: tqdm) -> None:
    bar.set_postfix_str(f"{len(stack.workers)} -> {count} worker(s)")
    if count > len(stack.workers):
        stack.add_workers(count - len(stack.workers))
        _warm_up(stack, config)
    elif count < len(stack.workers):
        stack.remove_workers(len(stack.workers) - count)


def _warm_up(stack: Stack, config: ServingConfig) -> None:
    """A few short requests, not counted: the first through a fresh gateway and worker pay for set-up.

    Best effort for new workers: pulling is first come, first served, so one may take them all.
    """
    bodies = [
        chat_body(stack.model_name, HELD_OUT[0], min(WARMUP_TOKENS, config.max_tokens), config.temperature)
        for _ in range(2 * len(stack.workers))
    ]
    asyncio.run(run_level(stack.base_url, bodies, len(bodies), config.level_timeout_s, config.level_timeout_s))


def compare_in_process(stack: Stack, config: ServingConfig, bar: tqdm) -> dict:
    """One client, sequential requests, alternating gateway and in-process generate.

    The figures and their command: docs/BENCHMARKS.md, "Gateway overhead on the tiny model"."""
    from ops.bench.decode import encode_prompt  # torch from here on
    from worker.drafters.registry import DraftOptions
    from worker.serving_model import load_serving_model

    bar.set_postfix_str("loading the model in process")
    options = DraftOptions(draft=Path(config.draft) if config.draft else None)
    served = load_serving_model(
        config.model, config.speculation, options, config.dtype, num_threads=config.worker_threads
    )
    in_process_request(served, encode_prompt, HELD_OUT[0], config, min(WARMUP_TOKENS, config.max_tokens))
    bodies = _bodies(stack.model_name, config, config.compare_requests)
    bar.set_postfix_str("gateway vs in-process, 1 client")
    gateway, local, other_cores = asyncio.run(_alternate(stack, served, encode_prompt, bodies, config, bar))
    del served
    gc.collect()
    return comparison_summary(gateway, local, other_cores)


async def _alternate(stack: Stack, served, encode_prompt, bodies: list[dict], config: ServingConfig, bar: tqdm):
    """Both paths per prompt, in turn, and the cores other processes took during each pair."""
    gateway: list[RequestRecord] = []
    local: list[RequestRecord] = []
    other_cores: list[float | None] = []
    load = OtherLoad(lambda: [os.getpid(), *stack.pids()])
    client = SseClient(stack.base_url, config.level_timeout_s)
    try:
        for index, body in enumerate(bodies):
            prompt = body["messages"][0]["content"]
            before = load.sample()
            for path in ("gateway", "local") if index % 2 == 0 else ("local", "gateway"):
                if path == "gateway":
                    gateway.append(await stream_chat(client, body))
                else:  # blocks the loop on purpose: nothing else is in flight
                    local.append(in_process_request(served, encode_prompt, prompt, config))
                bar.update()
            other_cores.append(load.cores_since(before))
    finally:
        await client.aclose()
    return gateway, local, other_cores


def in_process_request(
    served, encode_prompt, prompt: str, config: ServingConfig, max_tokens: int | None = None
) -> RequestRecord:
    """`generate`'s loop with the client's clocks: TTFT at the first text, gaps between texts."""
    from shared.sampling import SamplingParams
    from worker.engine.generate import PREFILL_CHUNK
    from worker.engine.text_output import TextOutput

    record = RequestRecord()
    started = time.perf_counter()
    prompt_ids = encode_prompt(served, prompt)
    params = SamplingParams(max_tokens=max_tokens or config.max_tokens, temperature=config.temperature, ignore_eos=True)
    sequence = served.runner.start("bench", prompt_ids, params)
    text_output = TextOutput(served.tokenizer, params.stop, prompt_ids)
    while sequence.num_to_prefill > 0:
        served.runner.prefill(sequence, PREFILL_CHUNK)
    while not sequence.finished:
        if text_output.add(served.runner.decode_step(sequence)):
            record.text_arrived(started)
    record.e2e_s = time.perf_counter() - started
    record.completion_tokens, record.ok = len(sequence.output_ids), True
    return record


def comparison_summary(
    gateway: list[RequestRecord], local: list[RequestRecord], other_cores: list[float | None] | None = None
) -> dict:
    """Tokens/s over end-to-end time (TTFT included: the headline figure), the same after the first
    text (the streaming rate, TTFT left to its own figure), and the TTFT p50 the gateway adds; both
    rates also request by request (`ops.bench.pairs`), over all pairs and over the quiet ones:
    those during which other processes took under QUIET_CORES of the machine (see
    `ops.bench.machine_load`; None where it cannot be measured)."""
    paths = {name: _path_summary(records) for name, records in (("gateway", gateway), ("in_process", local))}
    ttft = [paths[name]["ttft_ms"]["p50"] for name in ("gateway", "in_process")]
    pairs = _pairs(gateway, local, other_cores or [None] * len(gateway))
    measured = [pair["other_cores"] for pair in pairs if pair["other_cores"] is not None]
    quiet = [pair for pair in pairs if is_quiet(pair)]
    return {
        **paths,
        "requests": len(gateway),
        "tokens_per_s_ratio": ratio(paths["gateway"]["tokens_per_s"], paths["in_process"]["tokens_per_s"]),
        "decode_tokens_per_s_ratio": ratio(
            paths["gateway"]["decode_tokens_per_s"], paths["in_process"]["decode_tokens_per_s"]
        ),
        "added_ttft_p50_ms": None if None in ttft else round(ttft[0] - ttft[1], 2),
        "paired_ratio": pooled(pairs, "e2e"),
        "paired_decode_ratio": pooled(pairs, "tpot"),
        "other_load": {
            "quiet_below_cores": QUIET_CORES,
            "cores_p50": _rounded(percentile(measured, 50)),
            "cores_p90": _rounded(percentile(measured, 90)),
            "paired_ratio_quiet": pooled(quiet, "e2e") if measured else None,
            "paired_decode_ratio_quiet": pooled(quiet, "tpot") if measured else None,
        },
        "pairs": pairs,
    }


def _pairs(gateway: list[RequestRecord], local: list[RequestRecord], other_cores: list[float | None]) -> list[dict]:
    """Each pair's seconds and the others' cores: runs can then be pooled pair by pair."""

    def seconds(value: float | None) -> float | None:
        return None if value is None else round(value, 6)

    return [
        {
            "gateway_e2e_s": seconds(g.e2e_s) if g.ok else None,
            "gateway_tpot_s": seconds(g.tpot_s) if g.ok else None,
            "local_e2e_s": seconds(loc.e2e_s) if loc.ok else None,
            "local_tpot_s": seconds(loc.tpot_s) if loc.ok else None,
            "other_cores": _rounded(cores),
        }
        for g, loc, cores in zip(gateway, local, other_cores, strict=True)
    ]


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _path_summary(records: list[RequestRecord]) -> dict:
    ok = [record for record in records if record.ok]
    streamed = [r for r in ok if r.ttft_s is not None and r.completion_tokens > 1]
    return {
        "ok": len(ok),
        "errors": len(records) - len(ok),
        "tokens_per_s": ratio(sum(r.completion_tokens for r in ok), sum(r.e2e_s for r in ok)),
        "decode_tokens_per_s": ratio(
            sum(r.completion_tokens - 1 for r in streamed),
            sum(r.e2e_s - r.ttft_s for r in streamed if r.ttft_s is not None),
        ),
        "ttft_ms": latency_ms([r.ttft_s for r in ok if r.ttft_s is not None]),
        "e2e_ms": latency_ms([r.e2e_s for r in ok]),
    }


def build_report(
    config: ServingConfig,
    model_name: str,
    machine: dict,
    sweep: list[dict],
    comparison: dict | None,
    scaling: list[dict],
) -> dict:
    errors = sum(level["errors"] for level in sweep + scaling[1:])
    errors += (comparison["gateway"]["errors"] + comparison["in_process"]["errors"]) if comparison else 0
    return {
        "benchmark": "serving",
        "timestamp": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine,
        "settings": {
            "model": model_name,
            "speculation": config.speculation,
            "dtype": config.dtype,
            "worker_counts": config.worker_counts,
            "concurrency": config.concurrency,
            "requests_per_level": {c: config.num_requests(c) for c in config.concurrency},
            "max_tokens": config.max_tokens,
            "temperature": config.temperature,
            "max_lanes_per_worker": WorkerSettings().max_lanes,
            "prefill_cache": "off",
            "stream_interval": WorkerSettings().stream_interval,  # the workers inherit the environment
            "publish_interval_ms": WorkerSettings().publish_interval_ms,
            "publish_budget": WorkerSettings().publish_budget,
            "worker_threads": config.worker_threads or "torch default",
            "compare_requests": config.compare_requests,
        },
        "note": SIDE_BY_SIDE_NOTE,
        "sweep": sweep,
        "comparison": comparison,
        "scaling": scaling,
        "scaling_speedup": scaling_speedup(scaling),
        "total_errors": errors,
    }


def scaling_speedup(rows: list[dict]) -> dict[str, float | None]:
    """Output tokens/s of each other worker count over the first count's (mean of before and after)."""
    if not rows:
        return {}
    base = [row["output_tokens_per_s"] or 0.0 for row in (rows[0], rows[-1])]
    return {str(row["workers"]): ratio(row["output_tokens_per_s"], sum(base) / 2) for row in rows[1:-1]}
