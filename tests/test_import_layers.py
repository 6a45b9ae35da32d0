"""The rooms' import rules (docs/ARCHITECTURE.md, "Packages and dependency direction"): no module
imports from a layer above its own, and no two files import each other, directly or around a
circle. Every import counts, a function's lazy one and a TYPE_CHECKING one too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("shared", "gateway", "worker", "ops")
# Bottom to top: a module may import its own layer and those before it. Modules not named here
# take their top-level package's layer (the first match by prefix wins, longest first).
LAYERS = [
    ["shared"],
    ["gateway"],
    ["worker.thread_count", "worker.kernels"],
    ["worker.models"],
    ["worker.speculation"],
    ["worker.engine"],
    ["worker.drafters"],
    ["worker.chat"],
    ["worker.serving_model"],
    ["worker.serving"],
    ["worker.redis_side"],
    ["worker.cli", "worker.__main__", "worker"],
    ["ops"],
]


def module_files() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "bundled" in path.parts:
                continue
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            found[name] = path
    return found


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        found.update(name for name in names if name in modules)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imports_of(path, modules) - {name} for name, path in modules.items()}


def layer_of(module: str) -> int:
    prefixes = sorted(((p, i) for i, layer in enumerate(LAYERS) for p in layer), key=lambda item: -len(item[0]))
    for prefix, index in prefixes:
        if module == prefix or module.startswith(prefix + "."):
            return index
    raise AssertionError(f"{module} is in no layer: add it to LAYERS and to docs/ARCHITECTURE.md")


def test_no_module_imports_a_layer_above_its_own():
    climbing = [
        f"{module} -> {target}"
        for module, targets in import_graph().items()
        for target in sorted(targets)
        if layer_of(target) > layer_of(module)
    ]
    assert not climbing, "imports that climb a layer:\n" + "\n".join(sorted(climbing))


def test_gateway_and_worker_never_import_each_other():
    for module, targets in import_graph().items():
        for target in targets:
            sides = {module.split(".")[0], target.split(".")[0]}
            assert sides != {"gateway", "worker"}, f"{module} -> {target}"


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module: each is an import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_no_import_circles():
    assert strongly_connected(import_graph()) == []


def test_the_circle_finder_finds_a_circle():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
