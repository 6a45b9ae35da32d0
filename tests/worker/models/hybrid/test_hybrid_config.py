"""Which hybrid checkpoints load: Qwen3-Next, Qwen3.5 text, and a composite qwen3_5 without vision
(its text model under `model.language_model.*`); vision parts are refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.support.tiny_hybrid_models import make_tiny_hybrid_model
from worker.models.checkpoint import CheckpointError
from worker.models.hybrid.config import FULL_ATTENTION, HybridConfig
from worker.models.hybrid.loader import text_tensors
from worker.models.loader import load_model

VISION_CONFIG = {"model_type": "qwen3_5_vision", "depth": 2, "hidden_size": 32, "num_heads": 2}


@pytest.fixture(scope="module")
def text_model(tmp_path_factory) -> Path:
    return make_tiny_hybrid_model(tmp_path_factory.mktemp("text"), "qwen3_5_text")


def _composite(text_model: Path, folder: Path, **extra) -> Path:
    """The same weights as a composite checkpoint: config with `text_config`, text under language_model."""
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_text((text_model / name).read_text())
    text = json.loads((text_model / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "text_config": text, **extra}))
    tensors = load_file(str(text_model / "model.safetensors"))
    renamed = {name.replace("model.", "model.language_model.", 1): t for name, t in tensors.items()}
    save_file(renamed, str(folder / "model.safetensors"))
    return folder


def _logits(folder: Path) -> torch.Tensor:
    decoder = load_model(folder).decoder
    return decoder(torch.arange(3, 13), torch.arange(10), decoder.new_cache(16)).logits


def test_composite_config_without_vision_serves_its_text_model(text_model, tmp_path):
    composite = _composite(text_model, tmp_path / "composite")
    assert torch.equal(_logits(composite), _logits(text_model))


def test_composite_config_with_vision_parts_is_refused_by_name(text_model, tmp_path):
    composite = _composite(text_model, tmp_path / "vision", vision_config=VISION_CONFIG)
    with pytest.raises(CheckpointError, match=r"model_type='qwen3_5' with vision parts \(vision_config\)"):
        load_model(composite)


def test_vision_tensors_are_refused_by_name():
    tensors = {"model.language_model.norm.weight": torch.zeros(2), "model.visual.blocks.0.mlp.weight": torch.zeros(2)}
    with pytest.raises(CheckpointError, match=r"1 vision tensors \(model.visual.blocks.0.mlp.weight"):
        text_tensors(tensors)


def test_layer_types_default_to_full_attention_every_fourth_layer():
    raw = dict(model_type="qwen3_next", vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=8)
    raw |= dict(num_attention_heads=2, full_attention_interval=4)
    config = HybridConfig.from_hf(raw)
    assert config.attention_layers == [3, 7]
    assert config.layer_types[3] == FULL_ATTENTION
    assert config.rotary_dim == 64  # head_dim 256 by default, a quarter of it rotated


@pytest.mark.parametrize(
    ("override", "message"),
    [(dict(hidden_act="gelu"), "hidden_act='gelu'"), (dict(attn_output_gate=False), "attn_output_gate")],
)
def test_what_the_decoder_does_not_implement_is_refused(override, message):
    raw = dict(model_type="qwen3_5_text", vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=4)
    with pytest.raises(CheckpointError, match=message):
        HybridConfig.from_hf(raw | dict(num_attention_heads=2) | override)


def test_hybrids_load_dense_in_float32_by_default_and_refuse_an_unknown_format(text_model):
    """Quantized formats are served (test_hybrid_quantized.py); a name outside the rule's is refused."""
    assert load_model(text_model, dtype="auto", quantize="none").decoder.dtype == torch.float32
    assert load_model(text_model).formats.is_exact_path  # a float checkpoint under `auto`
    with pytest.raises(ValueError, match="quantize='int3'"):
        load_model(text_model, quantize="int3")
