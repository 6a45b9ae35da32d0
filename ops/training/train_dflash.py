"""Training a DFlash drafter (z-lab format) on a frozen target, by self-distillation.

At inference (worker/drafters/dflash.py) the drafter sees, for committed tokens 0..p-1, context
vectors c = hidden_norm(fc(target layer outputs)) and drafts one block for a root x_p:
    block = [x_p, M, M, ..., M] at positions p .. p+B-1, non-causal attention over (c_0..c_{p-1}
    and the block itself), rows 1..B-1 predicting positions p+1 .. p+B-1.
Training runs exactly that for many anchors p of one sequence at once: all blocks are stacked
into one batch of rows, and a mask lets each block see the context before its anchor and itself.

Worked example, T = 6 tokens a b c d e f, B = 3, anchors 2 and 3:
    block at 2: [c, M, M] positions 2,3,4; sees context 0..1 (a, b); rows 1,2 -> target's next
                token after c (position 3), and after d (position 4)
    block at 3: [d, M, M] positions 3,4,5; sees context 0..2; rows -> after d, after e
Row j of the block at p learns the target's distribution at position p+j-1 (its logits there,
from the captured final hidden state), i.e. what the target predicts after x_{p+j-1}. In the
target's own greedy answers that is exactly x_{p+j}. Later rows are down-weighted (an early miss
makes them irrelevant at inference), as DFlash does.
"""

from __future__ import annotations

import dataclasses
import random

import torch
import torch.nn.functional as F

from ops.training import updates
from ops.training.capture import CapturedSequence
from worker.drafters.dflash import DFlashModel
from worker.models.attention import grouped_attention
from worker.models.config import ModelConfig
from worker.models.rope import RotaryEmbedding, apply_rotary


@dataclasses.dataclass(slots=True)
class DFlashTrainConfig:
    block_size: int = 8  # root + 7 drafts: the tree mode's 8-node budget reaches depth 7
    num_layers: int = 2
    target_layer_ids: tuple[int, ...] = (1, 8, 15, 22, 28)
    anchors_per_sequence: int = 24
    row_decay: float = 4.0  # row j's loss weight is exp(-(j - 1) / row_decay)
    lr: float = 1e-3
    weight_decay: float = 0.01
    sequences_per_update: int = 8
    max_len: int = 320


def draft_config(target: ModelConfig, config: DFlashTrainConfig) -> ModelConfig:
    """The drafter's sizes: the target's layers (Qwen3-style, q/k norms), `num_layers` of them."""
    return dataclasses.replace(
        target, model_type="qwen3", num_hidden_layers=config.num_layers, qk_norm=True, attention_bias=False
    )


def init_model(served, config: DFlashTrainConfig) -> DFlashModel:
    """Draft layers start as copies of the target's last layers (q/k norms at 1); fc averages the
    target layers it reads, so the first context vectors already look like hidden states."""
    decoder = served.loaded.decoder
    model = DFlashModel(draft_config(decoder.config, config), len(config.target_layer_ids))
    target_layers = decoder.model.layers[-config.num_layers :]
    for layer, source in zip(model.layers, target_layers):
        missing, unexpected = layer.load_state_dict(source.state_dict(), strict=False)
        assert not unexpected and all("norm" in name for name in missing), (missing, unexpected)
    hidden = decoder.config.hidden_size
    with torch.no_grad():
        model.fc.weight.copy_(torch.eye(hidden).repeat(1, len(config.target_layer_ids)) / len(config.target_layer_ids))
        model.norm.weight.copy_(decoder.model.norm.weight)
    return model.float().train()


