"""Training data for drafters: token sequences and the target's view of them.

Sequences come from two sources: the target's own answers to the training prompts (greedy and
sampled, generated in batches by the transformers oracle, which decodes exactly like Arbor on this
model) and teacher-forced text that ships with every Python install (the standard library source).
For each sequence we keep what the drafters learn from: the target's hidden states and its argmax
next token at every position (the loss is cross-entropy on the target's argmax).
"""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm


@dataclass(slots=True)
class CapturedSequence:
    token_ids: torch.Tensor  # [T] int64
    final_hidden: torch.Tensor  # [T, hidden] bfloat16: after the final norm
    layer_hidden: torch.Tensor | None  # [T, len(layers) * hidden] bfloat16: outputs of chosen layers
    target_next: torch.Tensor  # [T] int64: target's argmax after position t


def self_distilled_sequences(
    served, conversations: list[list[dict]], max_new_tokens: int, batch_size: int, temperature: float, seed: int
) -> list[list[int]]:
    """Prompt + the target's own answer, for each conversation (batched, left-padded)."""
    import transformers

    from worker.models.default_model import default_model_path

    path = default_model_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    model.eval()
    prompts = [served.encode_chat(messages) for messages in conversations]
    eos_ids = served.loaded.checkpoint.eos_token_ids
    pad = eos_ids[0]
    torch.manual_seed(seed)
    sequences: list[list[int]] = []
    for start in tqdm(range(0, len(prompts), batch_size), desc=f"answers T={temperature}", unit="batch"):
        batch = prompts[start : start + batch_size]
        width = max(len(p) for p in batch)
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.inference_mode():
            out = model.generate(
                input_ids,
                attention_mask=attention,
                max_new_tokens=max_new_tokens,
                do_sample=temperature > 0,
                temperature=temperature or None,
                top_p=None,
                top_k=None,
                pad_token_id=pad,
                eos_token_id=eos_ids,
            )
        for prompt, row in zip(batch, out[:, width:].tolist()):
            answer = row[: row.index(pad) + 1] if pad in row else row
            sequences.append(prompt + answer)
    return sequences


def stdlib_sequences(served, num_sequences: int, length: int) -> list[list[int]]:
    """Windows of `length` tokens from the Python standard library's source (teacher-forced text)."""
    folder = Path(sysconfig.get_paths()["stdlib"])
    sequences: list[list[int]] = []
    for path in sorted(folder.glob("*.py")):
        ids = served.tokenizer.encode(path.read_text(errors="ignore"), add_special_tokens=False).ids
        for start in range(0, len(ids) - length, length * 4):  # spread windows over many files
            sequences.append(ids[start : start + length])
            if len(sequences) >= num_sequences:
                return sequences
    return sequences


def capture(served, sequences: list[list[int]], layers: tuple[int, ...] = ()) -> list[CapturedSequence]:
    """Run the target over each sequence once and keep hidden states and argmax next tokens."""
    decoder = served.loaded.decoder
    captured = []
    for ids in tqdm(sequences, desc="capturing target states", unit="seq"):
        cache = decoder.new_cache(len(ids))
        out = decoder(torch.tensor(ids), torch.arange(len(ids)), cache, hidden_layers=layers, want_final_hidden=True)
        layer_hidden = torch.cat([out.hidden[i] for i in layers], dim=-1).bfloat16() if layers else None
        captured.append(
            CapturedSequence(torch.tensor(ids), out.final_hidden.bfloat16(), layer_hidden, out.logits.argmax(dim=-1))
        )
    return captured
