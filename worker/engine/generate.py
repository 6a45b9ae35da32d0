"""In-process generation for one prompt: what `arbor generate` and the benchmarks run."""

from __future__ import annotations

from dataclasses import dataclass

import tokenizers

from shared.sampling import SamplingParams
from worker.engine.runner import ModelRunner
from worker.engine.stats import SpecStats
from worker.engine.text_output import TextOutput

PREFILL_CHUNK = 512


@dataclass(slots=True)
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str
    stats: SpecStats


def generate(
    runner: ModelRunner,
    tokenizer: tokenizers.Tokenizer,
    prompt_ids: list[int],
    params: SamplingParams,
    request_id: str = "generate",
) -> GenerationResult:
    sequence = runner.start(request_id, prompt_ids, params)
    text_output = TextOutput(tokenizer, params.stop, prompt_ids, min_tokens=params.min_tokens)
    pieces: list[str] = []
    while sequence.num_to_prefill > 0:
        runner.prefill(sequence, PREFILL_CHUNK)
    while not sequence.finished:
        # One token at a time, as the worker does, so min_tokens counts the same whatever a step emitted.
        pieces += [text_output.add([token]) for token in runner.decode_step(sequence)]
        if text_output.stopped:
            sequence.finish_reason = "stop"
            runner.finished(sequence)
    pieces.append(text_output.finish())
    return GenerationResult("".join(pieces), sequence.output_ids, sequence.finish_reason or "stop", sequence.stats)
