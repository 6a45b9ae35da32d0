"""`arbor bench agent`: multi-turn agent workloads (agent_workloads.py) replayed through the real
stack, per speculation mode, at each stream count.

Order of a run, on one stack (embedded Redis, the gateway, one worker with its prefill cache on,
as `arbor up` runs it): for each stream count, lowest first, every mode in turn, in alternating
order (none mtp | mtp none | ...), so a drift in machine load falls on every mode alike. Before
each (mode, streams) run the worker is restarted in that mode, so every run starts from an empty
prefill cache: the cache hits a run reports are its own conversations'. At S streams, S clients
each replay whole conversations one after another (closed loop), `conversations_per_stream` × S
of them; conversation i is the same in every run (same seed), so the runs replay the same work.

Figures per run: output tokens/s over the run's wall time, TTFT and inter-token latency (p50,
p99), tokens per target forward and acceptance (from each turn's `usage.speculation`: the
worker's own counts), prompt tokens served from the prefill cache (`cached_tokens`), and the same
per workload.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from ops.bench.agent_client import TurnResult, replay
from ops.bench.agent_report import agent_markdown
from ops.bench.agent_summary import summarize_run
from ops.bench.agent_workloads import WORKLOADS, Conversation, WorkloadSizes, conversations
from ops.bench.client import SseClient, chat_body, run_level
from ops.bench.results import machine_info, parse_int_list, results_dir, write_json
from ops.bench.stack import Stack, raise_keyboard_interrupt_on_sigterm
from ops.training.prompts import HELD_OUT

WARMUP_REQUESTS, WARMUP_TOKENS = 2, 8


@dataclass(slots=True, frozen=True)
class AgentConfig:
    modes: list[str]
    streams: list[int]
    conversations_per_stream: int
    workloads: list[str]
    seed: int
    sizes: WorkloadSizes
    temperature: float
    model: str | None
    draft: str | None
    dtype: str
    worker_threads: int | None
    ready_timeout_s: float
    run_timeout_s: float
    out: str | None


def run_agent_command(args: argparse.Namespace) -> int:
    report, folder = run_agent(config_from_args(args))
    print(agent_markdown(report))
    print(f"results: {folder}")
    return 0 if report["total_errors"] == 0 else 1


def config_from_args(args: argparse.Namespace) -> AgentConfig:
    workloads = [name.strip() for name in args.workloads.split(",") if name.strip()]
    if not workloads or any(name not in WORKLOADS for name in workloads):
        raise ValueError(f"--workloads={args.workloads!r}: choose from {','.join(WORKLOADS)}")
    sizes = WorkloadSizes(args.call_tokens, args.answer_tokens, args.extract_tokens, args.records, args.file_chars)
    if min(asdict(sizes).values()) < 1 or args.conversations_per_stream < 1:
        raise ValueError(
            "--call-tokens, --answer-tokens, --extract-tokens, --records, --file-chars and "
            "--conversations-per-stream must be at least 1"
        )
    return AgentConfig(
        args.speculation or ["none", "auto"],
        parse_int_list(args.streams, "--streams"),
        args.conversations_per_stream,
        workloads,
        args.seed,
        sizes,
        args.temperature,
        args.model,
        args.draft,
        args.dtype,
        args.worker_threads,
        args.ready_timeout,
        args.run_timeout,
        args.out,
    )


def run_agent(config: AgentConfig) -> tuple[dict, Path]:
    folder = results_dir(config.out)  # the processes' logs go here too
    machine = machine_info()
    total = sum(config.conversations_per_stream * streams for streams in config.streams) * len(config.modes)
    with tqdm(total=total, desc="bench agent", unit="conversation", file=sys.stderr) as bar:
        model_name, runs = _run_stack(config, folder, bar)
    report = build_report(config, machine, model_name, runs)
    write_json(folder / "agent.json", report)
    (folder / "agent.md").write_text(agent_markdown(report))
    return report, folder


def _run_stack(config: AgentConfig, folder: Path, bar: tqdm) -> tuple[str, dict[str, list[dict]]]:
    previous_handler = signal.getsignal(signal.SIGTERM)
    raise_keyboard_interrupt_on_sigterm()
    stack = Stack(
        folder,
        config.model,
        config.modes[0],
        config.draft,
        config.dtype,
        config.worker_threads,
        config.ready_timeout_s,
        prefill_cache_bytes=None,  # on, as served: agents' histories are what it is for
    )
    runs: dict[str, list[dict]] = {mode: [] for mode in config.modes}
    try:
        with stack:
            bar.set_postfix_str("starting Redis, the gateway and the worker")
            stack.start(1)
            fresh = True  # the worker just started: its cache is empty
            for index, streams in enumerate(config.streams):
                for mode in config.modes if index % 2 == 0 else config.modes[::-1]:
                    if not (fresh and stack.speculation == mode):
                        bar.set_postfix_str(f"restarting the worker in {mode}")
                        stack.restart_workers(mode)
                    fresh = False
                    warm_up(stack.base_url, stack.model_name, config.temperature, config.run_timeout_s)
                    bar.set_postfix_str(f"{mode}, {streams} stream(s)")
                    runs[mode].append(_run(stack.base_url, stack.model_name, config, streams, bar.update))
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
    return stack.model_name, runs


def warm_up(base_url: str, model_name: str, temperature: float, timeout_s: float) -> None:
    """Short held-out prompts, not counted: the first requests through a fresh worker pay for set-up.
    They share no prefix with the workloads' conversations, so they leave no cache hits for them."""
    bodies = [chat_body(model_name, HELD_OUT[i], WARMUP_TOKENS, temperature) for i in range(WARMUP_REQUESTS)]
    asyncio.run(run_level(base_url, bodies, 1, timeout_s, timeout_s))


