"""`arbor bench serving --api chat,messages,responses`: the same load through each API, level by
level, the APIs taking turns (alternating order), so each API's cost in the gateway is read
against chat completions' in one run. Every API enqueues the same job; what differs is the
gateway's translation of the request and of every streamed event. Torch-free.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ops.bench.api_shapes import APIS, request_body
from ops.bench.client import run_level
from ops.bench.results import fmt
from ops.training.prompts import HELD_OUT


def parse_apis(text: str) -> list[str]:
    apis = [api.strip() for api in text.split(",") if api.strip()]
    if not apis or any(api not in APIS for api in apis) or len(set(apis)) < len(apis):
        raise ValueError(f"--api={text!r}: choose from {','.join(APIS)}, each once")
    return apis


def compare_apis(
    base_url: str,
    model_name: str,
    apis: list[str],
    levels: list[int],
    num_requests: Callable[[int], int],
    max_tokens: int,
    temperature: float,
    ignore_eos: bool,
    timeout_s: float,
    on_done: Callable[[object], None] = lambda _: None,
) -> dict:
    """{api: [level, ...]} with run_level's summaries, each level's APIs back to back."""
    results: dict[str, list[dict]] = {api: [] for api in apis}
    for index, concurrency in enumerate(levels):
        for api in apis if index % 2 == 0 else apis[::-1]:
            bodies = [
                request_body(api, model_name, HELD_OUT[i % len(HELD_OUT)], max_tokens, temperature, ignore_eos)
                for i in range(num_requests(concurrency))
            ]
            level = asyncio.run(run_level(base_url, bodies, concurrency, timeout_s, timeout_s, on_done, api))
            results[api].append(level)
    return results


def apis_markdown(results: dict[str, list[dict]]) -> list[str]:
    if not results or len(results) < 2:
        return []
    rows = []
    chat = results.get("chat", [])
    for api, levels in results.items():
        for index, level in enumerate(levels):
            base = chat[index] if index < len(chat) else None  # the level run beside it
            share = level["output_tokens_per_s"] / base["output_tokens_per_s"] if base and base["ok"] else None
            rows.append(
                [
                    api,
                    level["concurrency"],
                    level["errors"],
                    fmt(level["output_tokens_per_s"]),
                    "" if share is None else f"{share:.3f}x",
                    fmt(level["ttft_ms"].get("p50")),
                    fmt(level["itl_ms"].get("p50")),
                ]
            )
    header = ["api", "streams", "errors", "output tok/s", "vs chat", "TTFT p50", "ITL p50"]
    lines = ["## The same load through each API (taking turns level by level)", ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return [*lines, ""]
