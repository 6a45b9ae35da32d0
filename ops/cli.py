"""The `arbor` command: one entry point, each subcommand imported only when it runs.

This module sits above gateway/ and worker/ (it launches both), so that the gateway image can
install and run `arbor gateway` without torch.
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="arbor", description="LLM serving with lossless speculative decoding")
    subparsers = parser.add_subparsers(dest="command", required=True)
    from worker.cli import add_generate_parser

    add_generate_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # the CLI boundary: one line, not a traceback
        if not _is_user_error(error):
            raise
        print(f"arbor: error: {error}", file=sys.stderr)
        return 2


def _is_user_error(error: Exception) -> bool:
    # Named exceptions at boundaries subclass ValueError (CheckpointError, DrafterError,
    # ContextLengthError, ChatTemplateError) or are missing files.
    return isinstance(error, (ValueError, FileNotFoundError))


if __name__ == "__main__":
    sys.exit(main())
