"""The worker's two commands: `arbor generate` (one prompt, in process, no Redis) and `arbor worker`
(serve a model from Redis)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import get_args

from shared.sampling import SamplingParams
from shared.settings import DEFAULT_PUBLISH_BUDGET, DEFAULT_SPECULATION, Quantize, Speculation
from shared.structured_output import StructuredOutput, json_schema_output
from shared.tool_call_grammar import TOOL_FORMATS

# torch-free, so that `arbor gateway` builds this parser in an image without torch
SPECULATION_MODES = get_args(Speculation)
DTYPE_CHOICES = ("auto", "float32", "float64", "bfloat16")
QUANTIZE_CHOICES = get_args(Quantize)
KERNEL_CHOICES = ("auto", "native", "native-int8", "torch")  # worker/kernels/cpu_features.py
KERNEL_ISA_CHOICES = ("auto", "portable", "avx512_vnni", "avx2", "avx_vnni", "neon_dotprod")  # likewise


def add_generate_parser(subparsers) -> None:
    parser = subparsers.add_parser("generate", help="generate text for one prompt in process (no Redis)")
    parser.add_argument("--prompt", required=True, help="the prompt text")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt as a user turn in the chat template")
    parser.add_argument("--model", default=None, help="HF folder or .gguf file (default: SmolLM2-135M-Instruct)")
    add_speculation_arguments(parser)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    add_precision_arguments(parser)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument(
        "--json-mode", action="store_true", help="the answer is one JSON object (the API's response_format json_object)"
    )
    parser.add_argument("--json-schema", default=None, help="a JSON schema file the answer validates against")
    parser.add_argument("--regex", default=None, help="a regular expression the answer matches")
    parser.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats")
    add_tool_parser_argument(parser)
    parser.set_defaults(handler=run_generate)


def add_tool_parser_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tool-parser",
        default=None,
        choices=TOOL_FORMATS,
        help="tool-call format answers are read and forced calls written in "
        "(ARBOR_TOOL_PARSER; default: the one the chat template asks for)",
    )


def add_speculation_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--speculation",
        choices=SPECULATION_MODES,
        default=DEFAULT_SPECULATION,
        help=f"speculation mode (default {DEFAULT_SPECULATION}, as served: shared/settings.py; none = plain decoding)",
    )
    parser.add_argument("--draft", type=Path, default=None, help="drafter checkpoint (MTP or DFlash)")
    parser.add_argument(
        "--num-draft",
        type=int,
        default=None,
        help="draft chain length (default: 3 for mtp and ngram, block_size - 1 for dflash)",
    )
    parser.add_argument("--tree-budget", type=int, default=8, help="nodes in a draft tree (tree, mtp-tree, suffix)")


def add_precision_arguments(parser: argparse.ArgumentParser, default: str | None = "auto") -> None:
    """--dtype (activations) and --quantize (linear weights); worker/models/weight_formats.py.
    `default` None: unset unless given (the worker's flags override its environment)."""
    parser.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        default=default,
        help="activation dtype; float32/float64 alone is the exact path (ARBOR_DTYPE, default auto: the "
        "fastest close format on this device)",
    )
    parser.add_argument(
        "--quantize",
        choices=QUANTIZE_CHOICES,
        default=default,
        help="linear weights: int4/int8 weight-only, none = dense in the dtype, auto = as the file holds "
        "them (ARBOR_QUANTIZE)",
    )
    parser.add_argument(
        "--kernels",
        choices=KERNEL_CHOICES,
        default=default,
        help="who multiplies int4/int8 weights on a CPU: native (Arbor's kernels for AVX-512 VNNI, AVX-VNNI, "
        "AVX2 or ARM dotprod, built at first use; native-int8: one-term int8 activations as llama.cpp), torch "
        "(aten), auto = native where the CPU has a vector path and a C compiler is found (ARBOR_KERNELS)",
    )
    parser.add_argument(
        "--kernel-isa",
        choices=KERNEL_ISA_CHOICES,
        default=None if default is None else "auto",
        help="the native kernels' path, forced (tests, benchmarks; ARBOR_KERNEL_ISA, default auto: the fastest "
        "this CPU runs)",
    )


