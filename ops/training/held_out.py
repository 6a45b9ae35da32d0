"""Held-out acceptance during training: greedy drafting through the real runner on prompts never
trained on (prompts.HELD_OUT), as tokens per target forward."""

from __future__ import annotations


def held_out_acceptance(served, drafter, max_tokens: int = 64) -> float:
    """Tokens per target forward of greedy drafting on held-out prompts (never trained on)."""
    from ops.training.prompts import held_out_conversations
    from shared.sampling import SamplingParams
    from worker.engine.generate import generate
    from worker.engine.runner import ModelRunner

    decoder = served.loaded.decoder
    runner = ModelRunner(decoder, served.loaded.checkpoint.eos_token_ids, drafter)
    generated = forwards = 0
    for messages in held_out_conversations()[:6]:
        result = generate(runner, served.tokenizer, served.encode_chat(messages), SamplingParams(max_tokens=max_tokens))
        generated += result.stats.generated_tokens
        forwards += result.stats.target_forwards
    return generated / forwards
