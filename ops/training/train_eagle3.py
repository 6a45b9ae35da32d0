"""Training an EAGLE-3-style head: the MTP head (train_mtp.py) conditioned on a low, a middle and a
high target layer fused by `target_fc`, instead of the final hidden state alone.

The data is token ids only (engine_data.py's shards): every update draws its windows and runs the
frozen target over all of them in one batched prefill (`Decoder.forward_lanes`, one lane a
window), keeping the fused layers' outputs and the final hidden state; nothing is stored. The
chain is then trained exactly as train_mtp.py trains it (training-time test over the draft depth:
steps after the first feed back the head's own output), with the fused features as step 1's input.

It trains wherever the target sits: `device` "cuda" moves the frozen target and the head there.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import torch

from ops.training.capture import CapturedSequence
from ops.training.train_mtp import MtpTrainConfig, init_head, make_optimizer, train_updates
from worker.drafters.mtp import MtpHead
from worker.models.decoder import LaneRows

EXTRA_VOCAB = 512  # most frequent input tokens added to those the target answered with
# the answer tokens kept: the most frequent that make up this share of all answers. On the engine's
# 2M answer tokens all 18,888 distinct ones would be 19K draft tokens, 99 % of the answers are
# 9,632 of them, and a draft step's logits product grows with the vocabulary
ANSWER_COVERAGE = 0.99


def default_target_layers(num_layers: int) -> tuple[int, ...]:
    """Low, middle and high, as EAGLE-3 picks them (vLLM's 2, L // 2, L - 3), for L decoder layers."""
    return tuple(sorted({min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0)}))


@dataclasses.dataclass(slots=True)
class Eagle3TrainConfig(MtpTrainConfig):
    feature_weight: float = 0.0  # EAGLE-3 drops the feature loss: the fused input is not a layer's state
    max_len: int = 512  # windows of the engine's sequences (prompt + answer)
    target_layers: tuple[int, ...] = ()  # () -> default_target_layers


