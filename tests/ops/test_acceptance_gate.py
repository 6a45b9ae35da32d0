"""The acceptance-length gate: every mode's acceptance on the held-out prompts stays at its
recorded figure, in float32 and in the served format (slow: the default model, seven modes), and
the comparison flags a shift."""

from __future__ import annotations

import json

import pytest

from ops.eval.acceptance import MODES, RECORDS, compare, measure
from worker.kernels.native_lib import kernel_choice

NATIVE = kernel_choice("native").isa != "portable"


@pytest.mark.parametrize("dtype", sorted(RECORDS))
def test_the_record_covers_every_mode(dtype):
    recorded = json.loads(RECORDS[dtype].read_text())
    assert set(recorded) == set(MODES)
    assert all(figures["acceptance_length"] >= 1.0 for figures in recorded.values())


def test_a_shift_past_the_tolerance_is_flagged_and_noise_is_not():
    recorded = {"mtp": {"acceptance_length": 1.40}}
    assert compare({"mtp": {"acceptance_length": 1.41}}, recorded) == []
    assert compare({"mtp": {"acceptance_length": 1.30}}, recorded) == [
        "mtp: acceptance length 1.300, recorded 1.400 (±5%)"
    ]
    assert compare({"tree": {"acceptance_length": 1.5}}, recorded) == [
        "tree: no recorded acceptance length (run with --record)"
    ]


@pytest.mark.slow
def test_every_modes_acceptance_length_stays_at_its_recorded_figure():
    assert compare(measure(), json.loads(RECORDS["float32"].read_text())) == []


@pytest.mark.slow
@pytest.mark.skipif(not NATIVE, reason="the served format's record is the native kernels'")
def test_every_modes_served_acceptance_length_stays_at_its_recorded_figure():
    assert compare(measure(dtype="auto"), json.loads(RECORDS["auto"].read_text())) == []