def draft_options(args: argparse.Namespace):
    from worker.drafters.registry import DraftOptions

    if (args.num_draft is not None and args.num_draft < 1) or args.tree_budget < 1:
        raise ValueError("--num-draft and --tree-budget must be at least 1")
    return DraftOptions(draft=args.draft, num_draft=args.num_draft, tree_budget=args.tree_budget)


def _structured_output(args: argparse.Namespace) -> StructuredOutput | None:
    """--json-mode, --json-schema or --regex, checked here (a bad one is this command's one-line error)."""
    given = [
        StructuredOutput("json_object", "", "--json-mode") if args.json_mode else None,
        json_schema_output(Path(args.json_schema).read_text(), "--json-schema") if args.json_schema else None,
        StructuredOutput("regex", args.regex, "--regex") if args.regex is not None else None,
    ]
    found = [output for output in given if output is not None]
    if len(found) > 1:
        raise ValueError(f"{found[1].field} cannot be combined with {found[0].field}: give one constraint")
    if found:
        found[0].check()
    return found[0] if found else None


def run_generate(args: argparse.Namespace) -> int:
    from shared.settings import WorkerSettings
    from worker.engine.generate import generate
    from worker.serving_model import load_serving_model

    settings = WorkerSettings()
    structured = _structured_output(args)
    if structured is not None:
        structured = replace(structured, whitespace=settings.json_whitespace, numbers=settings.json_numbers)
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        seed=args.seed,
        stop=list(args.stop),
        structured=structured,
    )
    served = load_serving_model(
        args.model,
        args.speculation,
        draft_options(args),
        args.dtype,
        num_threads=args.threads,
        quantize=args.quantize,
        kernels=args.kernels,
        kernel_isa=args.kernel_isa,
        cache_dir=settings.cache_dir,
        tool_parser=args.tool_parser or settings.tool_parser,
        json_whitespace=settings.json_whitespace,
        json_numbers=settings.json_numbers,
    )
    if args.chat:
        prompt_ids = served.encode_chat([{"role": "user", "content": args.prompt}])
    else:
        prompt_ids = served.encode_text(args.prompt)
    result = generate(served.runner, served.tokenizer, prompt_ids, params)
    if args.json:
        stats = result.stats.to_dict()
        stats["tokens_per_s"] = stats["tokens_per_s"]
        print(
            json.dumps(
                {
                    "text": result.text,
                    "token_ids": result.token_ids,
                    "finish_reason": result.finish_reason,
                    "model": served.name,
                    "speculation": served.speculation,
                    "stats": stats,
                }
            )
        )
    else:
        sys.stdout.write(result.text + "\n")
        s = result.stats
        print(
            f"[{len(result.token_ids)} tokens, {s.tokens_per_forward:.2f} tokens/forward, "
            f"{s.to_dict()['tokens_per_s']:.1f} tokens/s, finish={result.finish_reason}]",
            file=sys.stderr,
        )
    return 0


