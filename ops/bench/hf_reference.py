"""transformers `generate` as a decode contender: plain, with prompt lookup, or with an assistant model.

Loaded from the same checkpoint as Arbor (a GGUF through `gguf_file=`, which dequantizes the same
weights), fed the same prompt token ids, EOS suppressed with `min_new_tokens` so lengths match
Arbor's `ignore_eos`. A streamer timestamps every step: its first `put` is the prompt, the
second is the token the prefill forward produced, and each later one is one target forward
(several tokens when drafts are accepted). Decode time runs from the second `put` to the last.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers.generation.streamers import BaseStreamer

from worker.models.default_model import default_model_path


class TimingStreamer(BaseStreamer):
    def __init__(self) -> None:
        self.puts: list[tuple[float, int]] = []  # (perf_counter, tokens in this put)

    def put(self, value: torch.Tensor) -> None:
        self.puts.append((time.perf_counter(), value.numel()))

    def end(self) -> None:
        pass


@dataclass(slots=True)
class HFRun:
    token_ids: list[int]
    num_decoded: int  # tokens after the prefill's
    decode_s: float
    wall_s: float
    num_forwards: int  # prefill included: it produced the first token


def load_reference(model: str | Path | None, dtype: str) -> transformers.PreTrainedModel:
    path = Path(model) if model else default_model_path()
    kwargs = {"dtype": getattr(torch, dtype)}
    if path.suffix == ".gguf":
        loaded = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, **kwargs)
    else:
        loaded = transformers.AutoModelForCausalLM.from_pretrained(path, **kwargs)
    return loaded.eval()


@torch.inference_mode()
def hf_generate(
    model: transformers.GenerationMixin,  # a causal LM (load_reference's); PreTrainedModel has no generate
    prompt_ids: list[int],
    max_tokens: int,
    temperature: float,
    seed: int,
    pad_token_id: int,
    **extra: object,
) -> HFRun:
    """One prompt through `model.generate`; `extra` adds prompt_lookup_num_tokens or assistant_model."""
    streamer = TimingStreamer()
    torch.manual_seed(seed)
    sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
    input_ids = torch.tensor([prompt_ids])
    started = time.perf_counter()
    out = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=max_tokens,
        min_new_tokens=max_tokens,
        pad_token_id=pad_token_id,
        streamer=streamer,
        **sampling,
        **extra,
    )
    wall_s = time.perf_counter() - started
    token_ids = out[0, len(prompt_ids) :].tolist()
    (first_at, first_count), last_at = streamer.puts[1], streamer.puts[-1][0]
    return HFRun(token_ids, len(token_ids) - first_count, last_at - first_at, wall_s, len(streamer.puts) - 1)
