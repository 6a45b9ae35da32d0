"""What a sequence keeps for its gated DeltaNet layers, with the same commit contract as the KV cache.

Per linear-attention layer, two tensors summarise every committed token:
- the conv tail [conv_dim, kernel - 1]: the short convolution's last inputs;
- the delta-rule state [heads, dk, dv].

A forward never overwrites them: each layer *stages* what it computed (the conv window, old tail
then the new tokens' inputs, and the delta-rule state after each new token, or only after the
last for a prefill chunk); `commit(num_new, num_kept)` then installs the state after the first
`num_kept` new tokens. Example: a chain verification over root + 3 drafts stages 4 states; two
drafts are accepted, so rows [0, 1, 2] are kept and the state after row 2 becomes the committed one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class StagedStep:
    conv_window: torch.Tensor  # [conv_dim, kernel - 1 + T]: committed tail, then the new tokens' inputs
    states: torch.Tensor  # [T, heads, dk, dv] after each new token, or [1, ...] after the last only
    every_position: bool  # False: only the last state was kept (a prefill chunk, committed whole)


class RecurrentState:
    def __init__(
        self,
        num_layers: int,
        conv_dim: int,
        conv_kernel: int,
        state_shape: tuple[int, int, int],  # (heads, dk, dv)
        dtype: torch.dtype,
        state_dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ):
        self.conv_tails = torch.zeros(num_layers, conv_dim, conv_kernel - 1, dtype=dtype, device=device)
        self.delta_states = torch.zeros(num_layers, *state_shape, dtype=state_dtype, device=device)
        self.staged: list[StagedStep | None] = [None] * num_layers

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.conv_tails, self.delta_states))

    def stage(self, layer: int, step: StagedStep) -> None:
        self.staged[layer] = step

    def commit(self, num_new: int, num_kept: int) -> None:
        """Install, in every layer, the state after the first `num_kept` of `num_new` staged tokens."""
        assert 0 <= num_kept <= num_new, (num_kept, num_new)
        width = self.conv_tails.shape[-1]
        for layer, step in enumerate(self.staged):
            if step is None:
                continue
            assert step.conv_window.shape[-1] == width + num_new, "commit does not match the last forward"
            if num_kept > 0:
                assert step.every_position or num_kept == num_new, "a prefill chunk is committed whole"
                self.delta_states[layer] = step.states[num_kept - 1 if step.every_position else -1]
                self.conv_tails[layer] = step.conv_window[:, num_kept : num_kept + width]
            self.staged[layer] = None

    def load(self, conv_tails: torch.Tensor, delta_states: torch.Tensor) -> None:
        self.conv_tails.copy_(conv_tails)
        self.delta_states.copy_(delta_states)
        self.staged = [None] * len(self.staged)