def warm_start_layers(num_layers: int) -> tuple[int, ...]:
    """Low, middle and the last layer: a head started from a plain MTP head reads the last layer's
    output (through the final norm), so the fused input can start as exactly that."""
    return tuple(sorted({min(2, num_layers - 1), num_layers // 2, num_layers - 1}))


@dataclasses.dataclass(slots=True)
class WarmStart:
    head: MtpHead
    target_layers: tuple[int, ...]
    vocab: torch.Tensor | None  # the plain head's draft vocabulary (None: it drafts over the whole vocabulary)


def warm_start(served, folder: Path) -> WarmStart:
    """A head to go on training from `folder`: an EAGLE-3-style head as it is, or one that drafts
    what the plain MTP head there drafts: its weights and vocabulary, and target_fc reading only
    the last layer's output, scaled by the final norm's gain (a post-norm head) or as it is
    (pre-norm). RMSNorm ignores its input's scale, so pre_fc_norm_hidden then sees what the plain
    head saw (up to the final norm's epsilon): training starts where that head stopped."""
    from worker.drafters.draft_checkpoint import read_draft_checkpoint
    from worker.drafters.draft_vocab import read_draft_vocabulary
    from worker.drafters.mtp import MTP_PREFIX, TARGET_LAYERS_KEY, hidden_source

    decoder = served.loaded.decoder
    config = decoder.config
    checkpoint = read_draft_checkpoint(folder)
    fused = tuple(checkpoint.config.get(TARGET_LAYERS_KEY) or ())
    layers = fused or warm_start_layers(config.num_hidden_layers)
    head = MtpHead(config, len(layers))
    tensors = {name[len(MTP_PREFIX) :]: t for name, t in checkpoint.tensors.items() if name.startswith(MTP_PREFIX)}
    missing, unexpected = head.load_state_dict(tensors, strict=False)
    if unexpected or set(missing) - {"target_fc.weight"} or (fused and missing):
        raise SystemExit(f"--init-from {folder}: not an MTP head of this target ({sorted(missing) or unexpected})")
    if not fused:
        hidden = config.hidden_size
        post_norm = hidden_source(checkpoint, config) == "post_norm"
        gain = decoder.model.norm.weight.detach().float() if post_norm else torch.ones(hidden)
        with torch.no_grad():
            head.target_fc.weight.zero_()
            head.target_fc.weight[:, -hidden:] = torch.diag(gain)
    vocab = read_draft_vocabulary(folder, config.vocab_size)
    return WarmStart(head.float().train(), layers, vocab)


def token_windows(sequences: list[list[int]], max_len: int) -> list[list[int]]:
    return [ids[start : start + max_len] for ids in sequences for start in range(0, len(ids), max_len)]


def answer_vocabulary(
    sequences, vocab_size: int, extra: int = EXTRA_VOCAB, coverage: float = ANSWER_COVERAGE
) -> torch.Tensor:
    """The tokens the target answers with (what it predicts), the most frequent first up to
    `coverage` of all answer tokens, plus the `extra` most frequent input tokens."""
    answered = torch.zeros(vocab_size, dtype=torch.int64)
    seen = torch.zeros(vocab_size, dtype=torch.int64)
    for sequence in sequences:
        ids = torch.tensor(sequence.token_ids)
        answered += torch.bincount(ids[sequence.prompt_length :], minlength=vocab_size)
        seen += torch.bincount(ids, minlength=vocab_size)
    counts, order = answered.sort(descending=True)
    covered = counts.cumsum(0) < coverage * counts.sum()  # those before the share is reached ...
    kept = order[: int(covered.sum()) + 1][counts[: int(covered.sum()) + 1] > 0]  # ... and the one reaching it
    return torch.unique(torch.cat([kept, seen.topk(min(extra, vocab_size)).indices]))


def target_states(served, windows: list[list[int]], layers: tuple[int, ...]) -> list[CapturedSequence]:
    """The frozen target over every window at once (one lane each): the fused layers' outputs
    concatenated in `layers` order, and the final hidden state. target_next is the data's next
    token (the target's own argmax on its greedy answers), kept for the accuracy counters only."""
    decoder = served.loaded.decoder
    lanes = [LaneRows(ids, list(range(len(ids))), decoder.new_cache(len(ids)), num_logits=0) for ids in windows]
    outputs = decoder.forward_lanes(lanes, layers, want_final_hidden=True)
    captured = []
    for ids, out in zip(windows, outputs, strict=True):
        token_ids = torch.tensor(ids, device=decoder.device)
        layer_hidden = torch.cat([out.hidden[layer] for layer in layers], dim=-1).clone()  # [T, k * hidden]
        next_ids = torch.cat([token_ids[1:], token_ids[-1:]])
        captured.append(CapturedSequence(token_ids, out.final_hidden.clone(), layer_hidden, next_ids))
    return captured


class Eagle3Trainer:
    def __init__(self, served, device: str = "cpu", init_from: Path | None = None):
        """init_from: an MTP head's folder to go on from (warm_start), else the target's last layer."""
        self.served, self.device = served, torch.device(device)
        self.config = Eagle3TrainConfig()
        num_layers = served.loaded.decoder.config.num_hidden_layers
        self.warm = warm_start(served, init_from) if init_from is not None else None
        self.config.target_layers = self.target_layers = (
            self.warm.target_layers if self.warm else default_target_layers(num_layers)
        )
        decoder = served.loaded.decoder
        decoder.to(self.device)
        decoder.rotary = None  # its cos/sin tables are rebuilt on the device at the next forward

    def setup(self, data: dict) -> None:
        """data["train"]: ShardSequence-like (token_ids, prompt_length), token ids only."""
        sequences = data["train"]
        self.target_layers = self.config.target_layers
        self.use_sequences(sequences)
        if self.warm is not None:
            assert self.target_layers == self.warm.target_layers, "a warm start fixes the layers it reads"
            vocab = self.warm.vocab
            if vocab is None:
                vocab = torch.arange(self.served.loaded.config.vocab_size)
            # and every token the target answers with in this data (code, JSON and tool calls add
            # tokens a head trained on chat never proposed: its vocabulary covered 91 % of them)
            answers = answer_vocabulary(sequences, self.served.loaded.config.vocab_size)
            self.vocab = torch.unique(torch.cat([vocab, answers])).to(self.device)
            self.model = copy.deepcopy(self.warm.head).to(self.device)
        else:
            self.vocab = answer_vocabulary(sequences, self.served.loaded.config.vocab_size).to(self.device)
            self.model = init_head(self.served, len(self.target_layers)).to(self.device)
        self.optimizer = make_optimizer(self.model, self.config)

    def use_sequences(self, sequences) -> None:
        """Train on these from the next update on (the vocabulary stays the one set up)."""
        self.num_sequences = len(sequences)
        self.train_data = token_windows([s.token_ids for s in sequences], self.config.max_len)

    def train(self, start: int, stop: int, total: int, progress) -> list[float]:
        def prepare(windows: list[list[int]]) -> list[CapturedSequence]:
            return target_states(self.served, windows, self.target_layers)

        return train_updates(
            self.model,
            self.served,
            self.train_data,
            self.vocab,
            self.optimizer,
            self.config,
            start,
            stop,
            total,
            progress,
            prepare,
        )

    def drafter(self):
        from worker.drafters.mtp import MtpDrafter

        decoder = self.served.loaded.decoder
        frozen = copy.deepcopy(self.model).eval().requires_grad_(False)
        return MtpDrafter(
            frozen,
            decoder.config,
            decoder.model.embed_tokens,
            decoder.lm_head,
            "fused_layers",
            self.config.num_steps,
            draft_vocab=self.vocab,
            target_layers=self.target_layers,
        )

    def held_out_acceptance(self) -> float:
        from ops.training.held_out import held_out_acceptance

        return held_out_acceptance(self.served, self.drafter())

    def export(self, folder: Path) -> None:
        from ops.training.export import save_drafter
        from worker.drafters.mtp import TARGET_LAYERS_KEY

        config = self.served.loaded.checkpoint.config
        save_drafter(
            folder,
            {f"mtp.{name}": t.cpu() for name, t in self.model.state_dict().items()},
            {
                "architectures": ["ArborMtpHead"],
                "model_type": config["model_type"],
                "hidden_size": config["hidden_size"],
                "num_nextn_predict_layers": 1,
                TARGET_LAYERS_KEY: list(self.target_layers),
                "num_draft": self.config.num_steps,
                "target": self.served.name,
            },
            self.vocab.cpu(),
        )
