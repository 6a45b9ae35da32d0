"""Which weight format serves a forward of a given number of rows: a torch-free pure function.

Why: the kernels bend differently with the row count. On the 2-core EPYC (one thread) an int4
product costs about what bfloat16 costs at one row at a quarter of the bytes, but grows with
every row past ~4, while a dense bfloat16 GEMM stays nearly flat to ~16 rows. A speculating worker
runs 1 row (plain decoding), a few (chains) and up to hundreds (trees, prefill chunks), so a
model that keeps two formats in memory picks, per bucket of row counts, the one measured fastest
at start-up (row_timing.py). The two formats hold the same weight values (the dense one is the
quantized one dequantized), so switching changes rounding only, never the model.

Worked example: costs {"int4": {1: 10, 4: 14, 16: 40}, "bfloat16": {1: 25, 4: 26, 16: 30}} (ms)
give int4 up to 4 rows and bfloat16 above: RowPlan(((4, "int4"), (None, "bfloat16"))).
A row count between two measured ones takes the choice of the next measured count above it
(4 rows is the boundary: 5..16 use what won at 16), and anything past the last measured count
takes the last choice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_ROW_COUNTS = (1, 2, 4, 8, 16, 32, 64)
# A format other than the preferred one must beat it by this share to take a bucket, so timing
# noise on a shared machine does not flip buckets between near-equal formats.
DEFAULT_MIN_GAIN = 0.05


@dataclass(frozen=True, slots=True)
class RowPlan:
    buckets: tuple[tuple[int | None, str], ...]  # (max rows, format) ascending; None: no upper bound

    @staticmethod
    def single(weight_format: str) -> RowPlan:
        return RowPlan(((None, weight_format),))

    def format_for(self, num_rows: int) -> str:
        for max_rows, weight_format in self.buckets:
            if max_rows is None or num_rows <= max_rows:
                return weight_format
        raise AssertionError(f"RowPlan {self.buckets} has no open last bucket")

    def describe(self) -> str:
        """'int4 <= 4 < bfloat16': for logs and the benchmark's report."""
        parts = [f"{fmt} <= {bound}" if bound is not None else fmt for bound, fmt in self.buckets]
        return " < ".join(parts) if len(parts) > 1 else parts[0]


def choose_plan(
    costs: Mapping[str, Mapping[int, float]], preferred: str, min_gain: float = DEFAULT_MIN_GAIN
) -> RowPlan:
    """The plan from `costs[format][num_rows]` (seconds, or any unit, per forward).

    At each measured row count the preferred format wins unless another costs less than
    (1 - min_gain) of it; adjacent counts with the same winner merge into one bucket.
    """
    assert preferred in costs, (preferred, sorted(costs))
    row_counts = sorted(costs[preferred])
    assert row_counts, "no measurements"
    winners = [_winner(costs, preferred, rows, min_gain) for rows in row_counts]
    buckets: list[tuple[int | None, str]] = []
    for rows, winner in zip(row_counts, winners, strict=True):
        if buckets and buckets[-1][1] == winner:
            buckets[-1] = (rows, winner)
        else:
            buckets.append((rows, winner))
    buckets[-1] = (None, buckets[-1][1])
    return RowPlan(tuple(buckets))


def _winner(costs: Mapping[str, Mapping[int, float]], preferred: str, rows: int, min_gain: float) -> str:
    best, best_cost = preferred, costs[preferred][rows]
    for weight_format, by_rows in costs.items():
        cost = by_rows.get(rows)
        if weight_format != preferred and cost is not None and cost < best_cost * (1 - min_gain):
            best, best_cost = weight_format, cost
    return best


class FormatSelector:
    """Which of a decoder's formats serves the next forward; shared by all its `PlannedLinear`s.

    Losslessness fixes one rule: every forward whose logits choose tokens (plain decoding's one
    row, verification's many) runs in one *decode format*, so speculative and plain decoding
    compute those logits with the same kernels on the same values. A forward that only fills the
    KV cache (a prefill chunk: no logits) is the same in both runs whatever it uses, so it takes
    the fastest format for its row count from the plan.
    """

    def __init__(self, formats: tuple[str, ...]):
        self.formats = formats  # position i: the i-th module of every PlannedLinear
        self.plan = RowPlan.single(formats[0])
        self.decode_format = formats[0]
        self.filling_cache = False  # set by the decoder per forward
        self._decode_index = 0
        self._by_rows: list[int] = [0]
        self._tail = 0

    def set(self, plan: RowPlan, decode_format: str) -> None:
        named = {fmt for _, fmt in plan.buckets} | {decode_format}
        assert named <= set(self.formats), f"{sorted(named)} not all in {self.formats}"
        self.plan, self.decode_format = plan, decode_format
        self._decode_index = self.formats.index(decode_format)
        last = max((bound for bound, _ in plan.buckets if bound is not None), default=0)
        # a list index per call instead of a walk over the buckets
        self._by_rows = [self.formats.index(plan.format_for(max(n, 1))) for n in range(last + 1)]
        self._tail = self.formats.index(plan.buckets[-1][1])

    def index(self, num_rows: int) -> int:
        if not self.filling_cache:
            return self._decode_index
        return self._by_rows[num_rows] if num_rows < len(self._by_rows) else self._tail

    def describe(self) -> str:
        return f"decode {self.decode_format}, prefill {self.plan.describe()}"