def add_worker_parser(subparsers) -> None:
    """`arbor worker`: serve one model from Redis. Flags override the environment (WorkerSettings)."""
    parser = subparsers.add_parser("worker", help="serve a model: pull jobs from Redis, stream events back")
    parser.add_argument("--model", default=None, help="HF folder, .gguf file or the default model's name (MODEL)")
    parser.add_argument("--draft", default=None, help="drafter checkpoint for mtp/dflash/tree (DRAFT)")
    parser.add_argument(
        "--speculation",
        default=None,
        choices=SPECULATION_MODES,
        help=f"speculation mode (SPECULATION; default {DEFAULT_SPECULATION}, shared/settings.py)",
    )
    parser.add_argument(
        "--served-model-name",
        default=None,
        help="the model's name for clients, then aliases, comma-separated: 'qwen,claude-sonnet-4-5' "
        "(ARBOR_SERVED_MODEL_NAME, default: the file or folder name)",
    )
    parser.add_argument("--max-lanes", type=int, default=None, help="concurrent requests (ARBOR_MAX_LANES)")
    parser.add_argument("--max-context", type=int, default=None, help="tokens per lane (ARBOR_MAX_CONTEXT)")
    parser.add_argument(
        "--prefill-cache-bytes",
        type=int,
        default=None,
        help="paired prefill cache budget, 0 disables it (ARBOR_PREFILL_CACHE_BYTES)",
    )
    parser.add_argument(
        "--stream-interval",
        type=int,
        default=None,
        help="tokens per streamed delta; 1 streams every step (ARBOR_STREAM_INTERVAL)",
    )
    parser.add_argument(
        "--publish-interval-ms",
        type=float,
        default=None,
        help="least time between event batches while steps run; 0 sends every step "
        "(ARBOR_PUBLISH_INTERVAL_MS, default 5)",
    )
    parser.add_argument(
        "--publish-budget",
        type=float,
        default=None,
        help="share of the owner thread publishing may take; dearer batches stretch the "
        "interval, up to 50 ms; 0 never stretches it "
        f"(ARBOR_PUBLISH_BUDGET, default {DEFAULT_PUBLISH_BUDGET:g})",
    )
    parser.add_argument("--redis-url", default=None, help="Redis to serve from (REDIS_URL)")
    parser.add_argument("--worker-id", default=None, help="consumer name and heartbeat id (WORKER_ID)")
    add_precision_arguments(parser, default=None)
    add_tool_parser_argument(parser)
    parser.set_defaults(handler=run_worker)


_WORKER_FLAGS = (
    "model",
    "draft",
    "speculation",
    "served_model_name",
    "max_lanes",
    "max_context",
    "prefill_cache_bytes",
    "stream_interval",
    "publish_interval_ms",
    "publish_budget",
    "redis_url",
    "worker_id",
    "dtype",
    "quantize",
    "kernels",
    "kernel_isa",
    "tool_parser",
)


def worker_settings(args: argparse.Namespace):
    from shared.settings import WorkerSettings

    overrides = {name: getattr(args, name) for name in _WORKER_FLAGS if getattr(args, name) is not None}
    return WorkerSettings(**overrides)


def run_worker(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from worker.redis_side.service import ServiceConfig, WorkerService

    settings = worker_settings(args)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    service = WorkerService(
        ServiceConfig.from_settings(settings), lambda: load_worker_model(settings), freeze_heap=True
    )
    asyncio.run(_serve_until_signalled(service))
    if service.abandoned_loading:  # stopped mid-load: leave now rather than finalise under torch's loader
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def load_worker_model(settings):
    """The worker's model, in the owner thread; the default model's name means the bundled GGUF."""
    from worker.drafters.registry import DraftOptions
    from worker.models.default_model import DEFAULT_MODEL_NAME
    from worker.serving_model import load_serving_model

    model = None if settings.model == DEFAULT_MODEL_NAME else settings.model
    options = DraftOptions(draft=Path(settings.draft) if settings.draft else None, tree_budget=settings.tree_budget)
    return load_serving_model(
        model,
        settings.speculation,
        options,
        settings.dtype,
        max_context=settings.max_context,
        num_threads=worker_threads(settings),
        cache_dir=settings.cache_dir,
        quantize=settings.quantize,
        kernels=settings.kernels,
        kernel_isa=settings.kernel_isa,
        tool_parser=settings.tool_parser,
        json_whitespace=settings.json_whitespace,
        json_numbers=settings.json_numbers,
    )


def worker_threads(settings) -> int:
    """ARBOR_THREADS, else the rule over this process's cores (worker/thread_count.py); logged."""
    import logging

    from worker.thread_count import available_cores, intra_op_threads

    cores = available_cores()
    threads = settings.threads or intra_op_threads(cores, settings.workers_per_host)
    source = (
        "ARBOR_THREADS or OMP_NUM_THREADS"
        if settings.threads
        else f"{cores} cores, {settings.workers_per_host} worker(s)"
    )
    logging.getLogger(__name__).info("model threads: %d (%s)", threads, source)
    return threads


async def _serve_until_signalled(service) -> None:
    import asyncio
    import signal

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await service.run(stop)
