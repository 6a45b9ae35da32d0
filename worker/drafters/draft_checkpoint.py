"""Reading drafter checkpoints (MTP heads, DFlash drafters) and loading them into modules.

Both drafter kinds ship as a folder with `config.json` + `*.safetensors`; an MTP head may also be
a bare `.safetensors` file or live inside the target checkpoint. Every failure is a one-line
`DrafterError` naming the path, field or tensor at fault.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from worker.engine.drafter_protocol import DrafterError


@dataclass(slots=True)
class DraftCheckpoint:
    config: dict  # the drafter's config.json ({} for a bare .safetensors file)
    tensors: dict[str, torch.Tensor]
    source: str
    folder: Path | None = None  # where optional side files (draft_vocab.json) live


BUNDLED_DIR = Path(__file__).parent / "bundled"


def bundled_drafter_path(model_name: str, kind: str) -> Path | None:
    """A drafter of `kind` ("mtp", "dflash") shipped in the package for `model_name`, if any.

    Layout: worker/drafters/bundled/<model name>/<kind>/{config.json, model.safetensors};
    `arbor train-drafter` writes exactly that folder.
    """
    folder = BUNDLED_DIR / model_name / kind
    return folder if (folder / "config.json").exists() else None


def read_draft_checkpoint(path: Path, allow_bare_file: bool = False) -> DraftCheckpoint:
    path = Path(path)
    if not path.exists():
        raise DrafterError(f"drafter path {path} does not exist")
    if path.is_file():
        if not (allow_bare_file and path.suffix == ".safetensors"):
            raise DrafterError(f"drafter path {path} is not a folder with config.json and model.safetensors")
        return DraftCheckpoint({}, _read_safetensors(path), str(path))
    return DraftCheckpoint(_read_config(path / "config.json"), _read_folder_tensors(path), str(path), path)


def _read_config(path: Path) -> dict:
    if not path.exists():
        raise DrafterError(f"{path} not found: a drafter folder needs config.json")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise DrafterError(f"{path} is not valid JSON: {error}") from error
    if not isinstance(config, dict):
        raise DrafterError(f"{path} must hold a JSON object")
    return config


def _read_folder_tensors(folder: Path) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise DrafterError(f"no *.safetensors weights in drafter folder {folder}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(_read_safetensors(file))
    return tensors


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as error:
        raise DrafterError(f"{path} is not a readable safetensors file: {error}") from error


def load_weights(
    module: nn.Module,
    tensors: dict[str, torch.Tensor],
    prefix: str,
    source: str,
    dtype: torch.dtype,
    device: torch.device,
) -> None:
    """Fill `module` (built on the meta device) from `tensors[prefix + name]`, checking names and shapes.

    Extra tensors under `prefix` are refused too: they mean a variant this code does not run
    (a second MTP layer, a DFlash-2 selector), and ignoring them would draft garbage silently.
    """
    expected = module.state_dict()
    state = {}
    for name, meta in expected.items():
        tensor = tensors.get(prefix + name)
        if tensor is None:
            raise DrafterError(f"{source}: tensor {prefix + name} is missing")
        if tuple(tensor.shape) != tuple(meta.shape):
            raise DrafterError(
                f"{source}: tensor {prefix + name} has shape {tuple(tensor.shape)}, expected {tuple(meta.shape)}"
            )
        state[name] = tensor.to(device=device, dtype=dtype)
    unexpected = sorted(name for name in tensors if name.startswith(prefix) and name[len(prefix) :] not in expected)
    if unexpected:
        raise DrafterError(f"{source}: unexpected tensor {unexpected[0]} (this drafter format is not supported)")
    module.load_state_dict(state, assign=True)
    module.eval()
