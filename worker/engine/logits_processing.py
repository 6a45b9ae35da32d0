"""Raw logits -> the target's processed distribution, and one token drawn from it.

Processing follows vLLM's v1 sampler, in its order, after JSON mode's mask (tokens that would
break the JSON become -inf first, as vLLM applies its grammar bitmask before sampling):
  0. min tokens (vLLM's `min_tokens`): a row that has generated fewer cannot pick a stop id (EOS
     unless ignore_eos, stop_token_ids): their logits become -inf;
  1. logit bias (OpenAI's `logit_bias`): each listed token's bias added to its raw logit;
  2. penalties: repetition (HF semantics: over prompt and generated tokens, a positive logit is
     divided by the penalty, a negative one multiplied), then frequency and presence (OpenAI
     semantics: over generated tokens only, `- f * count - p * (count > 0)`);
  3. greedy requests stop here: the token is the argmax of the biased, penalized logits;
  4. temperature, then min-p, then top-k, then top-p; masked entries become -inf.

Drawing is by inverse CDF over the vocabulary with exactly one float64 uniform per emitted token.
Speculative verification draws at each tree node from that node's processed distribution with the
same generator, so a seeded request emits the very tokens plain decoding would, draw for draw.

Logprobs are those of the raw model logits (vLLM's default `logprobs_mode="raw_logprobs"`): they
describe the model, not the request's penalties and temperature, and are the same under every
speculation mode.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from shared.sampling import SamplingParams


@dataclass(slots=True)
class TokenLogprobs:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token_id, logprob), most likely first


def process_logits(
    logits: torch.Tensor,  # [N, V]
    params: SamplingParams,
    prompt_ids: Sequence[int] | torch.Tensor,
    output_ids: Sequence[Sequence[int]],
    stop_ids: Collection[int] = (),  # the sequence's: what min_tokens holds back
    allowed: torch.Tensor | None = None,  # [V] bool, a structured output's: every other token is masked
) -> torch.Tensor:  # [N, V]
    """Row i has generated `output_ids[i]` after the shared prompt (rows are tree nodes or lanes).

    Returns a new tensor (float32, or float64 for float64 input); the input is not modified.
    """
    assert logits.dim() == 2 and logits.shape[0] == len(output_ids), (tuple(logits.shape), len(output_ids))
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32), copy=True)
    if allowed is not None:
        logits.masked_fill_(~allowed.to(logits.device), float("-inf"))
    _apply_min_tokens(logits, params.min_tokens, output_ids, stop_ids)
    _apply_logit_bias(logits, params.logit_bias)
    _apply_penalties(logits, params, prompt_ids, output_ids)
    if params.greedy:
        return logits
    logits /= params.temperature
    if params.min_p > 0.0:
        _apply_min_p(logits, params.min_p)
    if params.top_k > 0:
        _apply_top_k(logits, params.top_k)
    if params.top_p < 1.0:
        _apply_top_p(logits, params.top_p)
    return logits


def sample_from(logits_row: torch.Tensor, generator: torch.Generator) -> int:
    """One token from softmax(logits_row) [V], consuming exactly one uniform from `generator`.

    Inverse CDF in vocabulary order: with cdf[i] = P(token <= i) and u ~ U[0, 1), the token is the
    first i with cdf[i] > u. Example: probs [0.2, 0.0, 0.5, 0.3] give cdf [0.2, 0.2, 0.7, 1.0];
    u = 0.65 picks token 2. A zero-probability token repeats its predecessor's cdf, so it is never
    the *first* index above u; dividing by cdf[-1] makes the last entry exactly 1.0 > u.
    """
    probs = torch.softmax(logits_row.to(torch.float64), dim=-1)  # [V]
    cdf = torch.cumsum(probs, dim=-1)  # [V]
    cdf /= cdf[-1].clone()
    # The draw happens on the CPU generator, so a seed gives the same stream on every device.
    u = torch.rand(1, generator=generator, dtype=torch.float64).to(cdf.device)  # [1]
    return int(torch.searchsorted(cdf, u, right=True).item())


def greedy_token(logits_row: torch.Tensor) -> int:
    """Argmax of [V]; ties go to the lowest token id."""
    return int(torch.argmax(logits_row).item())


def make_generator(seed: int | None) -> torch.Generator:
    """A CPU generator per request; no seed means a fresh random one (never a shared global stream)."""
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little")
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed % 2**64)  # OpenAI seeds may be negative; torch wants an unsigned 64-bit seed
    return generator


def logprobs_of(logits_row: torch.Tensor, token_id: int, num_top: int) -> TokenLogprobs:
    """OpenAI `logprobs`/`top_logprobs` for one emitted token, from the raw model logits [V]."""
    logprobs = torch.log_softmax(logits_row.to(torch.float32), dim=-1)  # [V]
    top: list[tuple[int, float]] = []
    if num_top > 0:
        values, ids = torch.topk(logprobs, min(num_top, logprobs.shape[-1]))
        top = list(zip(ids.tolist(), values.tolist()))
    return TokenLogprobs(token_id, float(logprobs[token_id]), top)


def changes_greedy_choice(params: SamplingParams) -> bool:
    """Whether processing can move the argmax, i.e. a greedy token is not simply the raw logits'
    argmax (temperature and top-k/p/min-p masks cannot; bias, penalties and a structured output's mask can).
    min_tokens can too, but only while the sequence is short: the caller checks that."""
    return (
        bool(params.logit_bias)
        or params.repetition_penalty != 1.0
        or params.presence_penalty != 0.0
        or params.frequency_penalty != 0.0
        or params.structured is not None
    )


def _apply_min_tokens(
    logits: torch.Tensor, min_tokens: int, output_ids: Sequence[Sequence[int]], stop_ids: Collection[int]
) -> None:  # logits [N, V], in place
    short = [row for row, ids in enumerate(output_ids) if len(ids) < min_tokens]
    if not short or not stop_ids:
        return
    ids = torch.tensor(sorted(stop_ids), dtype=torch.long, device=logits.device)  # [S]
    rows = torch.tensor(short, dtype=torch.long, device=logits.device)  # [R]
    logits[rows.unsqueeze(1), ids.unsqueeze(0)] = float("-inf")


def _apply_logit_bias(logits: torch.Tensor, logit_bias: dict[int, float]) -> None:  # logits [N, V], in place
    if not logit_bias:
        return
    assert max(logit_bias) < logits.shape[1], "logit_bias token id out of vocab (the worker checks at intake)"
    token_ids = torch.tensor(list(logit_bias), dtype=torch.long, device=logits.device)  # [B]
    logits[:, token_ids] += torch.tensor(list(logit_bias.values()), dtype=logits.dtype, device=logits.device)


def _apply_penalties(
    logits: torch.Tensor,  # [N, V], edited in place
    params: SamplingParams,
    prompt_ids: Sequence[int] | torch.Tensor,
    output_ids: Sequence[Sequence[int]],
) -> None:
    has_repetition = params.repetition_penalty != 1.0
    has_openai = params.frequency_penalty != 0.0 or params.presence_penalty != 0.0
    if not (has_repetition or (has_openai and any(output_ids))):
        return
    counts = _output_counts(output_ids, logits)  # [N, V]
    if has_repetition:
        seen = counts > 0  # [N, V]
        seen |= _prompt_mask(prompt_ids, logits)  # [V] broadcast over rows
        penalty = torch.where(seen, params.repetition_penalty, 1.0).to(logits.dtype)  # [N, V]
        logits.copy_(torch.where(logits > 0, logits / penalty, logits * penalty))
    if params.frequency_penalty != 0.0:
        logits -= params.frequency_penalty * counts
    if params.presence_penalty != 0.0:
        logits -= params.presence_penalty * (counts > 0).to(logits.dtype)


def _output_counts(output_ids: Sequence[Sequence[int]], logits: torch.Tensor) -> torch.Tensor:
    """How often each row generated each token: [N, V], built with one scatter, no vocabulary loop."""
    counts = torch.zeros_like(logits)  # [N, V]
    lengths = torch.tensor([len(ids) for ids in output_ids], device=logits.device)  # [N]
    flat_ids = torch.tensor([t for ids in output_ids for t in ids], dtype=torch.long, device=logits.device)
    if flat_ids.numel() == 0:
        return counts
    assert int(flat_ids.min()) >= 0 and int(flat_ids.max()) < logits.shape[1], "output token id out of vocab"
    rows = torch.repeat_interleave(torch.arange(len(output_ids), device=logits.device), lengths)  # [total]
    counts.index_put_((rows, flat_ids), torch.ones_like(flat_ids, dtype=logits.dtype), accumulate=True)
    return counts


def _prompt_mask(prompt_ids: Sequence[int] | torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    mask = torch.zeros(logits.shape[1], dtype=torch.bool, device=logits.device)  # [V]
    ids = torch.as_tensor(prompt_ids, dtype=torch.long, device=logits.device)  # [P]
    mask[ids] = True
    return mask


def _apply_min_p(logits: torch.Tensor, min_p: float) -> None:
    # Keep tokens whose probability is at least min_p times the most likely token's.
    probs = torch.softmax(logits, dim=-1)  # [N, V]
    threshold = min_p * probs.amax(dim=-1, keepdim=True)  # [N, 1]
    logits.masked_fill_(probs < threshold, float("-inf"))


def _apply_top_k(logits: torch.Tensor, top_k: int) -> None:
    # Ties with the k-th largest logit survive, as in vLLM and HF.
    if top_k >= logits.shape[1]:
        return
    kth_largest = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # [N, 1]
    logits.masked_fill_(logits < kth_largest, float("-inf"))


def _apply_top_p(logits: torch.Tensor, top_p: float) -> None:
    # Ascending sort: drop the least likely tokens while their total mass stays <= 1 - top_p,
    # always keeping the most likely one. Example: probs [0.1, 0.3, 0.6], top_p 0.8 -> cumulative
    # [0.1, 0.4, 1.0] <= 0.2 drops only the 0.1 token.
    sorted_logits, order = torch.sort(logits, dim=-1)  # [N, V] ascending
    cumulative = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)  # [N, V]
    drop_sorted = cumulative <= 1.0 - top_p  # [N, V]
    drop_sorted[:, -1] = False
    drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)  # back to vocabulary order
    logits.masked_fill_(drop, float("-inf"))
