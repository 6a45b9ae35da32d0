"""`arbor bench agent --recorded NAME`: a recorded agent conversation (agent_recorded.py) replayed
turn by turn through `/v1/messages` and, translated, through `/v1/chat/completions`, per
speculation mode, on the real stack (embedded Redis, the gateway, one worker with its prefill
cache on, as `arbor up` runs it).

Order of a run (`replay_order`): `repeats` rounds; in each, every mode in turn and, within a mode,
both APIs in turn, the orders alternating, so a drift in machine load falls on all alike. Before
every replay the worker is restarted in its mode: every replay starts from an empty prefill
cache, so its turn 1 is cold, and what its turns 2+ find in the cache is what its own earlier
turns left (the other API's replay of the same prompts never warms it). One conversation at a
time: the figures are a single agent's.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from ops.bench.agent import warm_up
from ops.bench.agent_recorded import APIS, RecordedConversation, TurnSettings, load_recording
from ops.bench.agent_recorded_client import stream_turn
from ops.bench.agent_recorded_report import recorded_markdown, summarize_api, turn_figures
from ops.bench.client import SseClient
from ops.bench.results import machine_info, results_dir, write_json
from ops.bench.stack import Stack, raise_keyboard_interrupt_on_sigterm


@dataclass(slots=True, frozen=True)
class RecordedConfig:
    recording: RecordedConversation
    modes: list[str]
    repeats: int
    max_tokens: int
    temperature: float
    model: str | None
    draft: str | None
    dtype: str
    worker_threads: int | None
    ready_timeout_s: float
    run_timeout_s: float
    out: str | None


def run_recorded_command(args: argparse.Namespace) -> int:
    report, folder = run_recorded(recorded_config_from_args(args))
    print(recorded_markdown(report))
    print(f"results: {folder}")
    return 0 if report["total_errors"] == 0 else 1


def recorded_config_from_args(args: argparse.Namespace) -> RecordedConfig:
    if args.repeats < 1 or args.max_tokens < 1:
        raise ValueError(f"--repeats={args.repeats} and --max-tokens={args.max_tokens} must be at least 1")
    return RecordedConfig(
        load_recording(args.recorded),
        args.speculation or ["none", "auto"],
        args.repeats,
        args.max_tokens,
        args.temperature,
        args.model,
        args.draft,
        args.dtype,
        args.worker_threads,
        args.ready_timeout,
        args.run_timeout,
        args.out,
    )


def run_recorded(config: RecordedConfig) -> tuple[dict, Path]:
    folder = results_dir(config.out)  # the processes' logs go here too
    machine = machine_info()
    total = config.repeats * len(config.modes) * len(APIS)
    with tqdm(total=total, desc="bench agent --recorded", unit="replay", file=sys.stderr) as bar:
        model_name, replays = _run_stack(config, folder, bar)
    report = build_report(config, machine, model_name, replays)
    write_json(folder / "agent-recorded.json", report)
    (folder / "agent-recorded.md").write_text(recorded_markdown(report))
    return report, folder


Replays = dict[tuple[str, str], list[list[dict]]]  # (mode, api) -> each replay's turn figures


def _run_stack(config: RecordedConfig, folder: Path, bar: tqdm) -> tuple[str, Replays]:
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
        prefill_cache_bytes=None,  # on, as served: it is what turns 2+ are measured against
    )
    replays: Replays = {(mode, api): [] for mode in config.modes for api in APIS}
    try:
        with stack:
            bar.set_postfix_str("starting Redis, the gateway and the worker")
            stack.start(1)
            for number, (round_index, mode, api) in enumerate(replay_order(config.modes, config.repeats), 1):
                if number > 1 or stack.speculation != mode:  # the first finds the worker just started
                    bar.set_postfix_str(f"restarting the worker in {mode}: an empty prefill cache")
                    stack.restart_workers(mode, log_suffix=f"-{number}-{mode}")
                warm_up(stack.base_url, stack.model_name, config.temperature, config.run_timeout_s)
                bar.set_postfix_str(f"{mode}, {api}, round {round_index + 1}")
                replays[(mode, api)].append(_replay(stack.base_url, stack.model_name, config, api))
                bar.update()
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
    return stack.model_name, replays


def replay_order(modes: list[str], repeats: int) -> list[tuple[int, str, str]]:
    """(round, mode, api) of every replay: each round runs every mode, the modes' order reversed
    round by round, and within a mode both APIs, which goes first alternating mode by mode, e.g.
    none,auto: none messages, none chat, auto chat, auto messages | auto messages, auto chat,
    none chat, none messages."""
    order = []
    for round_index in range(repeats):
        for mode_index, mode in enumerate(modes if round_index % 2 == 0 else modes[::-1]):
            pair_index = round_index * len(modes) + mode_index
            order += [(round_index, mode, api) for api in (APIS if pair_index % 2 == 0 else APIS[::-1])]
    return order


def _replay(base_url: str, model_name: str, config: RecordedConfig, api: str) -> list[dict]:
    settings = TurnSettings(model_name, config.max_tokens, config.temperature)
    return asyncio.run(replay_turns(base_url, config.recording, api, settings, config.run_timeout_s))


async def replay_turns(
    base_url: str, recording: RecordedConversation, api: str, settings: TurnSettings, timeout_s: float
) -> list[dict]:
    """The recording's turns in order through `api`; a failed turn ends the replay, and so does
    `timeout_s` (the turns not run count as errors: agent_recorded_report.py)."""
    client = SseClient(base_url, timeout_s)
    body_of = recording.messages_body if api == "messages" else recording.chat_body
    figures: list[dict] = []
    try:
        async with asyncio.timeout(timeout_s):
            for turn in range(len(recording.bodies)):
                figures.append(turn_figures(await stream_turn(client, api, body_of(turn, settings), turn)))
                if not figures[-1]["ok"]:
                    break
    except TimeoutError:
        pass
    finally:
        await client.aclose()
    return figures


def build_report(config: RecordedConfig, machine: dict, model_name: str, replays: Replays) -> dict:
    num_turns = len(config.recording.bodies)
    apis = {mode: [summarize_api(api, replays[(mode, api)], num_turns) for api in APIS] for mode in config.modes}
    modes = [{"mode": mode, "apis": apis[mode]} for mode in config.modes]
    return {
        "benchmark": "agent-recorded",
        "timestamp": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine,
        "settings": {
            "model": model_name,
            "recording": config.recording.name,
            "source": config.recording.source,
            "turns": num_turns,
            "speculation": config.modes,
            "repeats": config.repeats,
            "max_tokens": config.max_tokens,
            "temperature": config.temperature,
            "dtype": config.dtype,
            "worker_threads": config.worker_threads or "torch default",
            "prefill_cache": "on (the worker's default size), emptied before every replay",
        },
        "modes": modes,
        "total_errors": sum(api["errors"] for summaries in apis.values() for api in summaries),
    }
