"""`arbor eval` arguments."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ops.eval.tasks import TASKS


def add_eval_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "eval", help="lm-eval against a running stack, offline (perplexity, choice, arithmetic)"
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the stack's base URL")
    parser.add_argument("--model", default=None, help="served model (default: the only one)")
    parser.add_argument("--items", type=int, default=50, help="items per task")
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, of {', '.join(TASKS)}")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    parser.add_argument("--api-key", default=None, help="a key, where the stack has ARBOR_API_KEYS")
    parser.add_argument("--out", default=None, help="results folder (default: eval-results/<timestamp>/)")
    parser.set_defaults(handler=_run_eval)


def _run_eval(args: argparse.Namespace) -> int:
    from ops.eval.run import run_eval

    tasks = tuple(task.strip() for task in args.tasks.split(",") if task.strip())
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        raise ValueError(f"--tasks: unknown {unknown}; choose from {', '.join(TASKS)}")
    out = Path(args.out) if args.out else Path("eval-results") / time.strftime("%Y%m%d-%H%M%S")
    run = run_eval(args.url, out, args.model, args.items, tasks, args.api_key, args.concurrency)
    print(run.table)
    print(f"lm-eval's results: {run.results_path}")
    return 0
