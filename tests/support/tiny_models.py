"""Tiny random checkpoints in real Hugging Face format, built with transformers at test time."""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"  # noqa: E501
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n",
    "Speculative decoding drafts tokens and verifies them in one forward pass.",
    "1 2 3 4 5 6 7 8 9 10, lists: apples, pears, plums; questions? answers!",
    "Hello world! How are you today? I am fine, thank you very much.",
]

FAMILY_CONFIGS: dict[str, dict] = {
    "llama": dict(model_type="llama", architectures=["LlamaForCausalLM"]),
    "qwen2": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"]),
    "qwen3": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=16),
}


def train_tokenizer(vocab_size: int = 320) -> tokenizers.Tokenizer:
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS, trainer=trainer)
    return tokenizer


def make_tiny_model(folder: Path, family: str = "qwen3", seed: int = 0, **overrides) -> Path:
    """Write config.json, model.safetensors, tokenizer files for a random tiny model; return the folder."""
    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer()
    tokenizer.save(str(folder / "tokenizer.json"))
    config = dict(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.token_to_id("<|im_end|>"),
    )
    config.update(FAMILY_CONFIGS[family])
    config.update(overrides)
    hf_config = transformers.AutoConfig.for_model(**config)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    _scale_up_random_weights(model, seed)
    model.save_pretrained(folder)
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": CHATML_TEMPLATE,
                "eos_token": "<|im_end|>",
                "bos_token": None,
                "add_bos_token": False,
            }
        )
    )
    return folder


def _scale_up_random_weights(model, seed: int) -> None:
    """HF initialises with std 0.02, which makes every logit nearly equal; larger weights give the
    peaked, varied distributions that exercise greedy ties and sampling masks like a real model."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.copy_(1.0 + 0.1 * torch.randn(parameter.shape, generator=generator))
            else:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.15)
