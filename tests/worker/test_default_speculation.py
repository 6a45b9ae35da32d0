"""The default mode is MTP where a head exists; otherwise an unset mode falls back to ngram."""

from __future__ import annotations

from shared.settings import WorkerSettings
from tests.support.tiny_drafters import make_tiny_model_with_mtp
from tests.support.tiny_models import make_tiny_model
from worker.cli import resolve_default_speculation


def test_model_without_head_falls_back_to_ngram_when_mode_unset(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECULATION", raising=False)
    folder = make_tiny_model(tmp_path / "plain")
    assert resolve_default_speculation(WorkerSettings(model=str(folder))).speculation == "ngram"


def test_explicit_mtp_is_kept_even_without_a_head(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECULATION", raising=False)
    folder = make_tiny_model(tmp_path / "plain")
    settings = WorkerSettings(model=str(folder), speculation="mtp")
    assert resolve_default_speculation(settings).speculation == "mtp"


def test_model_with_embedded_head_keeps_mtp(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECULATION", raising=False)
    folder = make_tiny_model_with_mtp(tmp_path / "with-mtp")
    assert resolve_default_speculation(WorkerSettings(model=str(folder))).speculation == "mtp"
