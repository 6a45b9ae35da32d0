"""shared/ is the bottom layer: it imports nothing from gateway/, worker/ or ops/, and no torch."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import shared

SHARED_DIR = Path(shared.__file__).parent
FORBIDDEN = {"gateway", "worker", "ops", "torch", "starlette", "uvicorn"}

PROBE = """
import importlib, json, pkgutil, sys
import shared
for info in pkgutil.walk_packages(shared.__path__, "shared."):
    importlib.import_module(info.name)
roots = {m.split(".")[0] for m in sys.modules}
print(json.dumps(sorted(roots & {"gateway", "worker", "ops", "torch", "starlette", "uvicorn"})))
"""


def test_importing_every_shared_module_loads_no_upper_layer() -> None:
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True)

    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def test_shared_sources_name_no_upper_layer() -> None:
    offenders = []
    for path in sorted(SHARED_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]

    assert offenders == []
