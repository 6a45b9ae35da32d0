"""docs/CLI.md and docs/SETTINGS.md, written from the code: the `arbor` argument parsers, the
settings classes (each field's comment in shared/settings.py is its meaning) and compose.yaml's
variables. `make docs` rewrites both pages; a test fails when the committed pages differ from
what this module generates, so a flag or a setting cannot change without its page.

    python -m ops.reference_docs          # rewrite docs/CLI.md and docs/SETTINGS.md
    python -m ops.reference_docs --check  # exit 1 if either page is stale
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path

from pydantic import AliasChoices
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parent.parent
CLI_PAGE = ROOT / "docs" / "CLI.md"
SETTINGS_PAGE = ROOT / "docs" / "SETTINGS.md"
SETTINGS_SOURCE = ROOT / "shared" / "settings.py"
COMPOSE_FILE = ROOT / "compose.yaml"

# Variables read outside the settings classes: the CLI's and the test suite's own switches.
OTHER_VARIABLES = {
    "ARBOR_DEBUG": "`arbor`: print the traceback of an unexpected error instead of one line",
    "ARBOR_LOAD_SECONDS": "tests: how long the load test streams (default 20; `make test-hardening`: 120)",
    "ARBOR_FUZZ_SCALE": "tests: the property-based tests' example counts times this (default 1; hardening: 10)",
}
# compose.yaml's own interpolation variables (not read by Arbor's processes).
COMPOSE_VARIABLES = {
    "MODELS_DIR": "host folder mounted read-only at /models in the workers (MODEL=/models/...)",
    "ARBOR_PUBLISH_PORT": "host port the gateway's :8000 is published on",
    "PROMETHEUS_PORT": "host port of Prometheus (profile-free, always started)",
    "GRAFANA_PORT": "host port of Grafana (dashboards provisioned from ops/deploy/grafana)",
    "REDIS_MIN_REPLICAS_TO_WRITE": "Redis `min-replicas-to-write` of the master (the `sentinel` profile)",
}
HOME = str(Path.home())
UNPREFIXED = ("REDIS_URL", "MODEL", "DRAFT", "SPECULATION", "WORKER_ID")


def settings_classes() -> list[tuple[str, type[BaseSettings]]]:
    from shared.settings import GatewaySettings, WorkerSettings

    return [("Gateway (`arbor gateway`)", GatewaySettings), ("Worker (`arbor worker`)", WorkerSettings)]


def env_names(name: str, field: FieldInfo) -> list[str]:
    alias = field.validation_alias
    if isinstance(alias, str):
        return [alias]
    if isinstance(alias, AliasChoices):
        return [str(choice) for choice in alias.choices]
    return [f"ARBOR_{name.upper()}"]


def all_setting_variables() -> set[str]:
    return {
        env
        for _, cls in settings_classes()
        for name, field in cls.model_fields.items()
        for env in env_names(name, field)
    }


def field_comments(source: str, class_name: str) -> dict[str, str]:
    """Each field's comment: the comment lines right above it, then its trailing comment, with a
    leading `ARBOR_X:` (or `ARBOR_X (--flag):`) dropped, since the page names the variable."""
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    lines = source.splitlines()
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    found[item.target.id] = _meaning(item, comments, lines)
    return found


def _meaning(item: ast.AnnAssign, comments: dict[int, str], lines: list[str]) -> str:
    above: list[str] = []
    line = item.lineno - 1
    while line >= 1 and lines[line - 1].strip().startswith("#"):
        above.insert(0, comments[line])
        line -= 1
    trailing = [comments[n] for n in range(item.lineno, (item.end_lineno or item.lineno) + 1) if n in comments]
    text = " ".join(above + trailing)
    return re.sub(rf"^(?:(?:ARBOR_[A-Z0-9_]+|{'|'.join(UNPREFIXED)})(?: \([^)]*\))?(?::\s*|\s*$))+", "", text).strip()


def render_default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
        return "empty" if not value else "computed at start-up"
    value = field.default
    if value is None:
        return "unset"
    if value in ((), ""):
        return "empty"
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"`{str(value).replace(HOME, '~')}`"


def settings_reference() -> str:
    source = SETTINGS_SOURCE.read_text()
    out = [
        "# Settings",
        "",
        "Generated from `shared/settings.py` by `make docs`; do not edit by hand. Every process reads",
        "its settings once from the environment at start-up. The four names a deployment shares",
        "(`REDIS_URL`, `MODEL`, `DRAFT`, `SPECULATION`) and `WORKER_ID` are unprefixed.",
    ]
    for title, cls in settings_classes():
        meanings = field_comments(source, cls.__name__)
        out += ["", f"## {title}", "", "| variable | default | meaning |", "|---|---|---|"]
        for name, field in cls.model_fields.items():
            names = " or ".join(f"`{env}`" for env in env_names(name, field))
            out.append(f"| {names} | {render_default(field)} | {_cell(meanings.get(name, ''))} |")
    out += ["", "## Other variables", "", "| variable | meaning |", "|---|---|"]
    out += [f"| `{name}` | {meaning} |" for name, meaning in OTHER_VARIABLES.items()]
    out += [
        "",
        "## compose.yaml",
        "",
        "Variables `docker compose` substitutes; settings above pass through by name.",
        "",
    ]
    out += ["| variable | default | meaning |", "|---|---|---|"]
    settings = all_setting_variables()
    for name, default in compose_variables().items():
        meaning = COMPOSE_VARIABLES.get(name) or ("the setting above" if name in settings else "")
        out.append(f"| `{name}` | `{default}` | {meaning} |")
    return "\n".join(out) + "\n"


def compose_variables() -> dict[str, str]:
    """compose.yaml's `${NAME:-default}` names in order of first use, with their defaults."""
    found: dict[str, str] = {}
    for name, default in re.findall(r"\$\{([A-Z][A-Z0-9_]*)(?::-([^}]*))?\}", COMPOSE_FILE.read_text()):
        found.setdefault(name, default)
    return found


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def subcommands(parser: argparse.ArgumentParser, prefix: str) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{prefix} {name}", helps.get(name, ""), sub
                yield from subcommands(sub, f"{prefix} {name}")


