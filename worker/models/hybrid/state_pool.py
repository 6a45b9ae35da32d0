"""The recurrent-state pool: a hybrid model's per-lane state in fixed slots, one per running lane.

A gated DeltaNet layer summarises every token a lane has seen in a state whose size does not
depend on the length (conv tail + delta-rule state: ~75 MB a lane for Qwen3-Next in float32), so
unlike K/V it is not paged: the pool holds `num_slots` whole states, allocated once,

    conv_tails    [slots, linear layers, conv_dim, kernel - 1]
    delta_states  [slots, linear layers, heads, dk, dv]

and a running lane holds one slot (as vLLM's mamba cache and SGLang's state pool hand out state
indices). The scheduler never runs more lanes than there are slots, so a slot is free whenever a
lane needs one; a preempted lane gives its slot back and takes one again when it resumes.
A verification's per-row states are staged outside the slots (recurrent_state.StagedStep, at
most MAX_VERIFY_TOKENS rows) until `commit` writes the accepted row's state into the slot.
"""

from __future__ import annotations

import torch

from worker.models.hybrid.config import HybridConfig
from worker.models.hybrid.recurrent_state import RecurrentState


class OutOfStateSlots(MemoryError):
    """Every slot is taken: the scheduler runs at most `num_slots` lanes, so this is a bug."""


class StatePool:
    def __init__(self, config: HybridConfig, num_slots: int, dtype: torch.dtype, device: torch.device | str):
        assert num_slots >= 1, num_slots
        layers = len(config.linear_layers)
        conv_shape = (num_slots, layers, config.conv_dim, config.linear_conv_kernel_dim - 1)
        self.conv_tails = torch.zeros(conv_shape, dtype=dtype, device=device)
        state_shape = (num_slots, layers, *state_dims(config))
        self.delta_states = torch.zeros(state_shape, dtype=state_dtype(dtype), device=device)
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))  # popped from the end: slot 0 first

    @staticmethod
    def slot_bytes(config: HybridConfig, dtype: torch.dtype) -> int:
        """One lane's state: conv tails in the activation dtype, delta-rule states in at least float32."""
        heads, dk, dv = state_dims(config)
        conv = config.conv_dim * (config.linear_conv_kernel_dim - 1) * _element_size(dtype)
        delta = heads * dk * dv * _element_size(state_dtype(dtype))
        return len(config.linear_layers) * (conv + delta)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def acquire(self) -> tuple[int, RecurrentState]:
        """A free slot, zeroed (a lane's state before its first token), and its state over it."""
        if not self._free:
            raise OutOfStateSlots(f"all {self.num_slots} recurrent-state slots are held")
        slot = self._free.pop()
        self.conv_tails[slot].zero_()
        self.delta_states[slot].zero_()
        return slot, RecurrentState.over(self.conv_tails[slot], self.delta_states[slot])

    def release(self, slot: int) -> None:
        assert slot not in self._free and 0 <= slot < self.num_slots, f"slot {slot} released twice"
        self._free.append(slot)


def state_dims(config: HybridConfig) -> tuple[int, int, int]:
    return config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)  # the delta rule runs in at least float32


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
