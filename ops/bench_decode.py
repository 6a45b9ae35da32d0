"""Plain decoding speed: Arbor's runner vs transformers `generate`, side by side in one run.

    .venv/bin/python -m ops.bench_decode [--max-tokens 128] [--threads 2] [--prompts 4]

Both decode the default model greedily in float32 with the same thread count, from the same
prompt token ids, for the same number of new tokens (EOS ignored so lengths match). The first
run of each is a warm-up. Prints a markdown table; the figures in docs/BENCHMARKS.md come from it.
"""

from __future__ import annotations

import argparse
import time

import torch

PROMPTS = [
    "Explain why the sky is blue in two short paragraphs.",
    "Write a Python function that checks whether a string is a palindrome.",
    "List five fruits and one fact about each.",
    "Tell me a short story about a robot who learns to paint.",
    "What are the main differences between TCP and UDP?",
    "Summarize the plot of Romeo and Juliet.",
]


def run_arbor(served, prompt_ids: list[int], max_tokens: int) -> tuple[list[int], float]:
    from shared.sampling import SamplingParams
    from worker.engine.generate import generate

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    started = time.perf_counter()
    result = generate(served.runner, served.tokenizer, prompt_ids, params)
    return result.token_ids, time.perf_counter() - started


def run_transformers(model, prompt_ids: list[int], max_tokens: int) -> tuple[list[int], float]:
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                             do_sample=False, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist(), time.perf_counter() - started


def _before_eos(token_ids: list[int], eos_id: int = 2) -> list[int]:
    # transformers' min_new_tokens suppresses EOS while Arbor's ignore_eos emits and continues past
    # it, so the two agree up to the first EOS only.
    return token_ids[: token_ids.index(eos_id)] if eos_id in token_ids else token_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import transformers

    from worker.models.default_model import default_model_path
    from worker.serving_model import load_serving_model

    served = load_serving_model(None, "none")
    path = default_model_path()
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    prompts = [served.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS[: args.prompts]]
    run_arbor(served, prompts[0], 8)  # warm-up
    run_transformers(reference, prompts[0], 8)
    ours_s = theirs_s = 0.0
    same = 0
    for ids in prompts:
        ours, seconds = run_arbor(served, ids, args.max_tokens)
        ours_s += seconds
        theirs, seconds = run_transformers(reference, ids, args.max_tokens)
        theirs_s += seconds
        same += _before_eos(ours) == _before_eos(theirs)
    num_tokens = args.max_tokens * len(prompts)
    print(f"| engine | tokens/s | ratio |\n|---|---|---|")
    print(f"| transformers generate | {num_tokens / theirs_s:.1f} | 1.00 |")
    print(f"| arbor (speculation none) | {num_tokens / ours_s:.1f} | {theirs_s / ours_s:.2f} |")
    print(f"\n{len(prompts)} prompts x {args.max_tokens} new tokens, greedy, float32, {args.threads} threads; "
          f"identical tokens (up to the first EOS) for {same}/{len(prompts)} prompts (wall time incl. prefill)")


if __name__ == "__main__":
    main()
