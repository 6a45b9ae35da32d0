"""`arbor bench numerics`: how far each weight format's outputs sit from the float32 path.

Two figures per format, against the float32 path of the same file:
- greedy agreement: `--prompts` chat prompts x `--max-tokens` greedy tokens, EOS ignored (prompts
  identical token for token; the share of tokens before each prompt's first difference);
- KL(float32 || format) of the full next-token distribution at every position of the float32
  path's own greedy continuations (teacher-forced: both read the same tokens), mean and p99.
The forwards compute logits for every row, so they run in the format decoding uses.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ops.bench.formats import AGREEMENT_PROMPTS, greedy_agreement, load_format, parse_formats
from ops.bench.results import machine_info, results_dir, write_json
from shared.sampling import SamplingParams
from worker.engine.generate import generate
from worker.serving_model import ServingModel


def greedy_outputs(model: ServingModel, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return [generate(model.runner, model.tokenizer, ids, params).token_ids for ids in prompts]


@torch.inference_mode()
def position_log_probs(model: ServingModel, prompt: list[int], continuation: list[int]) -> torch.Tensor:
    """[len(continuation), vocab] float64 log-probabilities of each continuation token's distribution."""
    decoder = model.loaded.decoder
    token_ids = prompt + continuation
    cache = decoder.new_cache(len(token_ids))
    logits = decoder(torch.tensor(token_ids), torch.arange(len(token_ids)), cache).logits  # [T, vocab]
    return torch.log_softmax(logits[len(prompt) - 1 : -1].double(), dim=-1)


def kl_divergence(reference: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """[positions] KL(reference || other) from log-probabilities."""
    return (reference.exp() * (reference - other)).sum(-1)


def run_numerics(model: str | None, formats: list[str], num_prompts: int, max_tokens: int) -> dict:
    torch.set_num_threads(1)
    reference = load_format(model, "float32")
    prompts = [reference.encode_chat([{"role": "user", "content": text}]) for text in AGREEMENT_PROMPTS[:num_prompts]]
    expected = greedy_outputs(reference, prompts, max_tokens)
    reference_log_probs = [position_log_probs(reference, p, c) for p, c in zip(prompts, expected)]
    report: dict = {"machine": machine_info(), "prompts": num_prompts, "max_tokens": max_tokens, "formats": {}}
    for name in formats:
        served = load_format(model, name)
        agreement = greedy_agreement(expected, greedy_outputs(served, prompts, max_tokens))
        kl = torch.cat(
            [
                kl_divergence(ref, position_log_probs(served, p, c))
                for ref, p, c in zip(reference_log_probs, prompts, expected)
            ]
        )
        used = served.loaded.formats
        report["formats"][name] = {
            **agreement,
            "kl_mean": float(kl.mean()),
            "kl_p99": float(kl.quantile(0.99)),
            "kernels": None if used is None else f"{used.kernels} ({used.native_isa or 'aten'})",
        }
        print(name, json.dumps(report["formats"][name]), flush=True)
    return report


def numerics_markdown(report: dict) -> str:
    lines = [
        f"Against float32, {report['prompts']} prompts x {report['max_tokens']} greedy tokens:",
        "",
        "| format | kernels | prompts identical | tokens before first difference | KL mean | KL p99 |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in report["formats"].items():
        lines.append(
            f"| {name} | {row['kernels']} | {row['identical_prompts']}/{row['num_prompts']} | "
            f"{row['tokens_before_first_difference']:.3f} | {row['kl_mean']:.2e} | {row['kl_p99']:.2e} |"
        )
    return "\n".join(lines)


def run(model: str | None, formats_text: str, num_prompts: int, max_tokens: int, out_dir: Path | None) -> Path:
    report = run_numerics(model, parse_formats(formats_text), num_prompts, max_tokens)
    folder = results_dir(out_dir)
    write_json(folder / "numerics.json", report)
    (folder / "numerics.md").write_text(numerics_markdown(report) + "\n")
    print(numerics_markdown(report))
    return folder
