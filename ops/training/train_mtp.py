"""Training an MTP head (Qwen3-Next `mtp.*` format) on a frozen target, by self-distillation.

The head learns the target's argmax k steps ahead. It is trained the way it drafts ("training-time
test"): step 1 pairs the target's hidden state h_t with token x_{t+1}; step s > 1 pairs the head's
own previous output with x_{t+s}, and attends, like at inference, to the committed step-1 pairs at
positions <= t plus the earlier steps of its own chain. Positions match the drafter's (t + s - 1).

Worked example, T = 6 tokens, 3 steps, n = T - 3 = 3 chains (t = 0, 1, 2):
    step 1 at t: (h_t, x_{t+1}) at position t      -> target argmax after x_{t+1}
    step 2 at t: (g1_t, x_{t+2}) at position t + 1  -> argmax after x_{t+2}; sees step-1 keys 0..t and itself
    step 3 at t: (g2_t, x_{t+3}) at position t + 2  -> argmax after x_{t+3}; sees step-1 keys 0..t, g2's key, itself
The softmax runs over a training vocabulary (every token that occurs as a target plus the most
frequent ones), which costs a fraction of the full 49k-way head and changes little: tokens the
target never predicts carry almost no probability for the drafter either.
"""

from __future__ import annotations

import dataclasses
from typing import cast

import torch
import torch.nn.functional as F

from ops.training import updates
from ops.training.capture import CapturedSequence
from worker.drafters.mtp import MtpHead
from worker.models.attention import grouped_attention
from worker.models.decoder import DecoderLayer
from worker.models.rope import RotaryEmbedding, apply_rotary


@dataclasses.dataclass(slots=True)
class MtpTrainConfig:
    num_steps: int = 3  # chain depth trained (and drafted by default)
    step_weights: tuple[float, ...] = (1.0, 0.6, 0.4)
    # Per step: soft cross-entropy against the target's full distribution (its logits at the same
    # position, over the training vocabulary), plus `feature_weight` x smooth-L1 between the head's
    # output and the target's own hidden state there (EAGLE's feature loss: the head's output is fed
    # back as the next step's hidden input, so it should live where the target's hidden states live).
    feature_weight: float = 1.0
    lr: float = 1e-3
    weight_decay: float = 0.01
    sequences_per_update: int = 8
    max_len: int = 320  # longer sequences are cut into windows


def init_head(served, num_target_layers: int = 0) -> MtpHead:
    """Start from the target's last decoder layer; fc passes the hidden half through (and an
    EAGLE-3-style head's target_fc passes the last of the layers it fuses, the highest)."""
    decoder = served.loaded.decoder
    config = decoder.config
    head = MtpHead(config, num_target_layers)
    head.layers[0].load_state_dict(decoder.model.layers[-1].state_dict())
    head.norm.load_state_dict(decoder.model.norm.state_dict())  # outputs start on the lm_head's scale
    hidden = config.hidden_size
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, hidden:] = torch.eye(hidden)
        head.fc.weight[:, :hidden] = 0.1 * torch.eye(hidden)
        if num_target_layers:
            head.target_fc.weight.zero_()
            head.target_fc.weight[:, -hidden:] = torch.eye(hidden)
    return head.float().train()


def step_one_hidden(head: MtpHead, sequence: CapturedSequence, n: int) -> torch.Tensor:
    """h_t for t < n as the head reads it [n, hidden]: the final hidden state, or an EAGLE-3-style
    head's target_fc over the target layers it fuses (captured in its order)."""
    if hasattr(head, "target_fc"):
        assert sequence.layer_hidden is not None, "a fused-layer head needs the target layers' states"
        return head.target_fc(sequence.layer_hidden[:n].float())
    return sequence.final_hidden[:n].float()


def training_vocabulary(sequences: list[CapturedSequence], vocab_size: int, extra: int = 512) -> torch.Tensor:
    """Every token the target ever predicts in the data, plus the `extra` most frequent input tokens.

    The softmax over this subset (~8k of 49k tokens here) costs a sixth of the full head, and tokens
    the target never predicts carry almost no probability for the drafter either.
    """
    predicted = torch.zeros(vocab_size, dtype=torch.int64)
    seen = torch.zeros(vocab_size, dtype=torch.int64)
    for sequence in sequences:
        predicted += torch.bincount(sequence.target_next, minlength=vocab_size)
        seen += torch.bincount(sequence.token_ids, minlength=vocab_size)
    return torch.unique(torch.cat([(predicted > 0).nonzero().flatten(), seen.topk(min(extra, vocab_size)).indices]))