def _run(base_url: str, model_name: str, config: AgentConfig, streams: int, on_done: Callable[[], object]) -> dict:
    work = conversations(config.workloads, config.conversations_per_stream * streams, config.seed, config.sizes)
    results, duration_s = asyncio.run(
        replay_all(base_url, model_name, work, streams, config.temperature, config.run_timeout_s, on_done)
    )
    return summarize_run(streams, results, len(work), duration_s)


async def replay_all(
    base_url: str,
    model_name: str,
    work: list[Conversation],
    streams: int,
    temperature: float,
    timeout_s: float,
    on_done: Callable[[], object] = lambda: None,
) -> tuple[list[list[TurnResult]], float]:
    """Each conversation replayed by one of `streams` clients (closed loop); stops after `timeout_s`."""
    finished: list[list[TurnResult]] = []
    pending = iter(work)
    client = SseClient(base_url, timeout_s)

    async def client_loop() -> None:
        for conversation in pending:  # a shared iterator: each conversation goes to exactly one client
            finished.append(await replay(client, model_name, conversation, temperature))
            on_done()

    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.gather(*(client_loop() for _ in range(streams)))
    except TimeoutError:
        pass  # the conversations not finished count as errors (summarize_run)
    finally:
        await client.aclose()
    return finished, time.perf_counter() - started


def build_report(config: AgentConfig, machine: dict, model_name: str, runs: dict[str, list[dict]]) -> dict:
    modes: list[dict] = [{"mode": mode, "runs": runs[mode]} for mode in config.modes]
    return {
        "benchmark": "agent",
        "timestamp": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine,
        "settings": {
            "model": model_name,
            "speculation": config.modes,
            "streams": config.streams,
            "conversations_per_stream": config.conversations_per_stream,
            "workloads": config.workloads,
            "seed": config.seed,
            "sizes": asdict(config.sizes),
            "temperature": config.temperature,
            "dtype": config.dtype,
            "worker_threads": config.worker_threads or "torch default",
            "prefill_cache": "on (the worker's default size), emptied before each run",
        },
        "modes": modes,
        "over_none": over_none(modes),
        "total_errors": sum(run["errors"] for mode in modes for run in mode["runs"]),
    }


def over_none(modes: list[dict]) -> dict[str, dict[str, float | None]]:
    """Output tokens/s of each mode ÷ `none`'s at the same stream count, where `none` ran."""
    none = next((mode for mode in modes if mode["mode"] == "none"), None)
    if none is None:
        return {}
    base = {run["concurrency"]: run["output_tokens_per_s"] for run in none["runs"]}
    return {
        mode["mode"]: {
            str(run["concurrency"]): _ratio(run["output_tokens_per_s"], base.get(run["concurrency"]))
            for run in mode["runs"]
        }
        for mode in modes
        if mode["mode"] != "none"
    }


def _ratio(value: float | None, base: float | None) -> float | None:
    return round(value / base, 3) if value is not None and base else None
