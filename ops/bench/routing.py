"""`arbor bench serving --scenario placement|priority`: the fleet's routing on the real stack.

placement: multi-turn conversations (each turn sends the whole conversation so far, the replies
    included), `--conversations` at a time, `--turns` each, on fresh workers in each arm:
        off     two workers, ARBOR_PLACEMENT=0 (first free worker takes each turn)
        on      two workers, prefix placement
        single  one worker (the hit rate placement aims for)
    Per arm: cluster-wide prefix hit rate (cached / prompt tokens, from each reply's usage), prefill
    tokens computed (prompt - cached), TTFT p50/p99 and tokens/s. The ratios on/off and on/single
    are the benchmark's goals (hit rate >= 90 % of single, TTFT p50 >= 1.5x better than off).
priority: one worker; TTFT of `--priority-requests` sequential priority-0 requests
        idle    nothing else running
        loaded  under `--load-streams` closed-loop priority-10 streams (long, EOS ignored)
        equal   the same load at priority 0 (what the requests see without classes)
    The goal: loaded TTFT within 2x of idle.

Every arm's workers start fresh (empty prefill caches); Redis stays up. Results: routing.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ops.bench.client import SseClient, StreamedResponse
from ops.bench.results import machine_info, percentile, results_dir, write_json
from ops.bench.stack import Stack, raise_keyboard_interrupt_on_sigterm
from ops.training.prompts import HELD_OUT

SYSTEM = "You are a helpful assistant. Answer clearly and keep to the point of the question."
FOLLOW_UP = "Tell me more about that, with one new detail."
LOAD_MAX_TOKENS = 256
LOAD_SETTLE_S = 2.0  # the priority-10 streams fill every lane before the measured requests start


@dataclass(slots=True, frozen=True)
class RoutingConfig:
    scenario: str  # placement | priority
    model: str | None
    draft: str | None
    speculation: str
    dtype: str
    worker_threads: int | None
    ready_timeout_s: float
    out: str | None
    max_tokens: int
    conversations: int
    turns: int
    priority_requests: int
    load_streams: int
    max_lanes: int
    request_timeout_s: float = 600.0


@dataclass(slots=True)
class Turn:
    ok: bool = False
    ttft_s: float | None = None
    e2e_s: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    text: str = ""
    error: str | None = None


def run_routing_command(args: argparse.Namespace) -> int:
    config = RoutingConfig(
        args.scenario,
        args.model,
        args.draft,
        (args.speculation or ["none"])[0],
        args.dtype,
        args.worker_threads,
        args.ready_timeout,
        args.out,
        args.max_tokens,
        args.conversations,
        args.turns,
        args.priority_requests,
        args.load_streams or 2 * args.max_lanes,
        args.max_lanes,
    )
    folder = results_dir(config.out)
    arms = _run(config, folder)
    report = {"scenario": config.scenario, "machine": machine_info(), "settings": _settings(config), "arms": arms}
    write_json(folder / "routing.json", report)
    print(json.dumps(arms, indent=2))
    print(f"results: {folder}")
    return 0 if all(arm["errors"] == 0 for arm in arms.values()) else 1


def _settings(config: RoutingConfig) -> dict:
    return {name: getattr(config, name) for name in RoutingConfig.__slots__}


def _run(config: RoutingConfig, folder: Path) -> dict[str, dict]:
    raise_keyboard_interrupt_on_sigterm()
    workers = 2 if config.scenario == "placement" else 1
    stack = Stack(
        folder,
        config.model,
        config.speculation,
        config.draft,
        config.dtype,
        config.worker_threads,
        config.ready_timeout_s,
        max_workers=workers,
        prefill_cache_bytes=None if config.scenario == "placement" else 0,
        worker_argv=("--max-lanes", str(config.max_lanes)),
    )
    with stack:
        stack.start(workers)
        if config.scenario == "placement":
            return _placement_arms(stack, config)
        return _priority_arms(stack, config)


def _placement_arms(stack: Stack, config: RoutingConfig) -> dict[str, dict]:
    arms: dict[str, dict] = {}
    for name, placement, workers in (("off", "0", 2), ("on", "1", 2), ("single", "1", 1)):
        stack.restart_gateway({"ARBOR_PLACEMENT": placement})
        stack.restart_workers(stack.speculation, workers, f"-{name}")
        print(f"placement arm {name}: {workers} worker(s), ARBOR_PLACEMENT={placement}", file=sys.stderr)
        arms[name] = asyncio.run(_conversations(stack, config))
    on, off, single = arms["on"], arms["off"], arms["single"]
    arms["ratios"] = {
        "errors": 0,
        "hit_rate_on_vs_single": _ratio(on["hit_rate"], single["hit_rate"]),
        "ttft_p50_off_vs_on": _ratio(off["ttft_ms"]["p50"], on["ttft_ms"]["p50"]),
        "prefill_tokens_on_vs_off": _ratio(on["prefill_tokens"], off["prefill_tokens"]),
    }
    return arms


async def _conversations(stack: Stack, config: RoutingConfig) -> dict:
    client = SseClient(stack.base_url, config.request_timeout_s)
    started = time.perf_counter()
    try:
        openers = [HELD_OUT[i % len(HELD_OUT)] for i in range(config.conversations)]
        runs = await asyncio.gather(*(_conversation(client, stack.model_name, opener, config) for opener in openers))
    finally:
        await client.aclose()
    turns = [turn for run in runs for turn in run]
    return _summary(turns, time.perf_counter() - started)


async def _conversation(client: SseClient, model: str, opener: str, config: RoutingConfig) -> list[Turn]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": opener}]
    turns = []
    for _ in range(config.turns):
        turn = await _chat(client, {"model": model, "messages": messages, "max_tokens": config.max_tokens})
        turns.append(turn)
        if not turn.ok:
            break
        messages += [{"role": "assistant", "content": turn.text}, {"role": "user", "content": FOLLOW_UP}]
    return turns


async def _chat(client: SseClient, body: dict) -> Turn:
    """One streamed chat request: TTFT, the reply's text, and its usage (cached tokens included)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}, "temperature": 0}
    turn, parts, started = Turn(), list[str](), time.perf_counter()
    try:
        async with asyncio.timeout(client.timeout_s), client.post("/v1/chat/completions", body) as response:
            if response.status != 200:
                turn.error = f"HTTP {response.status}: {(await response.read()).decode()[:200]}"
                return turn
            await _read_stream(response, turn, parts, started)
    except (OSError, EOFError, TimeoutError, ValueError) as error:
        turn.error = f"{type(error).__name__}: {error}"
    turn.e2e_s = time.perf_counter() - started
    turn.text = "".join(parts)
    turn.ok = turn.error is None and turn.completion_tokens > 0
    return turn


