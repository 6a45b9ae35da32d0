"""Settings come from the environment under the documented names."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.settings import GatewaySettings, WorkerSettings


def test_gateway_reads_shared_and_prefixed_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:7000/1")
    monkeypatch.setenv("ARBOR_API_KEYS", " k1, k2 ,,")
    monkeypatch.setenv("ARBOR_MAX_QUEUE", "12")
    monkeypatch.setenv("ARBOR_AUTH_HEALTH_METRICS", "true")
    monkeypatch.setenv("ARBOR_REQUEST_TIMEOUT_S", "30")

    settings = GatewaySettings()

    assert settings.redis_url == "redis://127.0.0.1:7000/1"
    assert settings.api_keys == ("k1", "k2")
    assert (settings.max_queue, settings.auth_health_metrics, settings.request_timeout_s) == (12, True, 30.0)


def test_gateway_defaults_are_open_and_local(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("REDIS_URL", "ARBOR_API_KEYS", "ARBOR_HOST", "ARBOR_PORT"):
        monkeypatch.delenv(name, raising=False)

    settings = GatewaySettings()

    assert settings.api_keys == () and settings.host == "127.0.0.1" and settings.port == 8000
    assert settings.redis_url.startswith("redis://127.0.0.1")


def test_default_max_tokens_must_fit_the_cap() -> None:
    with pytest.raises(ValidationError, match="default_max_tokens"):
        GatewaySettings(default_max_tokens=100, max_tokens_cap=10)


@pytest.mark.parametrize(
    "build",
    [
        lambda url, key: GatewaySettings(redis_url=url, api_keys=key, default_max_tokens=100, max_tokens_cap=10),
        lambda url, key: GatewaySettings(redis_url=url, api_keys=key, max_queue="many"),
        lambda url, key: WorkerSettings(redis_url=url, heartbeat_ttl_s=0.5, heartbeat_interval_s=1.0),
        lambda url, key: WorkerSettings(redis_url=url, max_lanes="all"),
    ],
)
def test_settings_errors_name_the_field_but_never_echo_the_input(build) -> None:
    # The input holds REDIS_URL's password and the API keys, and the CLI prints the error.
    with pytest.raises(ValidationError) as caught:
        build("redis://:pw-zyxw@h:1/0", "sk-qrst")

    text = str(caught.value)
    assert "input_value" not in text and "pw-zyxw" not in text and "sk-qrst" not in text, text
    assert any(field in text for field in ("default_max_tokens", "max_queue", "heartbeat_ttl_s", "max_lanes"))


def test_worker_reads_design_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL", "/models/Qwen3-0.6B/")
    monkeypatch.setenv("DRAFT", "/models/dflash")
    monkeypatch.setenv("SPECULATION", "tree")
    monkeypatch.setenv("WORKER_ID", "w-7")
    monkeypatch.setenv("ARBOR_MAX_LANES", "3")

    settings = WorkerSettings()

    assert (settings.model, settings.draft, settings.speculation) == (
        "/models/Qwen3-0.6B/",
        "/models/dflash",
        "tree",
    )
    assert (settings.worker_id, settings.max_lanes, settings.model_name) == ("w-7", 3, "Qwen3-0.6B")


def test_worker_defaults_to_auto_and_a_unique_id(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MODEL", "SPECULATION", "WORKER_ID", "DRAFT"):
        monkeypatch.delenv(name, raising=False)

    first, second = WorkerSettings(), WorkerSettings()

    assert first.speculation == "auto" and first.draft is None
    assert first.worker_id != second.worker_id
    assert first.model_name == "SmolLM2-135M-Instruct"


def test_worker_rejects_an_unknown_mode_and_a_short_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECULATION", "eagle")
    with pytest.raises(ValidationError, match="SPECULATION"):
        WorkerSettings()
    monkeypatch.delenv("SPECULATION")
    with pytest.raises(ValidationError, match="heartbeat_ttl_s"):
        WorkerSettings(heartbeat_interval_s=2, heartbeat_ttl_s=1)


def test_gguf_model_names_drop_the_extension() -> None:
    assert WorkerSettings(model="/w/SmolLM2-135M-Instruct.Q4_1.gguf").model_name == "SmolLM2-135M-Instruct.Q4_1"
    assert WorkerSettings(model="x", served_model_name="smol").model_name == "smol"


def test_a_served_model_name_list_is_the_name_then_aliases(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARBOR_SERVED_MODEL_NAME", " qwen , claude-sonnet-4-5,,gpt-5,qwen")
    settings = WorkerSettings(model="/m/Qwen3.5-0.8B")

    assert settings.model_name == "qwen"
    assert settings.model_aliases == ("claude-sonnet-4-5", "gpt-5")
    assert WorkerSettings(model="/m/Qwen3.5-0.8B", served_model_name="").model_aliases == ()