def block_hidden(
    model: DFlashModel,
    served,
    rotary: RotaryEmbedding,
    sequence: CapturedSequence,
    anchors: torch.Tensor,
    block_size: int,
    mask_token_id: int,
) -> torch.Tensor:
    """The drafter's normed outputs [A, B-1, hidden] for the blocks rooted at `anchors`, all at once."""
    decoder = served.loaded.decoder
    num_blocks, total = anchors.shape[0], sequence.token_ids.shape[0]
    positions = (anchors[:, None] + torch.arange(block_size)).flatten()  # [A * B]
    block_tokens = torch.full((num_blocks, block_size), mask_token_id)
    block_tokens[:, 0] = sequence.token_ids[anchors]
    assert sequence.layer_hidden is not None  # captured with the drafter's target layers
    context = model.hidden_norm(model.fc(sequence.layer_hidden.float()))  # [T, hidden]
    mask = _block_mask(anchors, total, block_size)
    cos_c, sin_c = rotary(torch.arange(total))
    cos_b, sin_b = rotary(positions)
    x = decoder.model.embed_tokens(block_tokens.flatten()).float()  # [A * B, hidden]
    for layer in model.draft_layers():
        context_k, context_v = layer.keys_values(context, cos_c, sin_c)
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        rows = h.shape[0]
        assert attn.q_norm is not None  # Qwen3 layers: q/k norms always
        q = attn.q_norm(attn.q_proj(h).view(rows, attn.num_heads, attn.head_dim))
        q = apply_rotary(q.transpose(0, 1), cos_b, sin_b)
        block_k, block_v = layer.keys_values(h, cos_b, sin_b)
        out = grouped_attention(q, torch.cat([context_k, block_k], 1), torch.cat([context_v, block_v], 1), mask)
        x = x + attn.o_proj(out.transpose(0, 1).reshape(rows, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.norm(x.view(num_blocks, block_size, -1)[:, 1:])


def block_losses(
    model: DFlashModel,
    served,
    rotary: RotaryEmbedding,
    sequence: CapturedSequence,
    vocab: torch.Tensor,
    vocab_index: torch.Tensor,
    config: DFlashTrainConfig,
    mask_token_id: int,
    rng: random.Random,
    stats: dict | None = None,
) -> torch.Tensor | None:
    """The weighted block loss of random anchors of one sequence (None if it is too short)."""
    size = config.block_size
    candidates = range(1, sequence.token_ids.shape[0] - size + 1)  # context before, a full block after
    if len(candidates) < 1:
        return None
    anchors = torch.tensor(sorted(rng.sample(candidates, min(config.anchors_per_sequence, len(candidates)))))
    drafted = block_hidden(model, served, rotary, sequence, anchors, size, mask_token_id)
    lm_weight = served.loaded.decoder.lm_head.weight[vocab]
    logits = drafted @ lm_weight.T  # [A, B-1, V]
    predicted_at = anchors[:, None] + torch.arange(size - 1)  # row j: the target's view after p+j-1
    with torch.no_grad():
        target_probs = torch.softmax(sequence.final_hidden[predicted_at].float() @ lm_weight.T, dim=-1)
    per_row = F.cross_entropy(logits.flatten(0, 1), target_probs.flatten(0, 1), reduction="none").view(len(anchors), -1)
    weights = torch.exp(-torch.arange(size - 1) / config.row_decay)
    if stats is not None:
        hits = logits.detach().argmax(-1) == vocab_index[sequence.target_next[predicted_at]]
        stats["rows"] = stats.get("rows", torch.zeros(size - 1)) + hits.float().sum(0)
        stats["blocks"] = stats.get("blocks", 0) + len(anchors)
        stats["accepted"] = stats.get("accepted", 0) + int(hits.long().cumprod(dim=1).sum())  # leading runs
    return (per_row * weights).sum(1).mean() / weights.sum()


def _block_mask(anchors: torch.Tensor, total: int, size: int) -> torch.Tensor:
    """[A * B, T + A * B] bool: block a sees context positions < anchor a, and all of block a."""
    num_blocks = anchors.shape[0]
    sees_context = torch.arange(total)[None, :] < anchors[:, None]  # [A, T]
    sees_context = sees_context.repeat_interleave(size, dim=0)
    own_block = torch.block_diag(*[torch.ones(size, size, dtype=torch.bool)] * num_blocks)
    return torch.cat([sees_context, own_block], dim=1)


def make_optimizer(model: DFlashModel, config: DFlashTrainConfig) -> torch.optim.Optimizer:
    return updates.make_optimizer(model, config.lr, config.weight_decay)


def train_updates(
    model: DFlashModel,
    served,
    data: list[CapturedSequence],
    vocab: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    config: DFlashTrainConfig,
    mask_token_id: int,
    start_update: int,
    stop_update: int,
    total_updates: int,
    progress,
) -> list[float]:
    """Run updates [start_update, stop_update) of a cosine schedule over total_updates; the loss of each."""
    decoder_config = served.loaded.decoder.config
    rotary = RotaryEmbedding(decoder_config, torch.float32)
    vocab_index = updates.vocabulary_index(vocab, decoder_config.vocab_size)

    def sequence_loss(sequence: CapturedSequence, rng: random.Random) -> torch.Tensor | None:
        return block_losses(model, served, rotary, sequence, vocab, vocab_index, config, mask_token_id, rng)

    return updates.run_updates(
        model,
        optimizer,
        data,
        sequence_loss,
        config.lr,
        config.sequences_per_update,
        start_update,
        stop_update,
        total_updates,
        progress,
    )
