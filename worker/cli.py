"""`arbor generate`: one prompt, in process, no Redis."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from shared.sampling import SamplingParams


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
    parser.add_argument("--dtype", choices=["float32", "float64", "bfloat16"], default="float32")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats")
    parser.set_defaults(handler=run_generate)


def add_speculation_arguments(parser: argparse.ArgumentParser, default_mode: str = "none") -> None:
    from worker.drafters.registry import SPECULATION_MODES

    parser.add_argument("--speculation", choices=SPECULATION_MODES, default=default_mode)
    parser.add_argument("--draft", type=Path, default=None, help="drafter checkpoint (MTP or DFlash)")
    parser.add_argument("--num-draft", type=int, default=None,
                        help="draft chain length (default: 3 for mtp and ngram, block_size - 1 for dflash)")
    parser.add_argument("--tree-budget", type=int, default=8, help="nodes in the best-first draft tree (tree)")


def draft_options(args: argparse.Namespace):
    from worker.drafters.registry import DraftOptions

    if (args.num_draft is not None and args.num_draft < 1) or args.tree_budget < 1:
        raise ValueError("--num-draft and --tree-budget must be at least 1")
    return DraftOptions(draft=args.draft, num_draft=args.num_draft, tree_budget=args.tree_budget)


def run_generate(args: argparse.Namespace) -> int:
    from worker.engine.generate import generate
    from worker.serving_model import load_serving_model

    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        min_p=args.min_p, seed=args.seed, stop=list(args.stop),
    )
    served = load_serving_model(args.model, args.speculation, draft_options(args), args.dtype,
                                num_threads=args.threads)
    if args.chat:
        prompt_ids = served.encode_chat([{"role": "user", "content": args.prompt}])
    else:
        prompt_ids = served.encode_text(args.prompt)
    result = generate(served.runner, served.tokenizer, prompt_ids, params)
    if args.json:
        stats = result.stats.to_dict()
        stats["tokens_per_s"] = stats["tokens_per_s"]
        print(json.dumps({"text": result.text, "token_ids": result.token_ids, "finish_reason": result.finish_reason,
                          "model": served.name, "speculation": served.speculation, "stats": stats}))
    else:
        sys.stdout.write(result.text + "\n")
        s = result.stats
        print(f"[{len(result.token_ids)} tokens, {s.tokens_per_forward:.2f} tokens/forward, "
              f"{s.to_dict()['tokens_per_s']:.1f} tokens/s, finish={result.finish_reason}]", file=sys.stderr)
    return 0
