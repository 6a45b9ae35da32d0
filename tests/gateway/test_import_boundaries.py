"""The gateway never loads torch or anything from worker/: checked in a fresh interpreter."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import gateway

GATEWAY_DIR = Path(gateway.__file__).parent

PROBE = """
import json, sys
import gateway.app, gateway.main
gateway.app.create_app(__import__("shared.settings", fromlist=["x"]).GatewaySettings())
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith(("torch.", "worker", "ops")))
print(json.dumps(loaded))
"""


def test_importing_the_gateway_loads_no_torch_and_no_worker() -> None:
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True)

    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def test_gateway_sources_import_only_gateway_shared_and_libraries() -> None:
    offenders = []
    for path in sorted(GATEWAY_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in {"torch", "worker", "ops"}]

    assert offenders == []
