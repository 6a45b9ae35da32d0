"""The default mode is `auto`: the MTP head where the model has one, and suffix decoding, per lane."""

from __future__ import annotations

import pytest

from shared.settings import WorkerSettings
from tests.support.tiny_drafters import make_tiny_model_with_mtp
from tests.support.tiny_models import make_tiny_model
from worker.drafters.mtp import MtpDrafter
from worker.drafters.picker import SourcePicker
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.drafter_protocol import DrafterError
from worker.models.loader import load_model


def test_an_unset_mode_is_auto(monkeypatch):
    monkeypatch.delenv("SPECULATION", raising=False)
    assert WorkerSettings().speculation == "auto"


def test_auto_drafts_from_the_head_where_the_model_has_one(tmp_path):
    drafter = load_drafter("auto", load_model(make_tiny_model_with_mtp(tmp_path / "with-mtp")), DraftOptions())
    assert isinstance(drafter, SourcePicker) and isinstance(drafter.model, MtpDrafter)
    assert drafter.hidden_layers == drafter.model.hidden_layers  # the forward keeps what the head reads


def test_auto_without_a_head_drafts_from_suffix_decoding_alone(tmp_path):
    drafter = load_drafter("auto", load_model(make_tiny_model(tmp_path / "plain")), DraftOptions())
    assert isinstance(drafter, SourcePicker) and drafter.model is None
    assert drafter.hidden_layers == () and not drafter.wants_final_hidden


def test_explicit_mtp_without_a_head_fails_with_the_loaders_message(tmp_path):
    with pytest.raises(DrafterError, match="needs an MTP head"):
        load_drafter("mtp", load_model(make_tiny_model(tmp_path / "plain")), DraftOptions())


def test_auto_with_a_draft_that_does_not_load_fails(tmp_path):
    options = DraftOptions(draft=tmp_path / "missing.safetensors")
    with pytest.raises((DrafterError, FileNotFoundError, OSError)):
        load_drafter("auto", load_model(make_tiny_model(tmp_path / "plain")), options)
