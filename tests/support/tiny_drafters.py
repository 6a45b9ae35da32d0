"""Random drafters in the real checkpoint formats, sized for a tiny target, built at test time.

Tensor names and shapes are written out here from the formats' definitions (Qwen3-Next MTP,
z-lab DFlash), not derived from Arbor's modules, so a loader that expects the wrong shape fails.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tests.support.tiny_models import make_tiny_model

DFLASH_HEAD_DIM = 16


def read_config(target: Path | dict) -> dict:
    """A target's config.json as a dict (a dict passes through)."""
    return dict(target) if isinstance(target, dict) else json.loads((Path(target) / "config.json").read_text())


def layer_shapes(config: dict, qk_norm: bool, attention_bias: bool) -> dict[str, tuple[int, ...]]:
    """One Llama/Qwen decoder layer's tensors, as HF names them (without the `layers.N.` prefix)."""
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    shapes = {
        "self_attn.q_proj.weight": (heads * head_dim, hidden),
        "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
        "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
        "self_attn.o_proj.weight": (hidden, heads * head_dim),
        "mlp.gate_proj.weight": (inner, hidden),
        "mlp.up_proj.weight": (inner, hidden),
        "mlp.down_proj.weight": (hidden, inner),
        "input_layernorm.weight": (hidden,),
        "post_attention_layernorm.weight": (hidden,),
    }
    if qk_norm:
        shapes["self_attn.q_norm.weight"] = shapes["self_attn.k_norm.weight"] = (head_dim,)
    if attention_bias:
        for name in ("q", "k", "v"):
            shapes[f"self_attn.{name}_proj.bias"] = (shapes[f"self_attn.{name}_proj.weight"][0],)
    return shapes


def random_tensors(shapes: dict[str, tuple[int, ...]], seed: int, scale: float = 0.15) -> dict[str, torch.Tensor]:
    """Norm weights near 1, everything else N(0, scale): peaked distributions, like tiny_models."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in sorted(shapes.items()):
        noise = torch.randn(shape, generator=generator)
        tensors[name] = 1.0 + 0.1 * noise if "norm" in name else noise * scale
    return tensors


def mtp_shapes(target_config: dict) -> dict[str, tuple[int, ...]]:
    hidden = target_config["hidden_size"]
    model_type = target_config["model_type"]
    layer = layer_shapes(
        target_config,
        qk_norm=model_type == "qwen3",
        attention_bias=target_config.get("attention_bias", model_type == "qwen2"),
    )
    shapes = {f"mtp.layers.0.{name}": shape for name, shape in layer.items()}
    shapes.update(
        {
            "mtp.fc.weight": (hidden, 2 * hidden),
            "mtp.pre_fc_norm_embedding.weight": (hidden,),
            "mtp.pre_fc_norm_hidden.weight": (hidden,),
            "mtp.norm.weight": (hidden,),
        }
    )
    return shapes


def write_random_mtp(
    folder: Path,
    target: Path | dict,
    seed: int = 1,
    mtp_hidden: str | None = None,
    drop: Sequence[str] = (),
    reshape: dict[str, tuple[int, ...]] | None = None,
) -> Path:
    """A separate MTP head: folder/config.json + folder/model.safetensors holding mtp.* tensors.

    `drop` and `reshape` (tensor name -> shape) make broken checkpoints for the refusal tests.
    """
    config = read_config(target)
    shapes = {**mtp_shapes(config), **(reshape or {})}
    tensors = {name: t for name, t in random_tensors(shapes, seed).items() if name not in drop}
    folder.mkdir(parents=True, exist_ok=True)
    head_config = {
        "model_type": config["model_type"],
        "hidden_size": config["hidden_size"],
        "num_nextn_predict_layers": 1,
    }
    if mtp_hidden is not None:
        head_config["mtp_hidden"] = mtp_hidden
    (folder / "config.json").write_text(json.dumps(head_config))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def write_random_eagle3(folder: Path, target: Path | dict, target_layers: Sequence[int], seed: int = 3) -> Path:
    """An EAGLE-3-style MTP head: the mtp.* tensors plus mtp.target_fc [hidden, k * hidden], which
    fuses the k target layers that config.json's mtp_target_layers lists."""
    config = read_config(target)
    hidden = config["hidden_size"]
    shapes = {**mtp_shapes(config), "mtp.target_fc.weight": (hidden, len(target_layers) * hidden)}
    folder.mkdir(parents=True, exist_ok=True)
    head_config = {
        "model_type": config["model_type"],
        "hidden_size": hidden,
        "num_nextn_predict_layers": 1,
        "mtp_target_layers": list(target_layers),
    }
    (folder / "config.json").write_text(json.dumps(head_config))
    save_file(random_tensors(shapes, seed), str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def make_tiny_model_with_mtp(
    folder: Path,
    family: str = "qwen3",
    seed: int = 0,
    mtp_seed: int = 1,
    mtp_hidden: str | None = None,
    **overrides,
) -> Path:
    """A tiny target whose model.safetensors also holds a random MTP head, as Qwen3-Next ships it."""
    make_tiny_model(folder, family, seed, **overrides)
    weights = folder / "model.safetensors"
    tensors = load_file(str(weights))
    tensors.update(random_tensors(mtp_shapes(read_config(folder)), mtp_seed))
    save_file(tensors, str(weights), metadata={"format": "pt"})
    if mtp_hidden is not None:
        config = read_config(folder)
        config["mtp_hidden"] = mtp_hidden
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def dflash_config(
    target_config: dict,
    block_size: int,
    target_layer_ids: Sequence[int],
    num_layers: int,
    mask_token_id: int | None,
) -> dict:
    """A z-lab style config.json: Qwen3 sizes plus block_size and dflash_config."""
    hidden = target_config["hidden_size"]
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": DFLASH_HEAD_DIM,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 4096,
        "vocab_size": target_config["vocab_size"],
        "attention_bias": False,
        "tie_word_embeddings": False,
        "block_size": block_size,
        "num_target_layers": target_config["num_hidden_layers"],
        "dflash_config": {
            "mask_token_id": target_config["vocab_size"] - 1 if mask_token_id is None else mask_token_id,
            "target_layer_ids": list(target_layer_ids),
        },
    }


