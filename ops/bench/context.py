"""`arbor bench context`: prefill and decode tokens/s against context length, on a random hybrid.

For each length: one random prompt of that many tokens through the runner's chunked prefill
(`generate`'s PREFILL_CHUNK rows a forward), then `--decode-tokens` greedy tokens one step at a
time; the times, the tokens/s and the process's peak RSS so far go to context.json and a
markdown table in context.md, under a line naming the model, dtype, threads and CPU (ready for
docs/BENCHMARKS.md). The model is `--model`, or a random Qwen3.5 / Qwen3-Next layout
(ops/bench/random_hybrid.py) whose max_position_embeddings is 262,144; the longest default
prompt leaves room for the decoded tokens within it.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

from ops.bench.results import fmt, machine_info, markdown_table, parse_int_list, results_dir, write_json

LONG_POSITIONS = 262144
DEFAULT_LENGTHS = "1024,4096,16384,65536,131072,262128"  # 262,128 + 16 decoded tokens = the model's maximum


def add_context_parser(commands) -> None:
    parser = commands.add_parser("context", help="prefill and decode tokens/s against context length (hybrids)")
    parser.add_argument("--model", default=None, help="HF folder (default: a random hybrid, see --random-hybrid)")
    parser.add_argument("--random-hybrid", default="qwen3_5", choices=["qwen3_5", "qwen3_next"])
    parser.add_argument("--lengths", default=DEFAULT_LENGTHS, help="prompt lengths, comma-separated")
    parser.add_argument("--decode-tokens", type=int, default=16, help="greedy tokens decoded after each prompt")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float64"])
    parser.add_argument("--out", default=None, help="results folder (default: bench-results/<timestamp>/)")
    parser.set_defaults(handler=run_context_command)


def run_context_command(args: argparse.Namespace) -> int:
    import torch

    from ops.bench.random_hybrid import hybrid_shape_summary, write_random_hybrid
    from worker.engine.generate import PREFILL_CHUNK
    from worker.serving_model import load_serving_model

    if args.threads:
        torch.set_num_threads(args.threads)
    lengths = parse_int_list(args.lengths, "--lengths")
    out = results_dir(args.out)
    model = Path(args.model) if args.model else None
    if model is None:
        model = write_random_hybrid(out / "model", args.random_hybrid, max_position_embeddings=LONG_POSITIONS)
    served = load_serving_model(model, "none", dtype=args.dtype, max_context=max(lengths) + args.decode_tokens)
    limit = served.runner.max_context
    if max(lengths) + args.decode_tokens > limit:
        message = f"--lengths: {max(lengths)} + --decode-tokens {args.decode_tokens} pass the model's {limit} tokens"
        print(message, file=sys.stderr)
        return 2
    machine = machine_info()
    threads = torch.get_num_threads()
    name = "the model at " + str(model) if args.model else f"a random {args.random_hybrid} ({hybrid_shape_summary()})"
    caption = (
        f"{name}, {args.dtype}, {threads} torch thread(s), {machine['cpu'] or 'CPU'}; one lane, prefill in "
        f"{PREFILL_CHUNK}-row chunks, {args.decode_tokens} greedy tokens after it; peak RSS is the process's so far."
    )
    rows: list[dict] = []
    for length in lengths:  # the files are rewritten after each length: a long sweep cut short keeps its rows
        rows.append(_measure(served.runner, length, args.decode_tokens))
        report = {"machine": machine, "model": str(model), "dtype": args.dtype, "threads": threads, "rows": rows}
        write_json(out / "context.json", report)
        (out / "context.md").write_text(caption + "\n\n" + _table(rows) + "\n")
    print(caption + "\n\n" + _table(rows))
    print(f"results: {out}")
    return 0


def _table(rows: list[dict]) -> str:
    return markdown_table(
        ["context", "prefill s", "prefill tok/s", "decode tok/s", "peak RSS MB"],
        [
            [
                str(r["context"]),
                fmt(r["prefill_s"], 2),
                fmt(r["prefill_tok_s"]),
                fmt(r["decode_tok_s"]),
                fmt(r["peak_rss_mb"]),
            ]
            for r in rows
        ],
    )


def _measure(runner, length: int, decode_tokens: int) -> dict:
    import torch

    from shared.sampling import SamplingParams
    from worker.engine.generate import PREFILL_CHUNK

    prompt = torch.randint(0, runner.vocab_size, (length,), generator=torch.Generator().manual_seed(length)).tolist()
    sequence = runner.start(f"context-{length}", prompt, SamplingParams(max_tokens=decode_tokens, ignore_eos=True))
    started = time.perf_counter()
    while sequence.num_to_prefill > 0:
        runner.prefill(sequence, PREFILL_CHUNK)
    prefilled = time.perf_counter()
    while not sequence.finished:
        runner.decode_step(sequence)
    decoded = time.perf_counter()
    prefill_s, decode_s = prefilled - started, decoded - prefilled
    return {
        "context": length,
        "prefill_s": prefill_s,
        "prefill_tok_s": length / prefill_s if prefill_s else None,
        "decode_s": decode_s,
        "decode_tok_s": len(sequence.output_ids) / decode_s if decode_s else None,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
