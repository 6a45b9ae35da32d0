"""Hybrid decoders: Qwen3.5 and Qwen3-Next, gated DeltaNet layers interleaved with gated attention.

config (what a checkpoint asks for) -> delta_rule (the recurrence, chunked and per token) ->
gated_deltanet (short conv + delta rule layer) / gated_attention / moe -> recurrent_state and
hybrid_cache (what a sequence keeps between forwards) -> decoder -> loader.
"""
