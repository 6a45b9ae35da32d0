"""`arbor worker`: flags override the environment, the environment overrides the defaults."""

from __future__ import annotations

from ops.cli import build_parser
from worker.cli import worker_settings
from worker.redis_side.service import ServiceConfig


def test_flags_override_the_environment(monkeypatch):
    monkeypatch.setenv("SPECULATION", "ngram")
    monkeypatch.setenv("ARBOR_MAX_LANES", "3")
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:7777/0")
    monkeypatch.setenv("ARBOR_STREAM_INTERVAL", "3")
    args = build_parser().parse_args(
        [
            "worker",
            "--max-lanes",
            "5",
            "--model",
            "/models/qwen",
            "--worker-id",
            "w9",
            "--prefill-cache-bytes",
            "0",
            "--max-context",
            "1024",
            "--stream-interval",
            "2",
        ]
    )
    settings = worker_settings(args)
    assert (settings.max_lanes, settings.speculation, settings.redis_url) == (5, "ngram", "redis://127.0.0.1:7777/0")
    assert (settings.model, settings.worker_id, settings.prefill_cache_bytes, settings.max_context) == (
        "/models/qwen",
        "w9",
        0,
        1024,
    )
    config = ServiceConfig.from_settings(settings)
    assert (config.model_name, config.stream, config.max_lanes) == ("qwen", "arbor:requests:qwen", 5)
    assert config.stream_interval == 2


def test_defaults_come_from_worker_settings(monkeypatch):
    for name in ("SPECULATION", "MODEL", "ARBOR_MAX_LANES", "WORKER_ID", "ARBOR_STREAM_INTERVAL"):
        monkeypatch.delenv(name, raising=False)
    settings = worker_settings(build_parser().parse_args(["worker"]))
    assert settings.speculation == "auto" and settings.max_lanes == 32 and settings.worker_id
    assert settings.stream_interval == 1, "every step streams unless asked otherwise"


def test_the_tool_parser_flag_overrides_the_environment_and_arbor_up_passes_it_on(monkeypatch):
    from ops.launch.up import _worker_args

    monkeypatch.setenv("ARBOR_TOOL_PARSER", "mistral")
    assert worker_settings(build_parser().parse_args(["worker"])).tool_parser == "mistral"
    args = build_parser().parse_args(["worker", "--tool-parser", "qwen3_xml"])
    assert worker_settings(args).tool_parser == "qwen3_xml"
    up = build_parser().parse_args(["up", "--tool-parser", "llama3_json"])
    worker_argv = _worker_args(up)
    assert worker_argv[worker_argv.index("--tool-parser") + 1] == "llama3_json"
    assert worker_settings(build_parser().parse_args(worker_argv)).tool_parser == "llama3_json"


def test_an_unknown_tool_parser_is_refused():
    import pytest

    with pytest.raises(SystemExit):
        build_parser().parse_args(["worker", "--tool-parser", "nonsense"])


def test_arbor_up_passes_kernels_on_and_keeps_arbor_host_and_port(monkeypatch):
    from ops.launch.up import _check_settings, _worker_args

    up = build_parser().parse_args(["up", "--kernels", "torch"])
    worker_argv = _worker_args(up)
    assert worker_argv[worker_argv.index("--kernels") + 1] == "torch"
    assert worker_settings(build_parser().parse_args(worker_argv)).kernels == "torch"
    assert "--kernels" not in _worker_args(build_parser().parse_args(["up"])), "unset: the worker's own default"
    monkeypatch.setenv("ARBOR_HOST", "127.0.0.2")
    monkeypatch.setenv("ARBOR_PORT", "8123")
    gateway = _check_settings(build_parser().parse_args(["up"]))
    assert (gateway.host, gateway.port) == ("127.0.0.2", 8123)
    flagged = _check_settings(build_parser().parse_args(["up", "--port", "8124"]))
    assert (flagged.host, flagged.port) == ("127.0.0.2", 8124), "a flag wins over the variable"


def test_the_kernel_isa_comes_from_the_flag_or_the_environment(monkeypatch):
    from typing import get_args

    from shared.settings import WorkerSettings
    from worker.cli import KERNEL_ISA_CHOICES
    from worker.kernels.cpu_features import ISA_CHOICES

    assert KERNEL_ISA_CHOICES == ISA_CHOICES == get_args(WorkerSettings.model_fields["kernel_isa"].annotation)
    monkeypatch.delenv("ARBOR_KERNEL_ISA", raising=False)
    assert worker_settings(build_parser().parse_args(["worker"])).kernel_isa == "auto"
    monkeypatch.setenv("ARBOR_KERNEL_ISA", "avx2")
    assert worker_settings(build_parser().parse_args(["worker"])).kernel_isa == "avx2"
    assert worker_settings(build_parser().parse_args(["worker", "--kernel-isa", "portable"])).kernel_isa == "portable"