def dflash_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    hidden = config["hidden_size"]
    num_ids = len(config["dflash_config"]["target_layer_ids"])
    shapes = {
        "fc.weight": (hidden, num_ids * hidden),
        "hidden_norm.weight": (hidden,),
        "norm.weight": (hidden,),
    }
    for index in range(config["num_hidden_layers"]):
        for name, shape in layer_shapes(config, qk_norm=True, attention_bias=False).items():
            shapes[f"layers.{index}.{name}"] = shape
    return shapes


def write_random_dflash(
    folder: Path,
    target: Path | dict,
    block_size: int = 4,
    target_layer_ids: Sequence[int] = (0, 1),
    num_layers: int = 2,
    seed: int = 2,
    mask_token_id: int | None = None,
    config_edits: dict | None = None,
    drop: Sequence[str] = (),
    reshape: dict[str, tuple[int, ...]] | None = None,
) -> Path:
    """A random DFlash drafter (config.json + model.safetensors) for `target`.

    `config_edits` (top-level keys; None deletes) and `drop`/`reshape` make broken drafters.
    """
    config = dflash_config(read_config(target), block_size, target_layer_ids, num_layers, mask_token_id)
    shapes = {**dflash_shapes(config), **(reshape or {})}
    tensors = {name: t for name, t in random_tensors(shapes, seed).items() if name not in drop}
    for key, value in (config_edits or {}).items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


@dataclass(slots=True, frozen=True)
class SpeculationCheckpoints:
    target: Path  # a tiny target with an MTP head inside its model.safetensors
    dflash: Path  # a random DFlash drafter for it (block_size 4, one layer, conditioned on target layers 0 and 1)


@functools.cache
def speculation_checkpoints(family: str) -> SpeculationCheckpoints:
    """Built once per test process and shared by every test module (they take seconds to write)."""
    folder = Path(tempfile.mkdtemp(prefix=f"arbor-spec-{family}-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    target = make_tiny_model_with_mtp(folder / "target", family, num_hidden_layers=2)
    dflash = write_random_dflash(folder / "dflash", target, target_layer_ids=(0, 1), num_layers=1)
    return SpeculationCheckpoints(target, dflash)


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Tiny forwards are dispatch-bound: a second intra-op thread only adds spinning, badly so on a busy box."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def transformers_layer_outputs(causal_lm, token_ids: list[int]) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """A transformers model's per-decoder-layer outputs ({L: [T, hidden]}) and its final normed hidden [T, hidden].

    Read with forward hooks rather than `hidden_states`, whose last entry is post-norm in some
    transformers versions and pre-norm in others.
    """
    outputs: dict[int, torch.Tensor] = {}

    def keep(index: int):
        def hook(module, args, output) -> None:
            outputs[index] = (output[0] if isinstance(output, tuple) else output)[0]  # [T, hidden]

        return hook

    hooks = [layer.register_forward_hook(keep(i)) for i, layer in enumerate(causal_lm.model.layers)]
    try:
        with torch.no_grad():
            final = causal_lm.model(input_ids=torch.tensor([token_ids])).last_hidden_state[0]
    finally:
        for hook in hooks:
            hook.remove()
    return outputs, final