def option_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        flags = ", ".join(f"`{flag}`" for flag in action.option_strings) or f"`{action.dest}`"
        help_text = (action.help or "") % {"default": action.default} if action.help else ""
        if action.choices is not None and not isinstance(action.choices, dict):
            help_text = f"{help_text} (one of: {', '.join(map(str, action.choices))})".strip()
        rows.append(f"| {flags} | {_default_cell(action)} | {_cell(help_text.replace(HOME, '~'))} |")
    return rows


def _default_cell(action: argparse.Action) -> str:
    if action.default in (None, argparse.SUPPRESS, False) or action.option_strings == []:
        return ""
    if isinstance(action.default, list | tuple):
        return f"`{','.join(map(str, action.default))}`" if action.default else ""
    return f"`{str(action.default).replace(HOME, '~')}`"


def cli_reference() -> str:
    from ops.cli import build_parser

    out = [
        "# The `arbor` command",
        "",
        "Generated from the argument parsers by `make docs`; do not edit by hand. `arbor COMMAND --help`",
        "prints the same. Each flag's environment variable, where it has one, is in docs/SETTINGS.md.",
    ]
    for command, help_text, parser in subcommands(build_parser(), "arbor"):
        rows = option_rows(parser)
        out += ["", f"## {command}", "", help_text]
        if rows:
            out += ["", "| option | default | meaning |", "|---|---|---|", *rows]
    return "\n".join(out) + "\n"


def all_cli_flags() -> set[str]:
    from ops.cli import build_parser

    flags: set[str] = set()
    for _, _, parser in subcommands(build_parser(), "arbor"):
        flags.update(flag for action in parser._actions for flag in action.option_strings)
    return flags


PAGES = {CLI_PAGE: cli_reference, SETTINGS_PAGE: settings_reference}


def main(argv: list[str] | None = None) -> int:
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    stale = [page for page, render in PAGES.items() if not page.exists() or page.read_text() != render()]
    if check:
        for page in stale:
            print(f"{page.relative_to(ROOT)} is stale: run `make docs`", file=sys.stderr)
        return 1 if stale else 0
    for page in stale:
        page.write_text(PAGES[page]())
    return 0


if __name__ == "__main__":
    sys.exit(main())
