"""Gateway-vs-in-process pairs: one gateway request and the in-process request run next to it,
same prompt and token count, as `arbor bench serving` records them and `arbor bench pool` pools
them. A pair is a dict of seconds (None where that request failed) and the cores that processes
outside the benchmark took while it ran (`ops.bench.machine_load`). Torch-free.

    {"gateway_e2e_s": 0.31, "gateway_tpot_s": 0.0023, "local_e2e_s": 0.30, "local_tpot_s": 0.0022,
     "other_cores": 0.01}
"""

from __future__ import annotations

from ops.bench.results import median_with_interval

# A pair is "quiet" when processes outside the benchmark took less than this many cores during it:
# the serving path then had its second core.
QUIET_CORES = 0.25


def pair_ratio(pair: dict, kind: str) -> float | None:
    """In-process time over gateway time for one pair, `kind` "e2e" or "tpot"; None if either failed."""
    gateway_s, local_s = pair[f"gateway_{kind}_s"], pair[f"local_{kind}_s"]
    return local_s / gateway_s if gateway_s and local_s else None


def pooled(pairs: list[dict], kind: str) -> dict | None:
    """The median of the pairs' ratios and a 95% bootstrap interval of it. Pairs share the machine's
    state at the time, so the VM's drift, which moves whole minutes by up to 30%, cancels out of
    each pair instead of widening the spread; and a few slow stretches move the median less than
    a pooled rate."""
    return median_with_interval([ratio for pair in pairs if (ratio := pair_ratio(pair, kind)) is not None])


def is_quiet(pair: dict) -> bool:
    return pair["other_cores"] is not None and pair["other_cores"] < QUIET_CORES


def rate_ratio(pairs: list[dict]) -> float | None:
    """Gateway tokens/s over in-process tokens/s, all tokens over all time: a pair's two requests
    have the same token count, so it is the in-process seconds over the gateway's."""
    both = [
        (pair["gateway_e2e_s"], pair["local_e2e_s"]) for pair in pairs if pair["gateway_e2e_s"] and pair["local_e2e_s"]
    ]
    return sum(local_s for _, local_s in both) / sum(gateway_s for gateway_s, _ in both) if both else None
