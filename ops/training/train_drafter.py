"""`arbor train-drafter --kind mtp|dflash|eagle3`: the reproducible pipeline behind the bundled drafters.

Stages, each cached so an interrupted run resumes where it stopped:
  1. <data-dir>/sequences.pt  token ids: the target's own answers (greedy + sampled) to the training
                              prompts and standard-library text; shared by mtp and dflash
     <data-dir>/engine/       with --data engine (eagle3's default): the target's answers to the
                              prompt mix through the batched serving engine, in resumable uint16
                              shards (engine_data.py); --generate-only stops after this stage
  2. <out>/data.pt            those sequences run through the target once: hidden states (final, and
                              for dflash the layers it reads) and argmax next tokens
  3. <out>/checkpoint.pt      drafter + optimizer + losses + held-out acceptance, every --save-every
  4. <out>/<kind>/            the drafter as config.json + model.safetensors (bf16, real format names)
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

from ops.training.export import save_drafter
from ops.training.held_out import held_out_acceptance

if TYPE_CHECKING:
    from ops.training.train_eagle3 import Eagle3Trainer

DFLASH_MASK_TOKEN = "<|endoftext|>"  # the drafter's mask embedding: a special token answers never contain


def add_train_parser(subparsers) -> None:
    parser = subparsers.add_parser("train-drafter", help="train a drafter for the default model (CPU is fine)")
    parser.add_argument("--kind", choices=["mtp", "dflash", "eagle3"], default="mtp")
    parser.add_argument(
        "--data",
        choices=["transformers", "engine"],
        default=None,
        help="token sequences: answers generated with transformers (mtp, dflash) or through Arbor's "
        "batched engine in resumable shards (eagle3's default)",
    )
    parser.add_argument("--mix-prompts", type=int, default=None, help="engine data: the first N of the prompt mix")
    parser.add_argument("--lanes", type=int, default=16, help="engine data: lanes decoding at once")
    parser.add_argument(
        "--part",
        type=parse_part,
        default=(0, 1),
        metavar="I/N",
        help="engine data: only shards I modulo N (N processes, one a core, sharing --data-dir)",
    )
    parser.add_argument(
        "--gen-dtype", default="auto", help="engine data: the served model's dtype (auto: the serving path)"
    )
    parser.add_argument("--generate-only", action="store_true", help="stop after the data stage")
    parser.add_argument(
        "--init-from",
        default=None,
        metavar="FOLDER|none",
        help="eagle3: the plain MTP head to start from (default: the target's bundled one if it ships one; "
        "none: start from the target's last layer)",
    )
    parser.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="where training runs (auto: cuda when torch sees one, else cpu)",
    )
    parser.add_argument("--out", type=Path, default=None, help="run folder (default .cache/train-KIND)")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(".cache/train-data"),
        help="where the self-distilled token sequences are cached (shared by both kinds)",
    )
    parser.add_argument("--num-prompts", type=int, default=400, help="training conversations answered by the target")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--stdlib-sequences", type=int, default=200, help="teacher-forced stdlib windows")
    parser.add_argument(
        "--max-sequences",
        type=int,
        default=None,
        help="capture only this many of the sequences (a reproducible random subset)",
    )
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the kind's, 1e-3)")
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--save-every", type=int, default=25)
    parser.add_argument("--threads", type=int, default=None)
    parser.set_defaults(handler=run_train)


def run_train(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from worker.serving_model import load_serving_model

    if args.threads:
        torch.set_num_threads(args.threads)
    if (args.data or ("engine" if args.kind == "eagle3" else "transformers")) == "engine":
        generate_engine_data(args)
        if args.generate_only:
            return 0
    elif args.generate_only:
        raise SystemExit("--generate-only needs --data engine")
    out = args.out or Path(f".cache/train-{args.kind}")
    out.mkdir(parents=True, exist_ok=True)
    served = load_serving_model(None, "none")
    served.loaded.decoder.requires_grad_(False)  # the target is frozen; only the drafter learns
    device = training_device(args.device, args.kind)
    trainer: MtpTrainer | DFlashTrainer | Eagle3Trainer
    if args.kind == "eagle3":
        from ops.training.engine_data import shard_files
        from ops.training.train_eagle3 import Eagle3Trainer

        trainer = Eagle3Trainer(served, device, _eagle3_start(served, args.init_from))
        data: dict = {"shards": len(shard_files(args.data_dir / "engine")), "train": _engine_sequences(args)}
    else:
        trainer = MtpTrainer(served) if args.kind == "mtp" else DFlashTrainer(served)
        data = _captured(served, args, out, trainer.target_layers)
    trainer.setup(data)
    if args.lr is not None:
        trainer.config.lr = args.lr  # run_updates reads it every update
    state = _resume(out / "checkpoint.pt", trainer.model, trainer.optimizer)
    progress = tqdm(total=args.updates, initial=state["update"], desc=f"training {args.kind}", unit="update")
    while state["update"] < args.updates:
        if args.kind == "eagle3":
            _follow_shards(cast("Eagle3Trainer", trainer), args, data, state["update"], progress)
        stop = min(args.updates, state["update"] + args.save_every)
        started = time.perf_counter()
        state["losses"] += trainer.train(state["update"], stop, args.updates, progress)
        state["train_s"] += time.perf_counter() - started
        state["update"] = stop
        if stop % args.eval_every == 0 or stop == args.updates:
            state["evals"].append((stop, trainer.held_out_acceptance()))
            progress.write(f"update {stop}: held-out tokens/forward {state['evals'][-1][1]:.3f}")
        torch.save(
            {"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict(), **state},
            out / "checkpoint.pt",
        )
    progress.close()
    if not state["evals"] or state["evals"][-1][0] != state["update"]:
        state["evals"].append((state["update"], trainer.held_out_acceptance()))
    trainer.export(out / args.kind)
    history = {k: state[k] for k in ("losses", "evals", "train_s")}
    history["data"] = {
        "sequences": len(data["train"]),
        "tokens": sum(len(s.token_ids) for s in data["train"]),
        "train_vocabulary": len(trainer.vocab),
        "device": device,
    }
    (out / "history.json").write_text(json.dumps(history))
    print(f"wrote {out / args.kind}; held-out tokens/forward {state['evals'][-1][1]:.3f}")
    return 0


class MtpTrainer:
    def __init__(self, served):
        self.served = served
        self.target_layers: tuple[int, ...] = ()  # the head reads the final (post-norm) hidden state

    def setup(self, data: dict) -> None:
        from ops.training.train_mtp import MtpTrainConfig, init_head, make_optimizer, training_vocabulary, windows

        self.config = MtpTrainConfig()
        self.train_data = windows(data["train"], self.config.max_len)
        self.vocab = training_vocabulary(data["train"], self.served.loaded.config.vocab_size)
        self.model = init_head(self.served)
        self.optimizer = make_optimizer(self.model, self.config)

    def train(self, start: int, stop: int, total: int, progress) -> list[float]:
        from ops.training.train_mtp import train_updates

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
        )

    def drafter(self):
        import copy

        from worker.drafters.mtp import MtpDrafter

        decoder = self.served.loaded.decoder
        frozen = copy.deepcopy(self.model).eval().requires_grad_(False)
        return MtpDrafter(
            frozen,
            decoder.config,
            decoder.model.embed_tokens,
            decoder.lm_head,
            "post_norm",
            self.config.num_steps,
            draft_vocab=self.vocab,
        )

    def held_out_acceptance(self) -> float:
        return held_out_acceptance(self.served, self.drafter())

    def export(self, folder: Path) -> None:
        config = self.served.loaded.checkpoint.config
        save_drafter(
            folder,
            {f"mtp.{name}": t for name, t in self.model.state_dict().items()},
            {
                "architectures": ["ArborMtpHead"],
                "model_type": config["model_type"],
                "hidden_size": config["hidden_size"],
                "num_nextn_predict_layers": 1,
                "mtp_hidden": "post_norm",
                "num_draft": self.config.num_steps,
                "target": self.served.name,
            },
            self.vocab,
        )


class DFlashTrainer:
    def __init__(self, served):
        from ops.training.train_dflash import DFlashTrainConfig

        self.served = served
        self.config = DFlashTrainConfig()
        self.target_layers = self.config.target_layer_ids
        mask = served.tokenizer.token_to_id(DFLASH_MASK_TOKEN)
        self.mask_token_id = mask if mask is not None else served.loaded.config.vocab_size - 1

    def setup(self, data: dict) -> None:
        from ops.training.train_dflash import init_model, make_optimizer
        from ops.training.train_mtp import training_vocabulary, windows

        self.train_data = windows(data["train"], self.config.max_len)
        self.vocab = training_vocabulary(data["train"], self.served.loaded.config.vocab_size)
        self.model = init_model(self.served, self.config)
        self.optimizer = make_optimizer(self.model, self.config)

    def train(self, start: int, stop: int, total: int, progress) -> list[float]:
        from ops.training.train_dflash import train_updates

        return train_updates(
            self.model,
            self.served,
            self.train_data,
            self.vocab,
            self.optimizer,
            self.config,
            self.mask_token_id,
            start,
            stop,
            total,
            progress,
        )

    def drafter(self, tree_budget: int | None = None):
        import copy

        from ops.training.train_dflash import draft_config
        from worker.drafters.dflash import DFlashDrafter, DFlashSpec

        decoder = self.served.loaded.decoder
        frozen = copy.deepcopy(self.model).eval().requires_grad_(False)
        spec = DFlashSpec(self.config.block_size, self.mask_token_id, self.config.target_layer_ids)
        return DFlashDrafter(
            frozen,
            draft_config(decoder.config, self.config),
            spec,
            decoder.model.embed_tokens,
            decoder.lm_head,
            num_draft=self.config.block_size - 1,
            tree_budget=tree_budget,
            draft_vocab=self.vocab,
        )

    def held_out_acceptance(self) -> float:
        return held_out_acceptance(self.served, self.drafter())

    def export(self, folder: Path) -> None:
        target = self.served.loaded.checkpoint.config
        config = self.config
        keep = (
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "rms_norm_eps",
            "rope_theta",
            "rope_scaling",
            "max_position_embeddings",
            "vocab_size",
        )
        save_drafter(
            folder,
            dict(self.model.state_dict()),
            {
                "architectures": ["DFlashDraftModel"],
                "model_type": "qwen3",
                **{key: target[key] for key in keep if target.get(key) is not None},
                "num_hidden_layers": config.num_layers,
                "attention_bias": False,
                "tie_word_embeddings": False,
                "block_size": config.block_size,
                "num_target_layers": target["num_hidden_layers"],
                "dflash_config": {
                    "mask_token_id": self.mask_token_id,
                    "target_layer_ids": list(config.target_layer_ids),
                    "block_size": config.block_size,
                },
                "target": self.served.name,
            },
            self.vocab,
        )


def training_device(chosen: str, kind: str) -> str:
    """ "auto": cuda when torch sees one. The eagle3 trainer runs on either; mtp and dflash train on
    captured states kept in CPU memory, so they stay on the CPU."""
    import torch

    device = ("cuda" if torch.cuda.is_available() else "cpu") if chosen == "auto" else chosen
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
    if device == "cuda" and kind != "eagle3":
        if chosen == "cuda":
            raise SystemExit(f"--device cuda: --kind {kind} trains on the CPU; --kind eagle3 trains on CUDA")
        device = "cpu"
    return device


def _follow_shards(trainer: Eagle3Trainer, args: argparse.Namespace, data: dict, update: int, progress) -> None:
    """Shards that a generation running beside this training finished since: train on them too
    (read again only when the folder holds more shards than were read)."""
    from ops.training.engine_data import shard_files

    num_shards = len(shard_files(args.data_dir / "engine"))
    if num_shards == data["shards"]:
        return
    sequences = _engine_sequences(args)
    data["train"], data["shards"] = sequences, num_shards
    trainer.use_sequences(sequences)
    progress.write(f"update {update}: training on the {len(sequences)} sequences of {num_shards} shards on disk")


def _eagle3_start(served, init_from: str | None) -> Path | None:
    from worker.drafters.draft_checkpoint import bundled_drafter_path

    if init_from == "none":
        return None
    if init_from is not None:
        return Path(init_from)
    bundled = bundled_drafter_path(served.name, "mtp")
    if bundled is not None:
        print(f"starting from the bundled MTP head {bundled} (--init-from none starts from the target's last layer)")
    return bundled


def parse_part(text: str) -> tuple[int, int]:
    which, _, parts = text.partition("/")
    try:
        part = int(which), int(parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected I/N, e.g. 0/2") from None
    if not 0 <= part[0] < part[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: I must be 0 to N-1")
    return part


def _engine_sequences(args: argparse.Namespace) -> list:
    from ops.training.engine_data import read_shards

    sequences = read_shards(args.data_dir / "engine")
    if not sequences:
        raise SystemExit(f"{args.data_dir / 'engine'} holds no shards: run with --data engine first")
    if args.max_sequences is not None:
        sequences = random.Random(0).sample(sequences, min(args.max_sequences, len(sequences)))
    return sequences


def generate_engine_data(args: argparse.Namespace) -> None:
    """The shards of the prompt mix not on disk yet, through the batched engine (engine_data.py)."""
    from ops.training.engine_data import generate_shards
    from ops.training.prompt_mix import prompt_mix
    from worker.serving_model import load_serving_model

    served = load_serving_model(None, "none", dtype=args.gen_dtype)
    prompts = prompt_mix()[: args.mix_prompts]

    def report(stats) -> None:
        print(
            f"shard {stats.skipped_shards + stats.written_shards}: {stats.generated_tokens} tokens generated "
            f"in {stats.elapsed_s:.0f} s ({stats.tokens_per_s:.1f} tokens/s; {stats.cpu_s:.0f} s of CPU)",
            flush=True,
        )

    folder = args.data_dir / "engine"
    stats = generate_shards(
        served, prompts, folder, args.max_new_tokens, max_lanes=args.lanes, progress=report, part=args.part
    )
    print(
        f"{folder}: {len(stats.generated_keys)} answers this run ({stats.prompt_tokens} prompt + "
        f"{stats.generated_tokens} generated tokens in {stats.elapsed_s:.0f} s, {stats.tokens_per_s:.1f} tokens/s, "
        f"{stats.cpu_s:.0f} s of CPU); "
        f"{stats.skipped_shards} shards were already done"
    )


def _sequences(served, args: argparse.Namespace) -> list[list[int]]:
    import torch

    from ops.training.capture import self_distilled_sequences, stdlib_sequences
    from ops.training.prompts import training_conversations

    path = args.data_dir / "sequences.pt"
    if path.exists():
        return torch.load(path)
    conversations = training_conversations()[: args.num_prompts]
    sequences = self_distilled_sequences(served, conversations, args.max_new_tokens, 16, 0.0, seed=0)
    sequences += self_distilled_sequences(
        served, conversations[: len(conversations) // 2], args.max_new_tokens, 16, 0.7, seed=1
    )
    sequences += stdlib_sequences(served, args.stdlib_sequences, 256)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    torch.save(sequences, path)
    return sequences


def _captured(served, args: argparse.Namespace, out: Path, layers: tuple[int, ...]) -> dict:
    import torch

    from ops.training.capture import capture

    path = out / "data.pt"
    if path.exists():
        return torch.load(path, weights_only=False)
    sequences = _sequences(served, args)
    if args.max_sequences is not None:
        sequences = random.Random(0).sample(sequences, min(args.max_sequences, len(sequences)))
    data = {"train": capture(served, sequences, layers)}
    torch.save(data, path)
    return data


def _resume(path: Path, model, optimizer) -> dict:
    import torch

    if not path.exists():
        return {"update": 0, "losses": [], "evals": [], "train_s": 0.0}
    saved = torch.load(path, weights_only=False)
    model.load_state_dict(saved.pop("model"))
    optimizer.load_state_dict(saved.pop("optimizer"))
    return saved
