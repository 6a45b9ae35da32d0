"""Runs each agent CLI once through the logging proxy and keeps what it sent as fixtures.

    python -m ops.agent_capture.capture [--base-url URL] [--cli NAME ...] [--out DIR]

Without --base-url it starts `arbor up` (the default model) on a free loopback port and stops it
after. Each CLI runs in a fresh temp folder (its home, its config, a one-file project to work in)
behind its own proxy; the proxy's records become `<out>/<cli>-<version>/NN-<route>.json`, with the
temp folder's path written as `/tmp/agent` so fixtures do not differ from run to run by it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ops.agent_capture.clis import AGENT_CLIS, AgentCli
from ops.agent_capture.runs import (
    CliRun,
    arbor_up,
    install_clis,
    logging_proxy,
    read_records,
    run_cli,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PROMPT = "List the files in the current folder with a tool, then say what README.md is about in one line."
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "agent_traffic"
DEFAULT_PREFIX = REPO_ROOT / ".cache" / "agent-clis"
DEFAULT_MODEL = "SmolLM2-135M-Instruct"
STABLE_ROOT = "/tmp/agent"
# The CLIs ask for 32000 tokens; the stack lowers that to this, so a turn of the 135M model that
# never stops ends in a minute, not when the context is full. The bodies are recorded unchanged.
CAPTURE_SETTINGS = {"ARBOR_MAX_TOKENS_CAP": "512", "ARBOR_DEFAULT_MAX_TOKENS": "512"}


def capture_one(cli: AgentCli, bin_dir: Path, base_url: str, model: str, prompt: str, out: Path) -> CliRun:
    with tempfile.TemporaryDirectory(prefix="arbor-agent-") as temp:
        root = Path(temp)
        with logging_proxy(base_url, root / "records") as proxy_url:
            run = run_cli(cli, bin_dir, root, proxy_url, model, prompt)
        for old in out.glob(f"{cli.name}-[0-9]*"):  # a refresh replaces every recorded version
            shutil.rmtree(old)
        target = out / f"{cli.name}-{cli.version}"
        target.mkdir(parents=True)
        for record_path in sorted((root / "records").glob("*.json")):
            text = record_path.read_text().replace(str(root), STABLE_ROOT)
            (target / record_path.name).write_text(text)
        run.records = read_records(target)
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.agent_capture.capture", description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", help="a running stack (default: start `arbor up` for the run)")
    parser.add_argument("--cli", action="append", choices=sorted(AGENT_CLIS), help="default: all of them")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--prefix", type=Path, default=DEFAULT_PREFIX, help="npm --prefix the CLIs live under")
    parser.add_argument("--version", action="append", default=[], metavar="CLI=VERSION", help="instead of the pin")
    args = parser.parse_args(argv)
    names = args.cli or sorted(AGENT_CLIS)
    versions = dict(item.split("=", 1) for item in args.version)
    started = time.monotonic()
    clis = install_clis(args.prefix, names, versions)
    print(f"installed {', '.join(cli.spec for cli in clis)} in {time.monotonic() - started:.0f} s", flush=True)
    bin_dir = args.prefix / "node_modules" / ".bin"
    with arbor_up(args.base_url, settings=CAPTURE_SETTINGS) as base_url:
        for cli in clis:
            run = capture_one(cli, bin_dir, base_url, args.model, args.prompt, args.out)
            print(json.dumps(run.summary()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
