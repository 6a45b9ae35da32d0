"""The quality gates' rule (torch-free), and the gates themselves on the default model (slow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ops.eval.quality import Config, Outcome, check_gates, passed, quality_table, run_quality

METRICS = {"word_perplexity": 20.0, "bits_per_byte": 0.9, "acc": 0.5, "acc_norm": 0.5, "exact_match": 0.25}


def outcome(text: str, ppl: float = 20.0, lls: tuple[float, ...] = (-1.0, -2.0), gens: tuple[str, ...] = ("4",)):
    return Outcome(Config.parse(text), METRICS | {"word_perplexity": ppl}, 1.0, list(lls), list(gens))


def test_a_mode_passes_with_none_s_generations_and_loglikelihoods() -> None:
    runs = [outcome("f32=none:float32:none"), outcome("none=none:auto:auto", ppl=20.5), outcome("mtp=mtp:auto:auto")]
    check_gates(runs)
    assert runs[1].gates == {"perplexity_within_tolerance": True}
    assert runs[2].gates == {"generations_equal_none": True, "loglikelihoods_equal_none": True}
    assert passed(runs) and "mtp" in quality_table(runs)


def test_a_changed_generation_or_loglikelihood_or_perplexity_fails() -> None:
    runs = [
        outcome("f32=none:float32:none"),
        outcome("int4=none:auto:int4", ppl=21.0),  # 5 % off float32
        outcome("tree=tree:auto:int4", gens=("5",)),
        outcome("mtp=mtp:auto:int4", lls=(-1.0, -2.01)),
    ]
    check_gates(runs)
    assert runs[1].gates["perplexity_within_tolerance"] is False
    assert runs[2].gates == {"generations_equal_none": False, "loglikelihoods_equal_none": True}
    assert runs[3].gates == {"generations_equal_none": True, "loglikelihoods_equal_none": False}
    assert not passed(runs) and "FAIL" in quality_table(runs)


def test_a_config_names_its_four_parts() -> None:
    assert Config.parse("x=tree:auto:int4") == Config("x", "tree", "auto", "int4")
    with pytest.raises(ValueError, match="label=speculation:dtype:quantize"):
        Config.parse("x=tree:auto")


@pytest.mark.slow
def test_the_default_model_passes_the_quality_gates(tmp_path: Path) -> None:
    """Every speculation mode against none, the default format against float32 (minutes: slow)."""
    configs = [
        Config.parse(text)
        for text in ("float32=none:float32:none", "default=none:auto:auto", "mtp=mtp:auto:auto", "tree=tree:auto:auto")
    ]
    outcomes = run_quality(None, configs, num_items=20, out=tmp_path)
    assert passed(outcomes), quality_table(outcomes)
    assert all(outcome.gates for outcome in outcomes[1:])
