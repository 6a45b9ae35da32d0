"""The README's environment table lists exactly the variables the settings classes read."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import AliasChoices

from shared.settings import GatewaySettings, WorkerSettings

README = Path(__file__).resolve().parents[2] / "README.md"


def _env_names(settings_class) -> set[str]:
    prefix = settings_class.model_config["env_prefix"]
    names = set()
    for name, field in settings_class.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            names |= {str(choice) for choice in alias.choices}
        else:
            names.add(str(alias or prefix + name.upper()))
    return names


def _table_rows() -> dict[str, set[str]]:
    rows = {}
    for line in README.read_text().splitlines():
        match = re.match(r"\| `([A-Z_]+)` \| ([a-z, ]+) \|", line)
        if match:
            rows[match.group(1)] = {part.strip() for part in match.group(2).split(",")}
    return rows


def test_every_setting_is_documented_for_its_process():
    rows = _table_rows()
    for process, settings_class in (("gateway", GatewaySettings), ("worker", WorkerSettings)):
        for name in _env_names(settings_class):
            assert name in rows, f"README table misses {name}"
            assert process in rows[name], f"README says {name} is for {rows[name]}, not {process}"


def test_table_lists_nothing_the_settings_do_not_read():
    known = _env_names(GatewaySettings) | _env_names(WorkerSettings)
    assert set(_table_rows()) <= known
