"""Tokens per target forward on repetitive traffic, in process: what a draft source that needs no
training (suffix decoding, prompt lookup) gets out of text that repeats.

Requests run one after another through one runner, as one worker lane would serve them, so a
drafter that learns from finished requests (suffix decoding's tree of recent outputs) sees the
earlier ones. The prompts are a structured-extraction series: the same instruction over records
that share their fields, the shape agents and extraction pipelines send; an answer that quotes
its record, or repeats the previous answer's structure, is what the drafts can catch.
"""

from __future__ import annotations

import random

import tokenizers

from shared.sampling import SamplingParams
from worker.engine.runner import ModelRunner
from worker.engine.stats import SpecStats

PREFILL_CHUNK = 512
_NAMES = ["Ada Lovelace", "Alan Turing", "Grace Hopper", "Edsger Dijkstra", "Barbara Liskov", "Donald Knuth"]
_CITIES = ["London", "Manchester", "New York", "Amsterdam", "Boston", "Stanford"]


def extraction_prompts(tokenizer: tokenizers.Tokenizer, num_requests: int, seed: int = 0) -> list[list[int]]:
    """`num_requests` prompts asking for one record each as JSON, the earlier answers' records quoted."""
    rng = random.Random(seed)
    prompts = []
    for index in range(num_requests):
        name, city = rng.choice(_NAMES), rng.choice(_CITIES)
        record = f'{{"id": {index}, "name": "{name}", "city": "{city}", "year": {rng.randrange(1900, 2000)}}}'
        text = (
            "Extract the person as JSON with the keys id, name, city and year.\n"
            f"Record {index}: {name} (id {index}) lived in {city}.\n"
            f"Example answer: {record}\nAnswer: "
        )
        prompts.append(tokenizer.encode(text).ids)
    return prompts


def replay(runner: ModelRunner, prompts: list[list[int]], params: SamplingParams) -> SpecStats:
    """Decode every prompt in turn (each its own request id); the summed statistics."""
    total = SpecStats()
    for index, prompt_ids in enumerate(prompts):
        sequence = runner.start(f"replay-{index}", prompt_ids, params)
        while sequence.num_to_prefill > 0:
            runner.prefill(sequence, PREFILL_CHUNK)
        while not sequence.finished:
            runner.decode_step(sequence)
        total.merge(sequence.stats)
    return total