async def _read_stream(response: StreamedResponse, turn: Turn, parts: list[str], started: float) -> None:
    buffer = b""
    async for data in response.body():
        buffer += data
        *events, buffer = buffer.replace(b"\r\n", b"\n").split(b"\n\n")
        for event in events:
            line = event.removeprefix(b"data: ")
            if not line.startswith(b"{"):
                continue
            chunk = json.loads(line)
            if "error" in chunk:
                turn.error = str(chunk["error"])[:200]
                return
            for choice in chunk.get("choices", []):
                text = (choice.get("delta") or {}).get("content") or ""
                if text and turn.ttft_s is None:
                    turn.ttft_s = time.perf_counter() - started
                parts.append(text)
            usage = chunk.get("usage")
            if usage:
                turn.prompt_tokens, turn.completion_tokens = usage["prompt_tokens"], usage["completion_tokens"]
                turn.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def _priority_arms(stack: Stack, config: RoutingConfig) -> dict[str, dict]:
    arms = {"idle": asyncio.run(_urgent_requests(stack, config, load_priority=None))}
    arms["loaded"] = asyncio.run(_urgent_requests(stack, config, load_priority=10))
    stack.restart_workers(stack.speculation, 1, "-equal")  # fresh, so no leftover of the load remains
    arms["equal"] = asyncio.run(_urgent_requests(stack, config, load_priority=0))
    arms["ratios"] = {
        "errors": 0,
        "ttft_p50_loaded_vs_idle": _ratio(arms["loaded"]["ttft_ms"]["p50"], arms["idle"]["ttft_ms"]["p50"]),
        "ttft_p50_equal_vs_idle": _ratio(arms["equal"]["ttft_ms"]["p50"], arms["idle"]["ttft_ms"]["p50"]),
    }
    return arms


async def _urgent_requests(stack: Stack, config: RoutingConfig, load_priority: int | None) -> dict:
    """Sequential priority-0 requests, alone or beside closed-loop streams at `load_priority`."""
    client = SseClient(stack.base_url, config.request_timeout_s)
    stop = asyncio.Event()
    load = [] if load_priority is None else [_load_stream(client, stack, load_priority, stop)]
    loaders = [asyncio.create_task(stream) for stream in load * config.load_streams]
    try:
        if loaders:
            await asyncio.sleep(LOAD_SETTLE_S)
        started, turns = time.perf_counter(), []
        for index in range(config.priority_requests):
            body = _single_turn(stack.model_name, HELD_OUT[index % len(HELD_OUT)], config.max_tokens, priority=0)
            turns.append(await _chat(client, body))
        summary = _summary(turns, time.perf_counter() - started)
    finally:
        stop.set()
        for task in loaders:
            task.cancel()
        await asyncio.gather(*loaders, return_exceptions=True)
        await client.aclose()
    return summary


async def _load_stream(client: SseClient, stack: Stack, priority: int, stop: asyncio.Event) -> None:
    index = 0
    while not stop.is_set():
        body = _single_turn(stack.model_name, HELD_OUT[index % len(HELD_OUT)], LOAD_MAX_TOKENS, priority)
        await _chat(client, {**body, "ignore_eos": True})
        index += 1


def _single_turn(model: str, prompt: str, max_tokens: int, priority: int) -> dict:
    messages = [{"role": "user", "content": prompt}]
    return {"model": model, "messages": messages, "max_tokens": max_tokens, "priority": priority}


def _summary(turns: list[Turn], duration_s: float) -> dict:
    ok = [turn for turn in turns if turn.ok]
    prompt = sum(turn.prompt_tokens for turn in ok)
    cached = sum(turn.cached_tokens for turn in ok)
    ttfts = [turn.ttft_s * 1000 for turn in ok if turn.ttft_s is not None]
    return {
        "requests": len(turns),
        "errors": len(turns) - len(ok),
        "first_error": next((turn.error for turn in turns if not turn.ok), None),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "prefill_tokens": prompt - cached,
        "hit_rate": round(cached / prompt, 4) if prompt else None,
        "ttft_ms": {"p50": _round(percentile(ttfts, 50)), "p99": _round(percentile(ttfts, 99))},
        "tokens_per_s": round(sum(turn.completion_tokens for turn in ok) / duration_s, 2) if duration_s else None,
        "duration_s": round(duration_s, 2),
    }


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return round(numerator / denominator, 3) if numerator is not None and denominator else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
