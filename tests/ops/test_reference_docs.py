"""The generated references (docs/CLI.md, docs/SETTINGS.md) match the code, and every flag and
variable a page or manifest names exists."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from ops import reference_docs
from shared.settings import DEFAULT_SPECULATION

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MANIFESTS = [ROOT / "compose.yaml", *sorted((ROOT / "ops" / "deploy" / "k8s").glob("*.yaml")), ROOT / "Makefile"]
# Flags of other tools that the pages show in their own commands (pip, docker compose, pytest, curl,
# kubectl, qemu, llama.cpp's server, lm-eval), not `arbor` flags.
OTHER_TOOLS_FLAGS = {
    "--index-url",
    "--no-deps",
    "--scale",
    "--profile",
    "--build",
    "--quiet",
    "--upgrade",
    "--cpu",
    "--config",
    "--kustomize",
    "--dry-run",
    "--ctx-size",
    "--threads-batch",
    "--parallel",
    "--cont-batching",
    "--host",
    "--port",
    "--model-alias",
    "--jinja",
    "--header",
    "--data",
    "--no-buffer",
    "--tasks",
    "--model_args",
    "--env",
    "--min-replicas-to-write",
    "--min-replicas-max-lag",
    "--appendonly",
    "--from-literal",
    "--set",
    "--appendfsync",
    "--storage.tsdb.retention.time",
    "--config.file",
    "--run-slow",
    "--durations",
    "--timeout",
    "--maxfail",
    "--import-mode",
}
# Flags of the scripts run as modules: `python -m ops.eval.acceptance --record`, ops/bench/ceiling.py
MODULE_FLAGS = {"--record", "--device", "--repeats"}


def test_generated_pages_are_current():
    for page, render in reference_docs.PAGES.items():
        assert page.read_text() == render(), f"{page.name} is stale: run `make docs`"


def test_every_flag_a_page_names_exists():
    flags = reference_docs.all_cli_flags() | OTHER_TOOLS_FLAGS | MODULE_FLAGS
    for page in PAGES:
        named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9_.-]*[a-z0-9]", page.read_text()))
        assert named <= flags, f"{page.relative_to(ROOT)} names flags no --help has: {sorted(named - flags)}"


def test_every_variable_a_page_or_manifest_names_exists():
    known = (
        reference_docs.all_setting_variables()
        | set(reference_docs.OTHER_VARIABLES)
        | set(reference_docs.COMPOSE_VARIABLES)
    )
    for path in PAGES + MANIFESTS:
        named = set(re.findall(r"\bARBOR_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
        assert named <= known, f"{path.relative_to(ROOT)} names variables no setting has: {sorted(named - known)}"


def test_every_compose_variable_has_a_meaning():
    settings = reference_docs.all_setting_variables()
    for name in reference_docs.compose_variables():
        assert name in settings or name in reference_docs.COMPOSE_VARIABLES, f"compose.yaml's {name} is undocumented"


def test_other_variables_are_read_somewhere():
    sources = "".join(
        path.read_text() for folder in ("ops", "tests", "gateway", "worker") for path in (ROOT / folder).rglob("*.py")
    )
    for name in reference_docs.OTHER_VARIABLES:
        assert sources.count(f'"{name}"') >= 1, f"{name} is documented but nothing reads it"


def test_one_default_speculation_mode_everywhere():
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert compose["x-worker"]["environment"]["SPECULATION"] == f"${{SPECULATION:-{DEFAULT_SPECULATION}}}"
    worker = yaml.safe_load((ROOT / "ops" / "deploy" / "k8s" / "worker.yaml").read_text())
    env = {item["name"]: item.get("value") for item in worker["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SPECULATION"] == DEFAULT_SPECULATION
    from ops.cli import build_parser

    generate = build_parser().parse_args(["generate", "--prompt", "x"])
    assert generate.speculation == DEFAULT_SPECULATION
