"""`arbor bench decode|serving|agent|owner|pool|numerics|kernels|context|failover|quality`: the parsers.

Torch-free, so `arbor` builds its parser without torch."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import get_args

from shared.settings import DEFAULT_PUBLISH_BUDGET, Speculation

SPECULATION_MODES = get_args(Speculation)


def add_bench_parser(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="benchmarks: decode speed per mode, the served stack under load")
    commands = parser.add_subparsers(dest="bench_command", required=True)
    _add_decode_parser(commands)
    _add_serving_parser(commands)
    _add_agent_parser(commands)
    _add_owner_parser(commands)
    _add_pool_parser(commands)
    _add_numerics_parser(commands)
    _add_kernels_parser(commands)
    _add_failover_parser(commands)
    _add_quality_parser(commands)
    _add_context_parser(commands)


def _add_failover_parser(commands) -> None:
    from ops.bench import failover

    parser = commands.add_parser("failover", help="the stack on a Redis Sentinel set through N failovers")
    failover.add_arguments(parser)
    parser.set_defaults(handler=failover.run_from_args)


def _add_context_parser(commands) -> None:
    from ops.bench.context import add_context_parser

    add_context_parser(commands)


def _add_decode_parser(commands) -> None:
    parser = commands.add_parser("decode", help="decode tokens/s per speculation mode vs transformers, in process")
    parser.add_argument(
        "--modes",
        type=_modes,
        default=["none", "auto", "mtp", "dflash", "tree", "ngram", "suffix"],
        help="comma-separated speculation modes (default: none,auto,mtp,dflash,tree,ngram,suffix)",
    )
    parser.add_argument("--prompts", type=int, default=8, help="held-out prompts to decode (1..12, default 8)")
    parser.add_argument("--max-tokens", type=int, default=128, help="new tokens per prompt, EOS ignored")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed of the first prompt (+1 per prompt)")
    parser.add_argument("--model", default=None, help="HF folder or .gguf (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--draft-mtp", type=Path, default=None, help="MTP head for mode mtp")
    parser.add_argument("--draft-dflash", type=Path, default=None, help="DFlash drafter for modes dflash and tree")
    parser.add_argument("--assistant", default=None, help="assistant model for transformers' assisted generation")
    parser.add_argument(
        "--prompt-lookup-tokens",
        type=int,
        default=3,
        help="transformers' prompt_lookup_num_tokens (default 3, Arbor ngram's chain length)",
    )
    parser.add_argument("--no-transformers", action="store_true", help="skip the transformers contenders")
    parser.add_argument(
        "--json-mode",
        action="store_true",
        help="response_format json_object for every Arbor mode (EOS ends each answer), beside "
        "plain decoding of unconstrained text; no transformers",
    )
    parser.add_argument(
        "--json-schema",
        type=Path,
        default=None,
        help="a JSON schema file: every Arbor mode constrained by it, as --json-mode is by json_object",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument(
        "--formats",
        default=None,
        help="comma-separated weight formats to run every mode in, side by side (float32, float64, bfloat16, "
        "int8, int4, auto); the report adds each format's step cost at 1-16 rows and its greedy agreement "
        "with the first; --dtype is then unused",
    )
    _add_common(parser)
    parser.set_defaults(handler=_run_decode)


def _add_serving_parser(commands) -> None:
    parser = commands.add_parser(
        "serving", help="streaming clients against the real stack (Redis, gateway, workers) or any OpenAI server"
    )
    parser.add_argument(
        "--base-url",
        default=None,
        help="an OpenAI-compatible server already running (vLLM, llama-server, Arbor), e.g. http://127.0.0.1:8080: "
        "only the concurrency sweep, no stack started, no in-process comparison, no worker scaling",
    )
    parser.add_argument(
        "--workers",
        default="1,2",
        help="worker counts: the first serves the sweep, "
        "the others are compared with it at the highest concurrency (default 1,2)",
    )
    parser.add_argument(
        "--concurrency", default="1,4,8,16,32", help="concurrent streams per level (default 1,4,8,16,32)"
    )
    parser.add_argument(
        "--requests-per-level", type=int, default=None, help="requests per level (default: 2 × concurrency, at least 8)"
    )
    parser.add_argument(
        "--requests-per-stream",
        type=int,
        default=None,
        help="requests per stream: each level sends concurrency × this many (instead of --requests-per-level)",
    )
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per request (EOS ignored on the stack)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument(
        "--model",
        default=None,
        help="HF folder or .gguf (default: SmolLM2-135M-Instruct); with --base-url, the served name "
        "(default: the first id of GET /v1/models)",
    )
    parser.add_argument(
        "--ignore-eos",
        action="store_true",
        help="with --base-url: send ignore_eos: true (vLLM and llama-server accept it), so every request "
        "runs to --max-tokens; the stack's workers always get it",
    )
    parser.add_argument(
        "--speculation",
        type=_speculation_modes,
        default=None,
        help="the workers' modes, comma-separated: the sweep runs in each, the workers restarted between "
        "them (default none)",
    )
    parser.add_argument("--draft", default=None, help="drafter checkpoint for mtp, dflash or tree")
    parser.add_argument(
        "--api",
        default="chat",
        help="APIs to send the load through, comma-separated (chat, messages, responses): with more than "
        "chat, every level also runs through each, taking turns, compared with chat (default chat)",
    )
    parser.add_argument(
        "--compare-requests",
        type=int,
        default=6,
        help="sequential requests for gateway vs in-process generate (0 skips it; default 6)",
    )
    parser.add_argument(
        "--worker-threads",
        type=int,
        default=None,
        help="torch threads per worker and in process (OMP_NUM_THREADS; default: torch's choice)",
    )
    parser.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for workers to load")
    parser.add_argument("--level-timeout", type=float, default=900.0, help="seconds one load level may take")
    _add_routing_options(parser)
    _add_common(parser)
    parser.set_defaults(handler=_run_serving)


def _add_agent_parser(commands) -> None:
    parser = commands.add_parser(
        "agent", help="multi-turn agent workloads (tool calls, JSON extraction, code edits) per speculation mode"
    )
    parser.add_argument(
        "--speculation", type=_speculation_modes, default=["none", "auto"], help="modes, comma-separated (none,auto)"
    )
    parser.add_argument("--streams", default="1,16", help="concurrent conversations per run (default 1,16)")
    parser.add_argument(
        "--conversations-per-stream", type=int, default=3, help="conversations each stream replays (default 3)"
    )
    parser.add_argument("--workloads", default="tools,extract,code", help="which, comma-separated (all three)")
    parser.add_argument("--seed", type=int, default=0, help="the workloads' seed (default 0)")
    parser.add_argument("--call-tokens", type=int, default=192, help="max_tokens of a forced tool call")
    parser.add_argument("--answer-tokens", type=int, default=96, help="max_tokens of a text answer")
    parser.add_argument("--extract-tokens", type=int, default=160, help="max_tokens of a JSON answer")
    parser.add_argument("--records", type=int, default=6, help="records (user turns) per extraction conversation")
    parser.add_argument("--file-chars", type=int, default=1500, help="characters of each standard-library excerpt")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy: every mode replays the same")
    parser.add_argument("--model", default=None, help="HF folder or .gguf (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--draft", default=None, help="drafter checkpoint for mtp, dflash or tree")
    parser.add_argument("--worker-threads", type=int, default=None, help="torch threads of the worker")
    parser.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for the worker to load")
    parser.add_argument(
        "--run-timeout", type=float, default=1800.0, help="seconds one (mode, streams) run or one replay may take"
    )
    _add_recorded_options(parser)
    _add_common(parser)
    parser.set_defaults(handler=_run_agent)


def _add_recorded_options(parser) -> None:
    from ops.bench.agent_recorded import RECORDINGS

    group = parser.add_argument_group("a recorded conversation (ops/bench/agent_recorded.py)")
    group.add_argument(
        "--recorded",
        default=None,
        metavar="NAME|FOLDER",
        help=f"replay a recorded agent conversation instead of the workloads: {', '.join(RECORDINGS)} (Claude Code's "
        "4 turns, a ~4,200-token system prompt, 12 tools) or a folder of NN-messages.json records; each turn "
        "through /v1/messages and the same turn translated to /v1/chat/completions, one conversation at a "
        "time, the prefill cache emptied before every replay: TTFT of cold turn 1 against warm turns 2+, "
        "cached and prompt tokens per turn, decode tokens/s (--streams, --workloads and the sizes do not apply)",
    )
    group.add_argument("--repeats", type=int, default=3, help="with --recorded: replays per API and mode")
    group.add_argument(
        "--max-tokens", type=int, default=128, help="with --recorded: tokens each turn decodes, EOS ignored"
    )


def _add_routing_options(parser) -> None:
    group = parser.add_argument_group("routing scenarios (ops/bench/routing.py)")
    group.add_argument(
        "--scenario",
        choices=("sweep", "placement", "priority"),
        default="sweep",
        help="sweep: the concurrency sweep (default); placement: multi-turn conversations on two workers "
        "with prefix placement off, on, and on one worker; priority: priority-0 TTFT idle, under priority-10 "
        "load, and under the same load at priority 0",
    )
    group.add_argument("--conversations", type=int, default=8, help="placement: conversations at a time")
    group.add_argument("--turns", type=int, default=10, help="placement: turns per conversation")
    group.add_argument("--priority-requests", type=int, default=20, help="priority: measured priority-0 requests")
    group.add_argument(
        "--load-streams", type=int, default=None, help="priority: priority-10 streams (default 2 × --max-lanes)"
    )
    group.add_argument("--max-lanes", type=int, default=8, help="routing scenarios: lanes per worker (default 8)")


def _add_owner_parser(commands) -> None:
    parser = commands.add_parser("owner", help="the worker's own cost per token beyond the model, in process")
    parser.add_argument("--model", default=None, help="HF folder or .gguf (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--requests", type=int, default=40, help="requests per loop, alternating (default 40)")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per request, EOS ignored")
    parser.add_argument(
        "--publish-interval-ms",
        type=float,
        default=5.0,
        help="the publisher's interval, as ARBOR_PUBLISH_INTERVAL_MS (default 5)",
    )
    parser.add_argument(
        "--publish-budget",
        type=float,
        default=DEFAULT_PUBLISH_BUDGET,
        help=f"the publisher's budget, as ARBOR_PUBLISH_BUDGET (default {DEFAULT_PUBLISH_BUDGET:g})",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument(
        "--free-model", action="store_true", help="a decode step that costs nothing: measure each loop's own work"
    )
    _add_common(parser)
    parser.set_defaults(handler=_run_owner)


def _add_pool_parser(commands) -> None:
    parser = commands.add_parser("pool", help="pool the gateway/in-process pairs of several serving runs")
    parser.add_argument("results", nargs="+", type=Path, help="serving results folders or their serving.json")
    parser.set_defaults(handler=_run_pool)


def _add_numerics_parser(commands) -> None:
    parser = commands.add_parser("numerics", help="greedy agreement and KL of weight formats against float32")
    parser.add_argument("--model", default=None, help="HF folder or .gguf (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--formats", default="auto-torch,auto", help="formats to compare with float32")
    parser.add_argument("--prompts", type=int, default=20, help="chat prompts (at most 20)")
    parser.add_argument("--max-tokens", type=int, default=64, help="greedy tokens per prompt")
    parser.add_argument("--out", default=None, help="results folder (default: bench-results/<timestamp>/)")
    parser.set_defaults(handler=_run_numerics)


def _add_kernels_parser(commands) -> None:
    parser = commands.add_parser("kernels", help="decode step cost per row count: native kernels against torch's")
    parser.add_argument("--model", default=None, help="HF folder or .gguf (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--rows", default="1,2,4,8,16,32", help="row counts of one forward")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads for both")
    parser.add_argument(
        "--context", type=int, default=32, help="committed tokens before the rows (past 32: random K/V)"
    )
    parser.add_argument("--out", default=None, help="results folder (default: bench-results/<timestamp>/)")
    parser.set_defaults(handler=_run_kernels)


def _add_quality_parser(commands) -> None:
    from ops.eval.quality import DEFAULT_CONFIGS

    parser = commands.add_parser("quality", help="arbor eval per weight format and speculation mode, with gates")
    parser.add_argument("--model", default=None, help="HF folder or .gguf (default: SmolLM2-135M-Instruct)")
    parser.add_argument(
        "--configs", default=",".join(DEFAULT_CONFIGS), help="label=speculation:dtype:quantize, comma-separated"
    )
    parser.add_argument("--items", type=int, default=50, help="items per task")
    parser.add_argument("--out", default=None, help="results folder (default: bench-results/<timestamp>/)")
    parser.set_defaults(handler=_run_quality)


def _run_quality(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from ops.eval.quality import Config, passed, run_quality

    args = _default_model_as_none(args)
    configs = [Config.parse(text) for text in args.configs.split(",") if text]
    out = Path(args.out) if args.out else Path("bench-results") / time.strftime("%Y%m%d-%H%M%S")
    return 0 if passed(run_quality(args.model, configs, args.items, out / "quality")) else 1


def _run_numerics(args: argparse.Namespace) -> int:
    from ops.bench.numerics import run

    args = _default_model_as_none(args)
    run(args.model, args.formats, min(args.prompts, 20), args.max_tokens, args.out)
    return 0


def _run_kernels(args: argparse.Namespace) -> int:
    from ops.bench.kernel_steps import run
    from ops.bench.results import parse_int_list

    args = _default_model_as_none(args)
    if args.context < 0:
        raise ValueError(f"--context={args.context} must be 0 or more")
    run(args.model, parse_int_list(args.rows, "--rows"), args.threads, args.out, context=args.context)
    return 0


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dtype",
        choices=["auto", "float32", "float64", "bfloat16"],
        default="float32",
        help="activations (auto: as the server runs by default, fast weight formats)",
    )
    parser.add_argument("--out", default=None, help="results folder (default: bench-results/<timestamp>/)")


def _modes(text: str, flag: str = "--modes") -> list[str]:
    modes = [mode.strip() for mode in text.split(",") if mode.strip()]
    unknown = [mode for mode in modes if mode not in SPECULATION_MODES]
    if not modes or unknown or len(set(modes)) < len(modes):
        raise argparse.ArgumentTypeError(f"{flag}={text!r}: choose from {','.join(SPECULATION_MODES)}, each once")
    return modes


def _speculation_modes(text: str) -> list[str]:
    return _modes(text, "--speculation")


def _run_decode(args: argparse.Namespace) -> int:
    if args.formats:  # weight formats x modes: ops/bench/formats.py, above decode.py
        from ops.bench.formats import run_formats_command

        return run_formats_command(_default_model_as_none(args))
    from ops.bench.decode import run_decode_command

    return run_decode_command(_default_model_as_none(args))


def _run_serving(args: argparse.Namespace) -> int:
    if args.scenario != "sweep":
        from ops.bench.routing import run_routing_command

        return run_routing_command(_default_model_as_none(args))
    from ops.bench.serving import run_serving_command

    return run_serving_command(args if args.base_url else _default_model_as_none(args))


def _run_agent(args: argparse.Namespace) -> int:
    if args.recorded:
        from ops.bench.agent_recorded_run import run_recorded_command

        return run_recorded_command(_default_model_as_none(args))
    from ops.bench.agent import run_agent_command

    return run_agent_command(_default_model_as_none(args))


def _run_owner(args: argparse.Namespace) -> int:
    from ops.bench.owner import run_owner_command

    return run_owner_command(_default_model_as_none(args))


def _run_pool(args: argparse.Namespace) -> int:
    from ops.bench.pool import run_pool_command

    return run_pool_command(args)


def _default_model_as_none(args: argparse.Namespace) -> argparse.Namespace:
    """`--model SmolLM2-135M-Instruct` means the bundled GGUF, as it does for `arbor worker`."""
    from worker.models.default_model import DEFAULT_MODEL_NAME

    if args.model == DEFAULT_MODEL_NAME:
        args.model = None
    return args
