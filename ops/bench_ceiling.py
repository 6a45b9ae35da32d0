"""The ceiling of speculation on one machine: an oracle drafter (every draft accepted) vs plain decoding.

    python -m ops.bench_ceiling [--model M] [--max-tokens 128] [--threads N]

Two tables: decode throughput when each forward verifies a chain of k (or a tree of 8 with
depth 4) that is always right, and what one verification forward of n tokens costs after a
fixed context. A real drafter's speedup is bounded by the first table; the second shows how
quickly the bound erodes as drafts grow, which is what the tree budget trades against.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import torch

from shared.sampling import SamplingParams
from worker.drafters.oracle import OracleDrafter, greedy_reference
from worker.engine.runner import ModelRunner
from worker.models.decoder import Decoder
from worker.models.loader import LoadedModel, load_model

PROMPT = (
    "Speculative decoding lets a small drafter guess several tokens ahead; the large model then checks "
    "all of the guesses in a single forward pass and keeps the longest prefix it agrees with. "
    "Explain, step by step, why the output distribution does not change."
)
# (label, depth of the correct path, wrong siblings per correct node)
ORACLES = [("chain k=3", 3, 0), ("chain k=7", 7, 0), ("tree of 8 (depth 4)", 4, 1)]
VERIFY_SIZES = (1, 4, 8, 16)


@dataclass(slots=True)
class DecodeRun:
    label: str
    tokens_per_s: float
    tokens_per_forward: float
    exact: bool  # output identical to plain decoding


def decode(model: LoadedModel, prompt_ids: list[int], max_tokens: int, drafter: OracleDrafter | None):
    runner = ModelRunner(model.decoder, [], drafter)
    sequence = runner.start("bench", prompt_ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    while sequence.num_to_prefill > 0:
        runner.prefill(sequence, 512)
    while not sequence.finished:
        runner.decode_step(sequence)
    return sequence


def decode_runs(model: LoadedModel, prompt_ids: list[int], max_tokens: int, repeats: int) -> list[DecodeRun]:
    reference = greedy_reference(model.decoder, prompt_ids, max_tokens + 8)
    expected = reference[len(prompt_ids) : len(prompt_ids) + max_tokens]
    vocab_size = model.config.vocab_size
    configs: list[tuple[str, OracleDrafter | None]] = [("none", None)]
    configs += [(label, OracleDrafter(reference, depth, vocab_size, siblings)) for label, depth, siblings in ORACLES]
    decode(model, prompt_ids, 8, None)  # warm-up: first forwards pay for allocations
    best: dict[str, DecodeRun] = {}
    # Round-robin, best of n: a burst of load elsewhere on the machine hits one run of each
    # drafter rather than every run of one, and the quietest run is closest to the machine's capability.
    for _ in range(repeats):
        for label, drafter in configs:
            sequence = decode(model, prompt_ids, max_tokens, drafter)
            stats = sequence.stats
            run = DecodeRun(
                label,
                stats.generated_tokens / stats.decode_s,
                stats.tokens_per_forward,
                sequence.output_ids == expected,
            )
            if label not in best or run.tokens_per_s > best[label].tokens_per_s:
                best[label] = run
    return [best[label] for label, _ in configs]


@torch.inference_mode()
def verification_ms(decoder: Decoder, prompt_ids: list[int], repeats: int) -> dict[int, float]:
    """Median wall time of one forward of n chained tokens after the prompt, for each n in VERIFY_SIZES.

    Nothing is committed, so every repeat verifies at the same context length; sizes take turns.
    """
    cache = decoder.new_cache(len(prompt_ids) + max(VERIFY_SIZES))
    decoder(torch.tensor(prompt_ids), torch.arange(len(prompt_ids)), cache, num_logits=0)
    cache.commit(len(prompt_ids))
    times: dict[int, list[float]] = {size: [] for size in VERIFY_SIZES}
    for _ in range(repeats + 2):
        for size in VERIFY_SIZES:
            positions = torch.arange(cache.length, cache.length + size)
            started = time.perf_counter()
            decoder(torch.tensor(prompt_ids[:size]), positions, cache)
            times[size].append(time.perf_counter() - started)
    return {size: 1000 * statistics.median(t[2:]) for size, t in times.items()}  # two rounds of warm-up


def decode_table(runs: list[DecodeRun]) -> str:
    plain = runs[0].tokens_per_s
    lines = ["| drafter | tokens/forward | tokens/s | speedup | output = plain |", "|---|---|---|---|---|"]
    for run in runs:
        lines.append(
            f"| {run.label} | {run.tokens_per_forward:.2f} | {run.tokens_per_s:.1f} | "
            f"{run.tokens_per_s / plain:.2f}x | {'yes' if run.exact else 'NO'} |"
        )
    return "\n".join(lines)


def verification_table(costs: dict[int, float], context: int) -> str:
    single = costs[VERIFY_SIZES[0]]
    lines = [
        f"| tokens per forward (after {context} context tokens) | ms/forward | vs 1 token | ms/token |",
        "|---|---|---|---|",
    ]
    for size, ms in costs.items():
        lines.append(f"| {size} | {ms:.2f} | {ms / single:.2f}x | {ms / size:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.bench_ceiling", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="HF folder or .gguf file (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--dtype", choices=["float32", "float64", "bfloat16"], default="float32")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="decode runs per drafter (best kept)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.model, dtype=args.dtype)
    prompt_ids = model.tokenizer.encode(PROMPT, add_special_tokens=False).ids
    print(
        f"model {model.name}, {args.dtype}, {torch.get_num_threads()} threads, "
        f"prompt {len(prompt_ids)} tokens, {args.max_tokens} generated\n"
    )
    print(decode_table(decode_runs(model, prompt_ids, args.max_tokens, args.repeats)) + "\n")
    print(verification_table(verification_ms(model.decoder, prompt_ids, 20), len(prompt_ids)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
