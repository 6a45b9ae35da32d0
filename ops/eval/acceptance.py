"""The acceptance-length gate: each speculation mode's acceptance on a fixed prompt set, against
the figure recorded for it (a regression check, as vLLM's acceptance-length test).

Greedy decoding of the held-out chat prompts (ops/training/prompts.py, never trained on) with the
default model and its bundled drafters, in process, in two formats, each with its own record:
float32 (the exact path) and the served format (`--dtype auto`: int4 on the native kernels, the
drafters' layers int8), where a drafter's rounding shows. The drafts, and so the acceptance,
depend only on the weights and the arithmetic, not on the machine's load (the native kernels
compute the same bits on every vector path). Acceptance length is
vLLM's: 1 + accepted ÷ drafts (drafts: forwards that verified a non-empty draft). A drafter
that breaks (a head loaded wrong, a draft vocabulary off by one, a tree policy that stops
branching) moves it by far more than float noise between CPUs; the tolerance is the latter.
Beside it each mode's figures say how deep its drafts get: `reach_by_depth[d]`, the share of
drafts whose accepted path reached depth d+1, and `conditional_by_depth[d]`, of those that
reached depth d, the share that went on to d+1 (worker.speculation.acceptance's p_{d+1}).

    python -m ops.eval.acceptance            # measure and compare with the record
    python -m ops.eval.acceptance --record   # measure and write the record (after a deliberate change)
    python -m ops.eval.acceptance --modes mtp,mtp-tree --record   # re-record those modes, keep the others
    python -m ops.eval.acceptance --dtype auto   # the same in the served format
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ops.training.prompts import HELD_OUT

RECORDS = {  # one record a format: float32 (the exact path), auto (the served format)
    "float32": Path(__file__).with_name("acceptance_lengths.json"),
    "auto": Path(__file__).with_name("acceptance_lengths_served.json"),
}
MODES = ("mtp", "mtp-tree", "dflash", "tree", "ngram", "suffix", "auto")
NUM_PROMPTS = 6
MAX_TOKENS = 64
TOLERANCE = 0.05  # relative: float32 on another CPU may flip a near-tie, never shift a drafter this much


def measure(
    modes: tuple[str, ...] = MODES, num_prompts: int = NUM_PROMPTS, max_tokens: int = MAX_TOKENS, dtype: str = "float32"
) -> dict:
    """{mode: {"acceptance_length", "tokens_per_forward"}} on the first `num_prompts` held-out prompts,
    `dtype` "float32" (the exact path) or "auto" (the served format)."""
    from shared.sampling import SamplingParams
    from worker.engine.generate import generate
    from worker.engine.stats import SpecStats
    from worker.serving_model import load_serving_model

    figures = {}
    for mode in modes:
        served = load_serving_model(None, mode, dtype=dtype, num_threads=1)
        total = SpecStats()
        for prompt in HELD_OUT[:num_prompts]:
            ids = served.encode_chat([{"role": "user", "content": prompt}])
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
            total.merge(generate(served.runner, served.tokenizer, ids, params).stats)
        figures[mode] = {
            "acceptance_length": round(total.acceptance_length, 4),
            "tokens_per_forward": round(total.tokens_per_forward, 4),
            **depth_figures(total.accepted_per_depth, total.drafts),
        }
    return figures


def depth_figures(accepted_per_depth: list[int], num_drafts: int) -> dict[str, list[float]]:
    """How deep the drafts got: the share reaching each depth, and each depth's conditional rate."""
    reach = [count / num_drafts for count in accepted_per_depth] if num_drafts else []
    before = [1.0, *reach[:-1]]
    conditional = [r / b if b else 0.0 for r, b in zip(reach, before, strict=True)]
    return {
        "reach_by_depth": [round(r, 4) for r in reach],
        "conditional_by_depth": [round(c, 4) for c in conditional],
    }


def compare(measured: dict, recorded: dict, tolerance: float = TOLERANCE) -> list[str]:
    """One line per mode whose acceptance length left the recorded figure's tolerance."""
    problems = []
    for mode, figures in measured.items():
        expected = recorded.get(mode, {}).get("acceptance_length")
        if expected is None:
            problems.append(f"{mode}: no recorded acceptance length (run with --record)")
            continue
        got = figures["acceptance_length"]
        if abs(got - expected) > tolerance * expected:
            problems.append(f"{mode}: acceptance length {got:.3f}, recorded {expected:.3f} (±{tolerance:.0%})")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help="write the measured figures as the record")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--dtype", choices=sorted(RECORDS), default="float32", help="float32, or auto: served")
    args = parser.parse_args(argv)
    record = RECORDS[args.dtype]
    measured = measure(tuple(args.modes.split(",")), dtype=args.dtype)
    print(json.dumps(measured, indent=2))
    if args.record:  # the modes measured replace their records; the others keep theirs
        recorded = json.loads(record.read_text()) if record.exists() else {}
        record.write_text(json.dumps(recorded | measured, indent=2, sort_keys=True) + "\n")
        return 0
    problems = compare(measured, json.loads(record.read_text()))
    for line in problems:
        print(f"arbor: error: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
