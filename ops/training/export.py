"""A trained drafter as the loaders read it: config.json, bf16 model.safetensors, draft_vocab.json."""

from __future__ import annotations

import json
from pathlib import Path


def save_drafter(folder: Path, tensors: dict, config: dict, draft_vocab) -> None:
    """config.json, model.safetensors (bf16) and draft_vocab.json: the tokens the drafter was trained to propose."""
    import torch
    from safetensors.torch import save_file

    from worker.drafters.draft_vocab import write_draft_vocabulary

    folder.mkdir(parents=True, exist_ok=True)
    save_file(
        {name: t.detach().to(torch.bfloat16).contiguous() for name, t in tensors.items()},
        str(folder / "model.safetensors"),
    )
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_draft_vocabulary(folder, draft_vocab)
