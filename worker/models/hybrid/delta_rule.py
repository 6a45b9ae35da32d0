"""The gated delta rule: a linear-attention recurrence over a [key_dim, value_dim] state per head.

Per token t, with the state S [dk, dv], a decay g_t <= 0 (log space) and a write strength beta_t:

    S    = exp(g_t) * S                        forget a little of everything
    S    = S + k_t (beta_t (v_t - k_t S))      the delta rule: write only what S mispredicts for k_t
    o_t  = q_t S                               read

`recurrent_delta_rule` runs exactly that, keeping the state after every token (what speculative
verification needs: the state after the last accepted position), along a chain or a tree. `chunked_delta_rule` computes
the same outputs and final state a chunk of tokens at a time (the UT transform of the DeltaNet
paper: the chunk's sequential writes condensed into one triangular solve), for prefill.
The formulation follows transformers' torch reference (its chunk size, its unit-triangular solve),
which is the oracle the tests compare against.

All tensors here are [heads, T, dim]: queries/keys already repeated to the value heads,
L2-normalised, queries scaled by dk^-0.5; g and beta [heads, T].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK_SIZE = 64


def recurrent_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial: torch.Tensor,
    parents: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs [heads, T, dv] and the state after each token [T, heads, dk, dv], from `initial` [heads, dk, dv].

    `parents[t]` is the earlier token whose state token t continues (-1: `initial`); None is a
    chain (t - 1). A tree's nodes each continue their parent's state, siblings the same one.
    """
    num_tokens = q.shape[1]
    outputs: list[torch.Tensor] = []
    states: list[torch.Tensor] = []
    for t in range(num_tokens):
        parent = t - 1 if parents is None else parents[t]
        state = initial if parent < 0 else states[parent]
        state = state * g[:, t].exp()[:, None, None]
        predicted = torch.einsum("hk,hkv->hv", k[:, t], state)  # what the state already says for k_t
        delta = (v[:, t] - predicted) * beta[:, t, None]  # [heads, dv]
        state = state + k[:, t, :, None] * delta[:, None, :]
        outputs.append(torch.einsum("hk,hkv->hv", q[:, t], state))
        states.append(state)
    return torch.stack(outputs, dim=1), torch.stack(states)


def chunked_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk_size: int = CHUNK_SIZE,
    offset: int = 0,
    keep_chunk_states: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Outputs [heads, T, dv], the final state [heads, dk, dv] and, if `keep_chunk_states`, the
    state after each chunk [chunks, heads, dk, dv], from `state` [heads, dk, dv].

    `offset` tokens of inert padding (k = v = beta = g = 0: they neither write nor decay) go
    before the first token, so chunks end where a forward starting `offset` tokens after a chunk
    boundary would have them end: at whole multiples of `chunk_size` from the sequence's start
    (the states the prefill cache keeps at block boundaries).

    Within a chunk (positions i >= j, cumulative log decay c):
      decay[i, j] = exp(c_i - c_j)                  how much of token j's write survives to i
      (I + tril(beta k k^T * decay, -1)) u = beta v  the chunk's corrected values, all at once
    then each chunk reads the state carried in from the previous one and hands its own on.
    """
    num_tokens = q.shape[1]
    pad = (-(offset + num_tokens)) % chunk_size  # padded tokens have k = v = beta = 0: they write nothing
    q, k, v = (F.pad(x, (0, 0, offset, pad)) for x in (q, k, v))
    g, beta = (F.pad(x, (offset, pad)) for x in (g, beta))
    heads = q.shape[0]
    q, k, v = (x.reshape(heads, -1, chunk_size, x.shape[-1]) for x in (q, k, v))  # [h, chunks, C, d]
    g, beta = g.reshape(heads, -1, chunk_size), beta.reshape(heads, -1, chunk_size)
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    cum = g.cumsum(dim=-1)  # [h, chunks, C]
    future = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).triu(1)
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(future, float("-inf")).exp()  # [h, n, C, C]
    system = (k_beta @ k.transpose(-1, -2)) * decay  # its diagonal is ignored: unitriangular
    values = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    state_keys = torch.linalg.solve_triangular(
        system, k_beta * cum.exp()[..., None], upper=False, unitriangular=True
    )  # what each corrected value must subtract of the carried-in state
    within = (q @ k.transpose(-1, -2)) * decay  # [h, n, C, C]
    q_read = q * cum.exp()[..., None]  # a query reads the carried-in state decayed to its position
    k_write = k * (cum[..., -1:] - cum).exp()[..., None]  # a write decayed to the chunk's end
    chunk_decay = cum[..., -1].exp()[..., None, None]  # [h, n, 1, 1]
    outputs = torch.empty_like(values)
    chunk_states = []
    for i in range(q.shape[1]):
        corrected = values[:, i] - state_keys[:, i] @ state  # [h, C, dv]
        outputs[:, i] = q_read[:, i] @ state + within[:, i] @ corrected
        state = state * chunk_decay[:, i] + k_write[:, i].transpose(-1, -2) @ corrected
        if keep_chunk_states:
            chunk_states.append(state)
    outputs = outputs.reshape(heads, -1, outputs.shape[-1])[:, offset : offset + num_tokens]
    return outputs, state, torch.stack(chunk_states) if keep_chunk_states else None
