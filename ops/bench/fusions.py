"""`python -m ops.bench.fusions`: what each decoder fusion buys, side by side on the default model.

Three builds of the same int4 weights (the default format, one row plan: int4), timed in turns
(round robin, best of each round, so a busy neighbour hits them alike):
  fused     q/k/v and gate/up as one product each, q and k rotated in one call (the default)
  apart     the seven projections as seven products, q and k rotated apart
  unrefined fused, the head's logits as the int4 kernel returns them (no top-k refinement)
The float32 exact path runs beside them as the reference. Prints ms per forward at 1 and 4 rows.
"""

from __future__ import annotations

import argparse
import json

import torch

from worker.models.config import ModelConfig
from worker.models.decoder import Decoder
from worker.models.loader import build_fast_decoder, load_model, read_checkpoint
from worker.models.row_timing import forward_cost, new_timing_cache
from worker.models.weight_formats import LinearFormats

ROWS = (1, 4)


def builds() -> dict[str, Decoder]:
    checkpoint = read_checkpoint(None, keep_quantized=True)
    config = ModelConfig.from_hf(checkpoint.config)
    refined = LinearFormats("float32", "int4", "int4", refine_head=True)
    decoders = {
        "fused": build_fast_decoder(config, checkpoint, refined),
        "apart": build_fast_decoder(config, checkpoint, refined, fuse=False),
        "unrefined": build_fast_decoder(config, checkpoint, LinearFormats("float32", "int4", "int4")),
    }
    decoders["float32 exact"] = load_model(None, dtype="float32").decoder
    return decoders


@torch.inference_mode()
def measure(decoders: dict[str, Decoder], rounds: int) -> dict[str, dict[int, float]]:
    caches = {name: new_timing_cache(decoder, max(ROWS)) for name, decoder in decoders.items()}
    best: dict[str, dict[int, float]] = {name: {n: float("inf") for n in ROWS} for name in decoders}
    for _ in range(rounds):
        for name, decoder in decoders.items():
            for n in ROWS:
                best[name][n] = min(best[name][n], forward_cost(decoder, caches[name], n, repeats=2))
    return {name: {n: round(cost * 1e3, 2) for n, cost in by_rows.items()} for name, by_rows in best.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(json.dumps({"ms_per_forward": measure(builds(), args.rounds), "threads": args.threads}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
