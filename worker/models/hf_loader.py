"""Hugging Face model folders: config.json, (sharded) safetensors, tokenizer.json, chat template."""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers
import torch
from safetensors.torch import load_file

from worker.models.checkpoint import Checkpoint, CheckpointError


def load_hf_checkpoint(folder: Path) -> Checkpoint:
    config = _read_json(folder / "config.json", required=True)
    tokenizer_config = _read_json(folder / "tokenizer_config.json")
    generation_config = _read_json(folder / "generation_config.json")
    tokenizer = _read_tokenizer(folder / "tokenizer.json")
    special_tokens = _special_tokens(tokenizer_config)
    return Checkpoint(
        config=config,
        tensors=_read_tensors(folder),
        tokenizer=tokenizer,
        chat_template=_chat_template(folder, tokenizer_config),
        eos_token_ids=_eos_token_ids(config, generation_config, tokenizer, special_tokens),
        bos_token_id=_token_id(tokenizer, special_tokens.get("bos_token"))
        if "bos_token" in special_tokens
        else config.get("bos_token_id"),
        add_bos_token=bool(tokenizer_config.get("add_bos_token", False)),
        special_tokens=special_tokens,
        source=str(folder),
    )


def _read_json(path: Path, required: bool = False) -> dict:
    if not path.exists():
        if required:
            raise CheckpointError(f"{path} not found: a Hugging Face model folder needs it")
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{path} is not valid JSON: {error}") from error


def _read_tokenizer(path: Path) -> tokenizers.Tokenizer:
    if not path.exists():
        raise CheckpointError(f"{path} not found: Arbor needs a fast tokenizer (tokenizer.json)")
    return tokenizers.Tokenizer.from_file(str(path))


def _read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        shard_names = sorted(set(_read_json(index)["weight_map"].values()))
    else:
        shard_names = sorted(p.name for p in folder.glob("*.safetensors"))
    if not shard_names:
        raise CheckpointError(f"no *.safetensors weights in {folder}")
    tensors: dict[str, torch.Tensor] = {}
    for name in shard_names:
        path = folder / name
        if not path.exists():
            raise CheckpointError(f"shard {path} named in the index is missing")
        tensors.update(load_file(str(path)))
    return tensors


def _chat_template(folder: Path, tokenizer_config: dict) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text()
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {entry["name"]: entry["template"] for entry in template}
        template = named.get("default")
    return template


def _special_tokens(tokenizer_config: dict) -> dict[str, str]:
    tokens = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = tokenizer_config.get(key)
        if isinstance(value, dict):  # AddedToken serialized as {"content": ...}
            value = value.get("content")
        if value:
            tokens[key] = value
    return tokens


def _token_id(tokenizer: tokenizers.Tokenizer, token: str | None) -> int | None:
    return None if token is None else tokenizer.token_to_id(token)


def _eos_token_ids(
    config: dict, generation_config: dict, tokenizer: tokenizers.Tokenizer, special_tokens: dict[str, str]
) -> list[int]:
    """generation_config.json wins (it lists every end-of-turn id); config.json and the tokenizer follow."""
    for source in (generation_config.get("eos_token_id"), config.get("eos_token_id")):
        if source is not None:
            return sorted(set(source if isinstance(source, list) else [source]))
    eos = _token_id(tokenizer, special_tokens.get("eos_token"))
    return [eos] if eos is not None else []
