"""`arbor train-drafter --kind mtp`: the reproducible pipeline behind the bundled MTP head.

Stages, each cached in --out so an interrupted run resumes where it stopped:
  1. data.pt        self-distilled answers (greedy + sampled) and standard-library text, with the
                    target's hidden states and argmax next tokens captured once
  2. checkpoint.pt  head + optimizer + losses + held-out acceptance, saved every --save-every updates
  3. mtp/           the final head as config.json + model.safetensors (bf16, `mtp.*` names)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path



def add_train_parser(subparsers) -> None:
    parser = subparsers.add_parser("train-drafter", help="train a drafter for the default model (CPU is fine)")
    parser.add_argument("--kind", choices=["mtp"], default="mtp")
    parser.add_argument("--out", type=Path, default=Path(".cache/train-mtp"))
    parser.add_argument("--num-prompts", type=int, default=400, help="training conversations answered by the target")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--stdlib-sequences", type=int, default=200, help="teacher-forced stdlib windows")
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--save-every", type=int, default=25)
    parser.add_argument("--threads", type=int, default=None)
    parser.set_defaults(handler=run_train)


def run_train(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from ops.training.train_mtp import MtpTrainConfig, init_head, make_optimizer, train_updates, windows
    from worker.serving_model import load_serving_model

    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    served = load_serving_model(None, "none")
    served.loaded.decoder.requires_grad_(False)  # the target is frozen; only the head learns
    data = _data(served, args)
    config = MtpTrainConfig()
    train = windows(data["train"], config.max_len)
    head = init_head(served)
    optimizer = make_optimizer(head, config)
    state = _resume(args.out / "checkpoint.pt", head, optimizer)
    progress = tqdm(total=args.updates, initial=state["update"], desc="training mtp head", unit="update")
    while state["update"] < args.updates:
        stop = min(args.updates, state["update"] + args.save_every)
        started = time.perf_counter()
        state["losses"] += train_updates(head, served, train, data["vocab"], optimizer, config,
                                         state["update"], args.updates if stop == args.updates else stop, progress)
        state["train_s"] += time.perf_counter() - started
        state["update"] = stop
        if stop % args.eval_every == 0 or stop == args.updates:
            state["evals"].append((stop, held_out_acceptance(served, head, config.num_steps)))
            progress.write(f"update {stop}: held-out tokens/forward {state['evals'][-1][1]:.3f}")
        torch.save({"head": head.state_dict(), "optimizer": optimizer.state_dict(), **state}, args.out / "checkpoint.pt")
    progress.close()
    if not state["evals"] or state["evals"][-1][0] != state["update"]:
        state["evals"].append((state["update"], held_out_acceptance(served, head, config.num_steps)))
    export_head(head, served, args.out / "mtp", config.num_steps)
    (args.out / "history.json").write_text(json.dumps({k: state[k] for k in ("losses", "evals", "train_s")}))
    print(f"wrote {args.out / 'mtp'}; held-out tokens/forward {state['evals'][-1][1]:.3f}")
    return 0


def _data(served, args: argparse.Namespace) -> dict:
    import torch

    from ops.training.capture import capture, self_distilled_sequences, stdlib_sequences
    from ops.training.prompts import training_conversations
    from ops.training.train_mtp import training_vocabulary

    path = args.out / "data.pt"
    if path.exists():
        return torch.load(path, weights_only=False)
    conversations = training_conversations()[: args.num_prompts]
    sequences = self_distilled_sequences(served, conversations, args.max_new_tokens, 16, 0.0, seed=0)
    sequences += self_distilled_sequences(served, conversations[: len(conversations) // 2], args.max_new_tokens,
                                          16, 0.7, seed=1)
    sequences += stdlib_sequences(served, args.stdlib_sequences, 256)
    captured = capture(served, sequences)
    data = {"train": captured, "vocab": training_vocabulary(captured, served.loaded.config.vocab_size)}
    torch.save(data, path)
    return data


def _resume(path: Path, head, optimizer) -> dict:
    import torch

    if not path.exists():
        return {"update": 0, "losses": [], "evals": [], "train_s": 0.0}
    saved = torch.load(path, weights_only=False)
    head.load_state_dict(saved.pop("head"))
    optimizer.load_state_dict(saved.pop("optimizer"))
    return saved


def held_out_acceptance(served, head, num_draft: int, max_tokens: int = 64) -> float:
    """Tokens per target forward of greedy MTP drafting on the held-out prompts (never trained on)."""
    import copy

    from ops.training.prompts import held_out_conversations
    from shared.sampling import SamplingParams
    from worker.drafters.mtp import MtpDrafter
    from worker.engine.generate import generate
    from worker.engine.runner import ModelRunner

    decoder = served.loaded.decoder
    frozen = copy.deepcopy(head).eval().requires_grad_(False)
    drafter = MtpDrafter(frozen, decoder.config, decoder.model.embed_tokens, decoder.lm_head, "post_norm", num_draft)
    runner = ModelRunner(decoder, served.loaded.checkpoint.eos_token_ids, drafter)
    generated = forwards = 0
    for messages in held_out_conversations()[:6]:
        result = generate(runner, served.tokenizer, served.encode_chat(messages), SamplingParams(max_tokens=max_tokens))
        generated += result.stats.generated_tokens
        forwards += result.stats.target_forwards
    return generated / forwards


def export_head(head, served, folder: Path, num_draft: int) -> None:
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"mtp.{name}": t.detach().to(torch.bfloat16).contiguous() for name, t in head.state_dict().items()}
    save_file(tensors, str(folder / "model.safetensors"))
    config = served.loaded.checkpoint.config
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["ArborMtpHead"], "model_type": config["model_type"], "hidden_size": config["hidden_size"],
        "num_nextn_predict_layers": 1, "mtp_hidden": "post_norm", "num_draft": num_draft,
        "target": served.name,
    }, indent=2))
