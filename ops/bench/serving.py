"""`arbor bench serving`: the real stack under streaming clients, then in-process generate beside it.

Order of a run, on one stack (embedded Redis, gateway, the first worker count):
1. gateway + Redis vs in-process generate, in the first speculation mode: one client, sequential
   requests, the two paths alternating request by request (same model, mode, dtype and threads);
2. the concurrency sweep, lowest level first; with several speculation modes the modes take
   turns level by level, in alternating order (none mtp | mtp none | none mtp ...), the workers
   restarted in the next mode between them (Redis and the gateway stay up), so each level's
   modes are measured back to back and a drift in machine load falls on both;
3. scaling at the highest level, in the first mode: the other worker counts, then the first count
   again, so the baseline brackets them (A B A) and a drift in machine load shows up as A != A.

With --base-url only the sweep runs, against that server, with the same client.
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

from ops.bench.api_compare import compare_apis, parse_apis
from ops.bench.client import RequestRecord, SseClient, chat_body, latency_ms, run_level, stream_chat
from ops.bench.external_server import normalized_base_url, served_model
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
from ops.bench.serving_goals import with_goals
from ops.bench.serving_report import serving_markdown
from ops.bench.stack import Stack, raise_keyboard_interrupt_on_sigterm
from ops.training.prompts import HELD_OUT
from shared.settings import WorkerSettings

WARMUP_TOKENS = 8


@dataclass(slots=True, frozen=True)
class ServingConfig:
    worker_counts: list[int]
    concurrency: list[int]
    requests_per_level: int | None  # None: requests_per_stream × concurrency, else 2 × concurrency, at least 8
    requests_per_stream: int | None
    max_tokens: int
    temperature: float
    model: str | None
    speculation: list[str]  # empty with base_url: the server's own business
    draft: str | None
    compare_requests: int
    worker_threads: int | None
    dtype: str
    ready_timeout_s: float
    level_timeout_s: float
    out: str | None
    base_url: str | None = None  # a server already running: no stack, only the sweep
    ignore_eos: bool = True
    apis: tuple[str, ...] = ("chat",)  # more than chat: the same levels through each API (api_compare.py)

    def num_requests(self, concurrency: int) -> int:
        if self.requests_per_level:
            return self.requests_per_level
        if self.requests_per_stream:
            return self.requests_per_stream * concurrency
        return max(8, 2 * concurrency)


@dataclass(slots=True)
class Measured:
    """What a run measured, before the report: one `{"mode", "sweep"}` per speculation mode."""

    model_name: str
    modes: list[dict]
    comparison: dict | None = None
    scaling: list[dict] | None = None
    apis: dict | None = None  # api -> levels, where --api named more than chat


def run_serving_command(args: argparse.Namespace) -> int:
    report, folder = run_serving(config_from_args(args))
    print(serving_markdown(report))
    print(f"results: {folder}")
    return 0 if report["total_errors"] == 0 else 1


def config_from_args(args: argparse.Namespace) -> ServingConfig:
    counts = [count for count in (args.requests_per_level, args.requests_per_stream) if count is not None]
    if args.max_tokens < 1 or args.compare_requests < 0 or min(counts, default=1) < 1:
        raise ValueError(
            f"--max-tokens={args.max_tokens}, --requests-per-level={args.requests_per_level} and "
            f"--requests-per-stream={args.requests_per_stream} must be at least 1, "
            f"--compare-requests={args.compare_requests} at least 0"
        )
    if len(counts) == 2:
        raise ValueError("--requests-per-level and --requests-per-stream both set: choose one")
    if args.base_url and args.speculation:
        modes = ",".join(args.speculation)
        raise ValueError(f"--speculation={modes} is for the stack arbor starts: a --base-url server has its own")
    return ServingConfig(
        parse_int_list(args.workers, "--workers"),
        parse_int_list(args.concurrency, "--concurrency"),
        args.requests_per_level,
        args.requests_per_stream,
        args.max_tokens,
        args.temperature,
        args.model,
        [] if args.base_url else args.speculation or ["none"],
        args.draft,
        0 if args.base_url else args.compare_requests,
        args.worker_threads,
        args.dtype,
        args.ready_timeout,
        args.level_timeout,
        args.out,
        normalized_base_url(args.base_url) if args.base_url else None,
        args.ignore_eos or not args.base_url,  # the stack's workers always run to max_tokens
        tuple(parse_apis(args.api)),
    )


def run_serving(config: ServingConfig) -> tuple[dict, Path]:
    model_name = served_model(config.base_url, config.model) if config.base_url else None  # before any folder
    folder = results_dir(config.out)  # the processes' logs go here too
    machine = machine_info()
    with tqdm(total=_total_requests(config), desc="bench serving", unit="req", file=sys.stderr) as bar:
        measured = _run_against(config, model_name, bar) if model_name else _run_stack(config, folder, bar)
    report = build_report(config, machine, measured)
    write_json(folder / "serving.json", report)
    (folder / "serving.md").write_text(serving_markdown(report))
    serving_figure(report, folder / "serving.png")
    return report, folder


def _run_against(config: ServingConfig, model_name: str, bar: tqdm) -> Measured:
    """The sweep against a server already running (--base-url)."""
    assert config.base_url is not None
    bar.set_postfix_str(f"warming up {config.base_url}")
    _warm_up(config.base_url, model_name, 2, config)
    sweep = [_level(config.base_url, model_name, config, concurrency, bar) for concurrency in config.concurrency]
    return Measured(
        model_name, [{"mode": None, "sweep": sweep}], apis=_api_levels(config.base_url, model_name, config, bar)
    )


def _run_stack(config: ServingConfig, folder: Path, bar: tqdm) -> Measured:
    previous_handler = signal.getsignal(signal.SIGTERM)
    raise_keyboard_interrupt_on_sigterm()
    first_mode = config.speculation[0]
    stack = Stack(
        folder,
        config.model,
        first_mode,
        config.draft,
        config.dtype,
        config.worker_threads,
        config.ready_timeout_s,
        max(config.worker_counts),
    )
    try:
        with stack:
            bar.set_postfix_str(f"starting Redis, the gateway and {config.worker_counts[0]} worker(s)")
            stack.start(config.worker_counts[0])
            _warm_up(stack.base_url, stack.model_name, 2 * len(stack.workers), config)
            measured = Measured(stack.model_name, [])
            measured.comparison = compare_in_process(stack, config, bar) if config.compare_requests else None
            measured.modes = _interleaved_sweeps(stack, config, bar)
            measured.apis = _api_levels(stack.base_url, stack.model_name, config, bar)
            if len(config.worker_counts) > 1 and stack.speculation != first_mode:
                _switch_mode(stack, config, first_mode, bar)
            measured.scaling = run_scaling(stack, config, _top_level(measured.modes[0]["sweep"]), bar)
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
    return measured


def _interleaved_sweeps(stack: Stack, config: ServingConfig, bar: tqdm) -> list[dict]:
    """One sweep per mode, the modes taking turns at each level (module docstring, step 2)."""
    modes = list(config.speculation)
    sweeps: dict[str, list[dict]] = {mode: [] for mode in modes}
    for index, concurrency in enumerate(config.concurrency):
        for mode in modes if index % 2 == 0 else modes[::-1]:
            if stack.speculation != mode:
                _switch_mode(stack, config, mode, bar)
            level = _level(stack.base_url, stack.model_name, config, concurrency, bar)
            sweeps[mode].append({"workers": len(stack.workers), **level})
    return [{"mode": mode, "sweep": sweeps[mode]} for mode in modes]


def _api_levels(base_url: str, model_name: str, config: ServingConfig, bar: tqdm) -> dict | None:
    if len(config.apis) < 2:
        return None
    bar.set_postfix_str(f"apis {', '.join(config.apis)}")
    return compare_apis(
        base_url,
        model_name,
        list(config.apis),
        config.concurrency,
        config.num_requests,
        config.max_tokens,
        config.temperature,
        config.ignore_eos,
        config.level_timeout_s,
        lambda _: bar.update(),
    )


def _switch_mode(stack: Stack, config: ServingConfig, mode: str, bar: tqdm) -> None:
    bar.set_postfix_str(f"restarting the workers in {mode}")
    stack.restart_workers(mode)
    _warm_up(stack.base_url, stack.model_name, 2 * len(stack.workers), config)


def _top_level(sweep: list[dict]) -> dict:
    return max(sweep, key=lambda level: level["concurrency"])


def _total_requests(config: ServingConfig) -> int:
    top = max(config.concurrency)
    scaling_runs = len(config.worker_counts) if len(config.worker_counts) > 1 and not config.base_url else 0
    per_sweep = sum(config.num_requests(c) for c in config.concurrency)
    api_runs = len(config.apis) if len(config.apis) > 1 else 0
    return (
        2 * config.compare_requests
        + max(1, len(config.speculation)) * per_sweep
        + api_runs * per_sweep
        + scaling_runs * config.num_requests(top)
    )


def _bodies(model_name: str, config: ServingConfig, count: int, max_tokens: int | None = None) -> list[dict]:
    return [
        chat_body(
            model_name,
            HELD_OUT[i % len(HELD_OUT)],
            max_tokens or config.max_tokens,
            config.temperature,
            ignore_eos=config.ignore_eos,
        )
        for i in range(count)
    ]


def _level(base_url: str, model_name: str, config: ServingConfig, concurrency: int, bar: tqdm) -> dict:
    bar.set_postfix_str(f"{concurrency} stream(s)")
    bodies = _bodies(model_name, config, config.num_requests(concurrency))
    return asyncio.run(
        run_level(base_url, bodies, concurrency, config.level_timeout_s, config.level_timeout_s, lambda _: bar.update())
    )


def run_scaling(stack: Stack, config: ServingConfig, base_run: dict, bar: tqdm) -> list[dict]:
    """The sweep's top level (first worker count), each other count, then the first count again."""
    base = config.worker_counts[0]
    if len(config.worker_counts) < 2:
        return []
    top = max(config.concurrency)
    rows = [{**base_run, "label": "before"}]
    for count in config.worker_counts[1:]:
        _set_workers(stack, config, count, bar)
        rows.append(_scaling_row(stack, config, top, bar, ""))
    _set_workers(stack, config, base, bar)
    rows.append(_scaling_row(stack, config, top, bar, "after"))
    return rows