def chain_hidden(
    head: MtpHead, served, rotary: RotaryEmbedding, sequence: CapturedSequence, num_steps: int
) -> list[torch.Tensor]:
    """The head's normed outputs g_s [n, hidden] for every chain start t < n = T - num_steps, per step."""
    decoder = served.loaded.decoder
    ids = sequence.token_ids
    n = ids.shape[0] - num_steps
    layer = cast(DecoderLayer, head.layers[0])  # to a type checker an nn.ModuleList holds plain Modules
    attn = layer.self_attn
    hidden = step_one_hidden(head, sequence, n)
    keys, values, outputs = [], [], []
    for step in range(num_steps):
        embedded = head.pre_fc_norm_embedding(decoder.model.embed_tokens(ids[step + 1 : step + 1 + n]).float())
        x = head.fc(torch.cat([embedded, head.pre_fc_norm_hidden(hidden)], dim=-1))  # [n, hidden]
        h = layer.input_layernorm(x)
        q = attn.q_proj(h).view(n, attn.num_heads, attn.head_dim)
        k = attn.k_proj(h).view(n, attn.num_kv_heads, attn.head_dim)
        v = attn.v_proj(h).view(n, attn.num_kv_heads, attn.head_dim)
        if attn.q_norm is not None:
            assert attn.k_norm is not None  # the family has both or neither
            q, k = attn.q_norm(q), attn.k_norm(k)
        cos, sin = rotary(torch.arange(step, step + n, device=ids.device))
        keys.append(apply_rotary(k.transpose(0, 1), cos, sin))
        values.append(v.transpose(0, 1))
        mask = _chain_mask(n, step + 1).to(ids.device)
        out = grouped_attention(
            apply_rotary(q.transpose(0, 1), cos, sin), torch.cat(keys, 1), torch.cat(values, 1), mask
        )
        x = x + attn.o_proj(out.transpose(0, 1).reshape(n, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        hidden = head.norm(x)  # g_s: the next step's hidden input, as the drafter feeds it back
        outputs.append(hidden)
    return outputs


def chain_losses(
    head: MtpHead,
    served,
    rotary: RotaryEmbedding,
    sequence: CapturedSequence,
    vocab: torch.Tensor,
    vocab_index: torch.Tensor,
    num_steps: int,
    feature_weight: float = 1.0,
    stats: dict | None = None,
) -> list[torch.Tensor]:
    """One loss per chain step over every start position of `sequence` (see the module docstring)."""
    n = sequence.token_ids.shape[0] - num_steps
    if n < 2:
        return []
    lm_weight = served.loaded.decoder.lm_head.weight[vocab]  # [train_vocab, hidden]
    losses = []
    for step, hidden in enumerate(chain_hidden(head, served, rotary, sequence, num_steps)):
        target_hidden = sequence.final_hidden[step + 1 : step + 1 + n].float()  # h_{t+s}: it predicted the label
        logits = hidden @ lm_weight.T
        with torch.no_grad():
            target_probs = torch.softmax(target_hidden @ lm_weight.T, dim=-1)
        loss = F.cross_entropy(logits, target_probs)
        if feature_weight:
            loss = loss + feature_weight * F.smooth_l1_loss(hidden, target_hidden)
        losses.append(loss)
        if stats is not None:
            targets = vocab_index[sequence.target_next[step + 1 : step + 1 + n]]
            hits = (logits.detach().argmax(-1) == targets).sum().item()
            stats.setdefault("hits", [0] * num_steps)[step] += hits
            stats.setdefault("count", [0] * num_steps)[step] += n
    return losses


def _chain_mask(n: int, num_blocks: int) -> torch.Tensor:
    """[n, num_blocks * n]: step-1 keys causally, each later step's key only for its own chain."""
    blocks = [torch.ones(n, n, dtype=torch.bool).tril()] + [torch.eye(n, dtype=torch.bool)] * (num_blocks - 1)
    return torch.cat(blocks, dim=1)


def windows(sequences: list[CapturedSequence], max_len: int) -> list[CapturedSequence]:
    out = []
    for s in sequences:
        for start in range(0, len(s.token_ids), max_len):
            stop = start + max_len
            layers = s.layer_hidden[start:stop] if s.layer_hidden is not None else None
            out.append(
                CapturedSequence(s.token_ids[start:stop], s.final_hidden[start:stop], layers, s.target_next[start:stop])
            )
    return out


def make_optimizer(head: MtpHead, config: MtpTrainConfig) -> torch.optim.Optimizer:
    return updates.make_optimizer(head, config.lr, config.weight_decay)


def train_updates(
    head: MtpHead,
    served,
    data: list,  # CapturedSequence, or what prepare_batch turns into them
    vocab: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    config: MtpTrainConfig,
    start_update: int,
    stop_update: int,
    total_updates: int,
    progress,
    prepare_batch=None,  # updates.run_updates': windows -> CapturedSequence (None: data is captured)
) -> list[float]:
    """Run updates [start_update, stop_update) of a cosine schedule over total_updates; the loss of each."""
    decoder = served.loaded.decoder
    rotary = RotaryEmbedding(decoder.config, torch.float32, decoder.device)
    vocab_index = updates.vocabulary_index(vocab.cpu(), decoder.config.vocab_size).to(vocab.device)

    def sequence_loss(sequence: CapturedSequence, rng) -> torch.Tensor | None:
        losses = chain_losses(
            head, served, rotary, sequence, vocab, vocab_index, config.num_steps, config.feature_weight
        )
        if not losses:
            return None
        total = sum(weight * loss for weight, loss in zip(config.step_weights, losses))
        assert isinstance(total, torch.Tensor)  # a sum of at least one loss
        return total

    return updates.run_updates(
        head,
        optimizer,
        data,
        sequence_loss,
        config.lr,
        config.sequences_per_update,
        start_update,
        stop_update,
        total_updates,
        progress,
        prepare_batch,
    )
