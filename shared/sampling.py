"""Per-request sampling parameters: plain data, shared by the gateway (validation) and the worker."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.structured_output import StructuredOutput

LOGIT_BIAS_LIMIT = 100.0  # OpenAI's: -100 all but bans a token, +100 all but forces it


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means off
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0  # OpenAI semantics, over generated tokens
    frequency_penalty: float = 0.0  # OpenAI semantics, over generated tokens
    repetition_penalty: float = 1.0  # HF/vLLM semantics, over prompt and generated tokens
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit, OpenAI's range
    min_tokens: int = 0  # vLLM's: no EOS or stop token, and no stop string, before this many tokens
    structured: StructuredOutput | None = None  # the grammar the text follows (shared/structured_output.py)
    constraint_after: str | None = None  # the grammar starts after this text (a think close tag) is out

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def __post_init__(self) -> None:
        # 0: nothing is generated (a completion that only scores its prompt: echo or prompt_logprobs)
        _check(self.max_tokens >= 0, "max_tokens", self.max_tokens, "must be at least 0")
        _check(self.temperature >= 0.0, "temperature", self.temperature, "must be >= 0")
        _check(0.0 < self.top_p <= 1.0, "top_p", self.top_p, "must be in (0, 1]")
        _check(self.top_k >= 0, "top_k", self.top_k, "must be >= 0 (0 disables it)")
        _check(0.0 <= self.min_p <= 1.0, "min_p", self.min_p, "must be in [0, 1]")
        _check(self.repetition_penalty > 0.0, "repetition_penalty", self.repetition_penalty, "must be > 0")
        _check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", self.presence_penalty, "must be in [-2, 2]")
        _check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", self.frequency_penalty, "must be in [-2, 2]")
        _check(0 <= self.min_tokens <= self.max_tokens, "min_tokens", self.min_tokens, "must be in [0, max_tokens]")
        _check(
            not (self.structured and self.min_tokens),
            "min_tokens",
            self.min_tokens,
            "cannot be combined with a structured output, which ends the text when its grammar is complete",
        )
        for token_id, bias in self.logit_bias.items():
            _check(token_id >= 0, "logit_bias", token_id, "is not a token id")
            _check(
                -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT,
                f"logit_bias[{token_id}]",
                bias,
                f"must be in [-{LOGIT_BIAS_LIMIT:g}, {LOGIT_BIAS_LIMIT:g}]",
            )


def _check(ok: bool, name: str, value: object, rule: str) -> None:
    if not ok:
        raise ValueError(f"{name}={value!r} {rule}")