def _scaling_row(stack: Stack, config: ServingConfig, concurrency: int, bar: tqdm, label: str) -> dict:
    level = _level(stack.base_url, stack.model_name, config, concurrency, bar)
    return {"workers": len(stack.workers), **level, "label": label}


def _set_workers(stack: Stack, config: ServingConfig, count: int, bar: tqdm) -> None:
    bar.set_postfix_str(f"{len(stack.workers)} -> {count} worker(s)")
    if count > len(stack.workers):
        stack.add_workers(count - len(stack.workers))
        _warm_up(stack.base_url, stack.model_name, 2 * len(stack.workers), config)
    elif count < len(stack.workers):
        stack.remove_workers(len(stack.workers) - count)


def _warm_up(base_url: str, model_name: str, num_requests: int, config: ServingConfig) -> None:
    """A few short requests, not counted: the first through a fresh gateway and worker pay for set-up.

    Best effort for new workers: pulling is first come, first served, so one may take them all.
    """
    bodies = _bodies(model_name, config, num_requests, min(WARMUP_TOKENS, config.max_tokens))
    asyncio.run(run_level(base_url, bodies, len(bodies), config.level_timeout_s, config.level_timeout_s))


def compare_in_process(stack: Stack, config: ServingConfig, bar: tqdm) -> dict:
    """One client, sequential requests, alternating gateway and in-process generate.

    The figures and their command: docs/BENCHMARKS.md, "Gateway overhead on the tiny model"."""
    from ops.bench.decode import encode_prompt  # torch from here on
    from worker.drafters.registry import DraftOptions
    from worker.serving_model import load_serving_model

    bar.set_postfix_str("loading the model in process")
    options = DraftOptions(draft=Path(config.draft) if config.draft else None)
    served = load_serving_model(
        config.model, config.speculation[0], options, config.dtype, num_threads=config.worker_threads
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


def build_report(config: ServingConfig, machine: dict, measured: Measured) -> dict:
    scaling, comparison = measured.scaling or [], measured.comparison
    levels = [level for run in measured.modes for level in run["sweep"]] + scaling[1:]
    levels += [level for api_levels in (measured.apis or {}).values() for level in api_levels]
    errors = sum(level["errors"] for level in levels)
    errors += (comparison["gateway"]["errors"] + comparison["in_process"]["errors"]) if comparison else 0
    return {
        "benchmark": "serving",
        "timestamp": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine,
        "settings": _settings(config, measured.model_name),
        "note": SIDE_BY_SIDE_NOTE,
        "modes": with_goals(measured.modes),
        "comparison": comparison,
        "scaling": scaling,
        "scaling_speedup": scaling_speedup(scaling),
        "apis": measured.apis,
        "total_errors": errors,
    }


def _settings(config: ServingConfig, model_name: str) -> dict:
    load = {
        "model": model_name,
        "base_url": config.base_url,
        "concurrency": config.concurrency,
        "requests_per_level": {c: config.num_requests(c) for c in config.concurrency},
        "max_tokens": config.max_tokens,
        "ignore_eos": config.ignore_eos,
        "temperature": config.temperature,
    }
    if config.base_url:
        return load
    return {
        **load,
        "speculation": config.speculation,
        "dtype": config.dtype,
        "worker_counts": config.worker_counts,
        "max_lanes_per_worker": WorkerSettings().max_lanes,
        "prefill_cache": "off",
        "stream_interval": WorkerSettings().stream_interval,  # the workers inherit the environment
        "publish_interval_ms": WorkerSettings().publish_interval_ms,
        "publish_budget": WorkerSettings().publish_budget,
        "worker_threads": config.worker_threads or "torch default",
        "compare_requests": config.compare_requests,
    }


def scaling_speedup(rows: list[dict]) -> dict[str, float | None]:
    """Output tokens/s of each other worker count over the first count's (mean of before and after)."""
    if not rows:
        return {}
    base = [row["output_tokens_per_s"] or 0.0 for row in (rows[0], rows[-1])]
    return {str(row["workers"]): ratio(row["output_tokens_per_s"], sum(base) / 2) for row in rows[1:-1]}
