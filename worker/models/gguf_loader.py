"""Load a llama.cpp GGUF file as a `Checkpoint`: float32 tensors in Hugging Face names and layout.

Three things llama.cpp's converter (convert_hf_to_gguf.py) did to the checkpoint are undone here:

1. Quantization: Q4_0/Q4_1/Q8_0 tensors are read into `Int4Weight`/`Int8Weight` as they are
   (gguf_blocks.py), so a quantized model loads without a float copy; the float32 path
   dequantizes them exactly as `gguf.quants.dequantize` does. Float tensors come as float32.
2. Names: `blk.3.attn_q.weight` becomes `model.layers.3.self_attn.q_proj.weight`, and so on.
3. Llama's q/k row order: llama.cpp rotates *adjacent* pairs, HF rotates the two *halves* of a head,
   so the converter interleaves each head's rows. With head_dim 4 and a head's rows HF [a0 a1 b0 b1]
   (a = first half, b = second half), the file holds [a0 b0 a1 b1]; `_undo_rope_permutation`
   turns it back. Qwen2/Qwen3 files are written in HF order and are left alone.

The tokenizer is rebuilt from the file's metadata (byte-level BPE only) with the pre-tokenizer
llama.cpp uses for the file's `tokenizer.ggml.pre`, so ids match what the file's producer intended.

Parsing the metadata (`GGUFReader`) takes seconds even for a 135M model, so a converted
checkpoint can be kept in a cache folder, keyed by the file's path, size and mtime; quantized
tensors are stored there quantized (one safetensors entry per field, `name#q`, `name#scales`, ...).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from safetensors.torch import load_file, save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from worker.kernels.quantized_weight import Int4Weight, Int8Weight, QuantizedWeight
from worker.models.checkpoint import Checkpoint, CheckpointError
from worker.models.gguf_blocks import QUANTIZED_TYPES, read_blocks

logger = logging.getLogger(__name__)

_QTYPE = gguf.GGMLQuantizationType
SUPPORTED_QUANT_TYPES = frozenset({_QTYPE.F32, _QTYPE.F16, _QTYPE.BF16, _QTYPE.Q4_0, _QTYPE.Q4_1, _QTYPE.Q8_0})
HF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

_GLOBAL_TENSOR_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_TENSOR_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",  # Qwen3 QK-norm
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
_CONTROL = 3
_USER_DEFINED = 4

# Split regexes as llama.cpp and the models' own tokenizer.json files spell them.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp (llama-vocab.cpp) groups pre-tokenizer names by the regexes they split with.
_DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact", "codeshell")  # "\p{N}" then the GPT-2 regex
_GPT2 = ("gpt2", "mpt", "olmo")
_LLAMA3 = ("llama-bpe", "llama3")
_QWEN2 = ("qwen2", "deepseek-r1-qwen")
SUPPORTED_PRE_TOKENIZERS = _DIGITS_THEN_GPT2 + _GPT2 + _LLAMA3 + _QWEN2

_REQUIRED = object()  # marks a metadata field with no default
_CACHE_FORMAT_VERSION = 2  # bump when the conversion changes, so stale cache entries are ignored


def load_gguf_checkpoint(path: Path, cache_dir: Path | None = None, keep_quantized: bool = False) -> Checkpoint:
    """Read a Llama/Qwen2/Qwen3 GGUF file; with `cache_dir`, reuse (or store) the converted result.

    With `keep_quantized` the Q4_0/Q4_1/Q8_0 tensors stay in `Checkpoint.quantized`; without, they
    are dequantized into `tensors` (float32) as before.
    """
    path = Path(path)
    _check_is_gguf(path)
    checkpoint = _cached_or_converted(path, cache_dir)
    return checkpoint if keep_quantized else checkpoint.dequantized()


def _cached_or_converted(path: Path, cache_dir: Path | None) -> Checkpoint:
    if cache_dir is None:
        return _convert(path)
    entry = _cache_entry(Path(cache_dir), path)
    if entry.is_dir():
        return _read_cache(entry, path)
    checkpoint = _convert(path)
    try:
        _write_cache(entry, checkpoint)
    except OSError as exc:  # a cache that cannot be written only costs time on the next start
        if not entry.is_dir():  # else another process finished the same entry first
            logger.warning("could not cache converted GGUF at %s: %s", entry, exc)
    return checkpoint


def _check_is_gguf(path: Path) -> None:
    if not path.is_file():
        raise CheckpointError(f"GGUF file not found: {path}")
    with path.open("rb") as file:
        magic = file.read(4)
    if magic != b"GGUF":
        raise CheckpointError(f"not a GGUF file (magic {magic!r}, expected b'GGUF'): {path}")


def _convert(path: Path) -> Checkpoint:
    reader = _open_reader(path)
    metadata = {name: field.contents() for name, field in reader.fields.items()}
    architecture = _architecture(metadata, path)
    tokenizer = _build_tokenizer(metadata, path)  # before the tensors: refuse in milliseconds, not seconds
    eos_token_ids = _eos_token_ids(metadata, path)
    bos_token_id = metadata.get("tokenizer.ggml.bos_token_id")
    tensors, quantized = _read_tensors(reader, metadata, architecture, path)
    shapes = {name: tuple(t.shape) for name, t in tensors.items()} | {n: w.shape for n, w in quantized.items()}
    return Checkpoint(
        config=_build_config(metadata, architecture, shapes, eos_token_ids, bos_token_id, path),
        tensors=tensors,
        tokenizer=tokenizer,
        chat_template=metadata.get("tokenizer.chat_template"),
        eos_token_ids=eos_token_ids,
        bos_token_id=bos_token_id,
        add_bos_token=bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
        special_tokens=_special_tokens(metadata, metadata["tokenizer.ggml.tokens"]),
        source=str(path),
        quantized=quantized,
    )


def _open_reader(path: Path) -> gguf.GGUFReader:
    try:
        return gguf.GGUFReader(path)
    except (ValueError, KeyError, IndexError) as exc:  # what GGUFReader raises on a damaged header
        raise CheckpointError(f"malformed GGUF file {path}: {exc}") from exc


def _required(metadata: dict[str, Any], key: str, path: Path) -> Any:
    if key not in metadata:
        raise CheckpointError(f"GGUF metadata field {key!r} is missing in {path}")
    return metadata[key]


def _architecture(metadata: dict[str, Any], path: Path) -> str:
    architecture = _required(metadata, "general.architecture", path)
    if architecture not in HF_ARCHITECTURES:
        raise CheckpointError(
            f"unsupported GGUF general.architecture {architecture!r} in {path} "
            f"(supported: {', '.join(HF_ARCHITECTURES)})"
        )
    return architecture


# ---- tensors -------------------------------------------------------------------------------------


def _read_tensors(
    reader: gguf.GGUFReader, metadata: dict[str, Any], architecture: str, path: Path
) -> tuple[dict[str, torch.Tensor], dict[str, QuantizedWeight]]:
    """Float tensors (float32) and quantized ones (as read), both under HF names and in HF row order."""
    num_heads = _required(metadata, f"{architecture}.attention.head_count", path)
    num_kv_heads = metadata.get(f"{architecture}.attention.head_count_kv", num_heads)
    tensors, quantized = {}, {}
    for tensor in reader.tensors:
        name = _hf_tensor_name(tensor.name, architecture, path)
        heads = _permuted_heads(name, architecture, num_heads, num_kv_heads)
        if tensor.tensor_type in QUANTIZED_TYPES and len(tensor.shape) == 2:
            weight = read_blocks(tensor.data, tensor.tensor_type, _hf_shape(tensor))
            if heads is not None:  # a row permutation: whole rows of groups move, each row intact
                weight = weight.rows(torch.from_numpy(_undo_rope_permutation(np.arange(weight.shape[0]), heads)))
            quantized[name] = weight
        else:
            dense = _dequantize(tensor, path)  # [rows, cols] as HF stores it, or [n] for norms
            tensors[name] = torch.from_numpy(dense if heads is None else _undo_rope_permutation(dense, heads))
    return tensors, quantized


def _permuted_heads(name: str, architecture: str, num_heads: int, num_kv_heads: int) -> int | None:
    """The head count whose q/k rows llama.cpp interleaved in this tensor, or None if untouched."""
    if architecture != "llama":
        return None
    if ".self_attn.q_proj." in name:
        return num_heads
    return num_kv_heads if ".self_attn.k_proj." in name else None


def _hf_shape(tensor: gguf.gguf_reader.ReaderTensor) -> tuple[int, int]:
    rows, cols = (int(n) for n in reversed(tensor.shape))  # GGUF lists dims innermost first
    return rows, cols


def _hf_tensor_name(gguf_name: str, architecture: str, path: Path) -> str:
    stem, _, kind = gguf_name.rpartition(".")  # kind: "weight" or "bias"
    if stem in _GLOBAL_TENSOR_NAMES:
        return f"{_GLOBAL_TENSOR_NAMES[stem]}.{kind}"
    prefix, layer, leaf = (stem.split(".") + ["", ""])[:3]
    if prefix == "blk" and layer.isdigit() and leaf in _LAYER_TENSOR_NAMES:
        return f"model.layers.{layer}.{_LAYER_TENSOR_NAMES[leaf]}.{kind}"
    raise CheckpointError(f"GGUF tensor {gguf_name!r} in {path} has no Hugging Face {architecture} equivalent")


def _dequantize(tensor: gguf.gguf_reader.ReaderTensor, path: Path) -> np.ndarray:
    qtype = tensor.tensor_type
    if qtype not in SUPPORTED_QUANT_TYPES:
        supported = ", ".join(sorted(t.name for t in SUPPORTED_QUANT_TYPES))
        raise CheckpointError(
            f"GGUF tensor {tensor.name!r} in {path} has unsupported type {qtype.name} (supported: {supported})"
        )
    weight = gguf.quants.dequantize(tensor.data, qtype)
    if qtype == _QTYPE.F32:
        weight = weight.copy()  # F32 comes back as a view of the read-only memory map
    expected_shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists dims innermost first
    assert weight.shape == expected_shape, (tensor.name, weight.shape, expected_shape)
    return weight


def _undo_rope_permutation(weight: np.ndarray, num_heads: int) -> np.ndarray:
    # Inverse of convert_hf_to_gguf's permute(): reshape(heads, 2, half) -> swap -> flatten.
    # Works for weights [heads * head_dim, hidden] and biases [heads * head_dim].
    half_head_dim = weight.shape[0] // num_heads // 2
    per_head = weight.reshape(num_heads, half_head_dim, 2, *weight.shape[1:])
    return np.ascontiguousarray(per_head.swapaxes(1, 2).reshape(weight.shape))


# ---- config --------------------------------------------------------------------------------------


def _build_config(
    metadata: dict[str, Any],
    architecture: str,
    shapes: dict[str, tuple[int, ...]],
    eos_token_ids: list[int],
    bos_token_id: int | None,
    path: Path,
) -> dict[str, Any]:
    def field(name: str, default: Any = _REQUIRED) -> Any:
        key = f"{architecture}.{name}"
        return _required(metadata, key, path) if default is _REQUIRED else metadata.get(key, default)

    hidden_size = int(field("embedding_length"))
    num_heads = int(field("attention.head_count"))
    return {
        "architectures": [HF_ARCHITECTURES[architecture]],
        "model_type": architecture,
        "hidden_act": "silu",
        "hidden_size": hidden_size,
        "intermediate_size": int(field("feed_forward_length")),
        "num_hidden_layers": int(field("block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(field("attention.head_count_kv", num_heads)),
        "head_dim": int(field("attention.key_length", hidden_size // num_heads)),
        "rms_norm_eps": float(field("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(field("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(field("context_length", 2048)),
        "vocab_size": int(shapes["model.embed_tokens.weight"][0]),
        "tie_word_embeddings": "lm_head.weight" not in shapes,
        "attention_bias": "model.layers.0.self_attn.q_proj.bias" in shapes,
        "rope_scaling": _rope_scaling(metadata, architecture),
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_ids[0] if len(eos_token_ids) == 1 else eos_token_ids,
    }


def _rope_scaling(metadata: dict[str, Any], architecture: str) -> dict[str, Any] | None:
    kind = metadata.get(f"{architecture}.rope.scaling.type", "none")
    if kind == "none":
        return None
    scaling = {"rope_type": kind, "factor": float(metadata[f"{architecture}.rope.scaling.factor"])}
    original = metadata.get(f"{architecture}.rope.scaling.original_context_length")
    if original is not None:
        scaling["original_max_position_embeddings"] = int(original)
    return scaling


# ---- tokenizer -----------------------------------------------------------------------------------


def _build_tokenizer(metadata: dict[str, Any], path: Path) -> Tokenizer:
    kind = _required(metadata, "tokenizer.ggml.model", path)
    if kind != "gpt2":
        raise CheckpointError(
            f"GGUF tokenizer.ggml.model {kind!r} in {path} is not supported (only 'gpt2', byte-level BPE)"
        )
    pre_type = metadata.get("tokenizer.ggml.pre", "<missing>")
    tokens = _required(metadata, "tokenizer.ggml.tokens", path)
    merges = [tuple(merge.split(" ", 1)) for merge in _required(metadata, "tokenizer.ggml.merges", path)]
    vocab = {token: token_id for token_id, token in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=pre_type in _LLAMA3)
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = _pre_tokenizer(pre_type, path)
    tokenizer.decoder = decoders.ByteLevel()
    _add_special_tokens(tokenizer, tokens, metadata.get("tokenizer.ggml.token_type", []))
    return tokenizer


def _pre_tokenizer(pre_type: str, path: Path) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre_type in _DIGITS_THEN_GPT2:
        # llama.cpp splits off every digit first (regex "\p{N}"), as HF's Digits(individual_digits) does
        digits = pre_tokenizers.Digits(individual_digits=True)
        return pre_tokenizers.Sequence([digits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    if pre_type in _GPT2:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre_type in _LLAMA3 or pre_type in _QWEN2:
        split = _LLAMA3_SPLIT if pre_type in _LLAMA3 else _QWEN2_SPLIT
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"), byte_level])
    raise CheckpointError(
        f"GGUF tokenizer.ggml.pre {pre_type!r} in {path} is not supported "
        f"(supported: {', '.join(SUPPORTED_PRE_TOKENIZERS)})"
    )


def _add_special_tokens(tokenizer: Tokenizer, tokens: list[str], token_types: list[int]) -> None:
    # Control tokens (<|im_start|>) must encode as one id and be skippable on decode; user-defined
    # ones (<think>) are matched whole too but are ordinary text, as llama.cpp treats them.
    control = [tokens[i] for i, kind in enumerate(token_types) if kind == _CONTROL]
    user_defined = [tokens[i] for i, kind in enumerate(token_types) if kind == _USER_DEFINED]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in user_defined])


def _eos_token_ids(metadata: dict[str, Any], path: Path) -> list[int]:
    keys = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
    token_ids = [int(metadata[key]) for key in keys if key in metadata]
    if not token_ids:
        raise CheckpointError(f"GGUF metadata field 'tokenizer.ggml.eos_token_id' is missing in {path}")
    return list(dict.fromkeys(token_ids))  # dedupe, keep order


def _special_tokens(metadata: dict[str, Any], tokens: list[str]) -> dict[str, str]:
    roles = {"bos_token": "bos", "eos_token": "eos", "unk_token": "unknown", "pad_token": "padding"}
    found = {role: metadata.get(f"tokenizer.ggml.{key}_token_id") for role, key in roles.items()}
    return {role: tokens[token_id] for role, token_id in found.items() if token_id is not None}


# ---- cache ---------------------------------------------------------------------------------------


def _cache_entry(cache_dir: Path, path: Path) -> Path:
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{_CACHE_FORMAT_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir / "gguf" / f"{path.stem}-{digest}"


def _read_cache(entry: Path, path: Path) -> Checkpoint:
    text = json.loads((entry / "checkpoint.json").read_text(encoding="utf-8"))
    stored = load_file(entry / "model.safetensors")
    quantized = {name: _quantized_from_fields(name, kind, stored) for name, kind in text["quantized"].items()}
    return Checkpoint(
        config=text["config"],
        tensors={name: tensor for name, tensor in stored.items() if _FIELD_MARK not in name},
        quantized=quantized,
        tokenizer=Tokenizer.from_file(str(entry / "tokenizer.json")),
        chat_template=text["chat_template"],
        eos_token_ids=text["eos_token_ids"],
        bos_token_id=text["bos_token_id"],
        add_bos_token=text["add_bos_token"],
        special_tokens=text["special_tokens"],
        source=str(path),
    )


def _write_cache(entry: Path, checkpoint: Checkpoint) -> None:
    # Written into a scratch folder and renamed into place, so a reader (another worker starting at
    # the same time) sees either a complete entry or none.
    entry.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    try:
        fields = {
            f"{name}{_FIELD_MARK}{key}": value
            for name, weight in checkpoint.quantized.items()
            for key, value in _quantized_fields(weight).items()
        }
        save_file({**checkpoint.tensors, **fields}, scratch / "model.safetensors")
        checkpoint.tokenizer.save(str(scratch / "tokenizer.json"))
        (scratch / "checkpoint.json").write_text(json.dumps(_cache_text(checkpoint)), encoding="utf-8")
        os.rename(scratch, entry)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _cache_text(checkpoint: Checkpoint) -> dict[str, Any]:
    return {
        "config": checkpoint.config,
        "chat_template": checkpoint.chat_template,
        "eos_token_ids": checkpoint.eos_token_ids,
        "bos_token_id": checkpoint.bos_token_id,
        "add_bos_token": checkpoint.add_bos_token,
        "special_tokens": checkpoint.special_tokens,
        "quantized": {name: _quantized_kind(weight) for name, weight in checkpoint.quantized.items()},
    }


# A quantized tensor is stored as its fields, "name#q", "name#scales", "name#mins"; its kind and
# group size go to checkpoint.json as "int4/32" or "int8/32".
_FIELD_MARK = "#"


def _quantized_fields(weight: QuantizedWeight) -> dict[str, torch.Tensor]:
    if isinstance(weight, Int4Weight):
        return {"q": weight.q, "scales": weight.scales, "mins": weight.mins}
    return {"q": weight.q, "scales": weight.scales}


def _quantized_kind(weight: QuantizedWeight) -> str:
    return f"{'int4' if isinstance(weight, Int4Weight) else 'int8'}/{weight.group_size}"


def _quantized_from_fields(name: str, kind: str, stored: dict[str, torch.Tensor]) -> QuantizedWeight:
    bits, group_size = kind.split("/")
    field = lambda key: stored[f"{name}{_FIELD_MARK}{key}"]  # noqa: E731
    if bits == "int4":
        return Int4Weight(field("q"), field("scales"), field("mins"), int(group_size))
    return Int8Weight(field("q"), field("scales"), int(group_size))
