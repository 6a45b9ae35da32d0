"""The `arbor` command: one entry point, each subcommand imported only when it runs.

This module sits above gateway/ and worker/ (it launches both), so that the gateway image can
install and run `arbor gateway` without torch.
"""

from __future__ import annotations

import argparse
import os
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="arbor", description="LLM serving with lossless speculative decoding")
    subparsers = parser.add_subparsers(dest="command", required=True)
    from worker.cli import add_generate_parser, add_worker_parser

    add_generate_parser(subparsers)
    add_worker_parser(subparsers)
    from ops.bench.cli import add_bench_parser
    from ops.capacity import add_capacity_parser
    from ops.eval.cli import add_eval_parser
    from ops.launch.up import add_up_parser
    from ops.top import add_top_parser
    from ops.training.train_drafter import add_train_parser

    add_up_parser(subparsers)
    add_train_parser(subparsers)
    add_top_parser(subparsers)
    add_bench_parser(subparsers)
    add_eval_parser(subparsers)
    add_capacity_parser(subparsers)
    _add_gateway_parser(subparsers)
    return parser


def _add_gateway_parser(subparsers) -> None:
    parser = subparsers.add_parser("gateway", help="serve the OpenAI-compatible HTTP API (no torch needed)")
    parser.add_argument("--host", default=None, help="listen address (ARBOR_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="listen port (ARBOR_PORT, default 8000)")
    parser.add_argument("--redis-url", default=None, help="Redis URL (REDIS_URL)")
    parser.set_defaults(handler=_run_gateway)


def _run_gateway(args: argparse.Namespace) -> int:
    from gateway.main import run_gateway
    from shared.settings import GatewaySettings

    overrides = {name: getattr(args, name) for name in ("host", "port", "redis_url") if getattr(args, name) is not None}
    run_gateway(GatewaySettings(**overrides))
    return 0


SERVICES = ("worker", "gateway")  # long-running processes: a bug's traceback belongs in their log


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # the CLI boundary: one line, not a traceback
        if _is_user_error(error):
            print(f"arbor: error: {_one_line(error)}", file=sys.stderr)
            return 2
        if args.command in SERVICES or os.environ.get("ARBOR_DEBUG"):
            raise
        print(
            f"arbor: error: {type(error).__name__}: {_one_line(error)} (a bug in Arbor: please report it; "
            "ARBOR_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return 1


def _one_line(error: Exception) -> str:
    """pydantic's settings errors span lines (field, message, a link): say each in a clause. The
    values themselves are never shown: settings hold API keys and Redis passwords, and a check
    across fields would name them all."""
    from pydantic import ValidationError

    if not isinstance(error, ValidationError):
        return " ".join(str(error).split()) or type(error).__name__
    return f"invalid {error.title}: " + "; ".join(
        f"{'.'.join(str(part) for part in detail['loc']) or 'settings'}: {detail['msg']}" for detail in error.errors()
    )


def _is_user_error(error: Exception) -> bool:
    # Named exceptions at boundaries subclass ValueError (CheckpointError, DrafterError,
    # ContextLengthError, ChatTemplateError), missing files, or a service that does not answer.
    return isinstance(error, (ValueError, FileNotFoundError, ConnectionError))


if __name__ == "__main__":
    sys.exit(main())
