"""The agent CLIs Arbor is tested against: npm package, pinned version, and how each is pointed
at a local base URL with a private home, so a run touches nothing of the machine's and none of
them waits on its vendor's servers (telemetry, update checks and model lists switched off).

Each `prepare` writes the CLI's config under `home` and returns the argv before the prompt and
the environment to run it in; `base_url` is the server's root (no `/v1`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Set for every CLI: none of them may reach the internet from a test.
QUIET_ENV = {
    "DO_NOT_TRACK": "1",
    "NO_COLOR": "1",
    "CI": "1",
    "NODE_OPTIONS": "--no-warnings",
}


@dataclass(frozen=True, slots=True)
class AgentCli:
    name: str  # the fixtures' folder prefix: tests/fixtures/agent_traffic/<name>-<version>/
    package: str
    version: str
    binary: str  # in node_modules/.bin
    prepare: Callable[[Path, str, str], tuple[list[str], dict[str, str]]]  # (home, base_url, model)

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"


def _home_env(home: Path) -> dict[str, str]:
    return QUIET_ENV | {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local/share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local/state"),
    }


def prepare_claude_code(home: Path, base_url: str, model: str) -> tuple[list[str], dict[str, str]]:
    env = _home_env(home) | {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_AUTH_TOKEN": "arbor-local",
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,  # the side requests (titles, summaries) too
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "API_TIMEOUT_MS": "600000",  # a CPU prefill of its ~13K-token prompt is slow
        "CLAUDE_CODE_MAX_RETRIES": "1",  # its backoff after an error would outlast the run
        # It asks for 32,000 tokens a reply whatever the model; the server lowers that to the room
        # left, and a reply that rambled to the end of an 8K context left no room for the next turn
        # (the next prompt was 8,239 tokens: a 400). A user of a small-context model sets this too.
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "512",
    }
    return ["-p", "--max-turns", "3"], env


def prepare_codex(home: Path, base_url: str, model: str) -> tuple[list[str], dict[str, str]]:
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        f'model = "{model}"\nmodel_provider = "arbor"\n'
        "[model_providers.arbor]\n"
        f'name = "Arbor"\nbase_url = "{base_url}/v1"\nwire_api = "responses"\n'
        "request_max_retries = 0\nstream_max_retries = 0\nstream_idle_timeout_ms = 600000\n"
        "[analytics]\nenabled = false\n"
    )
    env = _home_env(home) | {"CODEX_HOME": str(codex_home)}
    return ["exec", "--skip-git-repo-check", "--sandbox", "read-only"], env


def prepare_qwen_code(home: Path, base_url: str, model: str) -> tuple[list[str], dict[str, str]]:
    settings = home / ".qwen" / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(
        json.dumps(
            {
                "security": {"auth": {"selectedType": "openai"}},
                "privacy": {"usageStatisticsEnabled": False},
                "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
                "telemetry": {"enabled": False},
            }
        )
    )
    openai = {"OPENAI_BASE_URL": f"{base_url}/v1", "OPENAI_API_KEY": "arbor-local", "OPENAI_MODEL": model}
    env = _home_env(home) | openai
    return ["-p"], env


def prepare_opencode(home: Path, base_url: str, model: str) -> tuple[list[str], dict[str, str]]:
    config = home / ".config" / "opencode" / "opencode.json"
    config.parent.mkdir(parents=True, exist_ok=True)
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "Arbor",
        "options": {"baseURL": f"{base_url}/v1", "apiKey": "arbor-local"},
        "models": {model: {"name": model}},
    }
    settings = {"provider": {"arbor": provider}, "model": f"arbor/{model}", "autoupdate": False, "share": "disabled"}
    config.write_text(json.dumps(settings))
    env = _home_env(home) | {
        "OPENCODE_CONFIG": str(config),
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    }
    return ["run", "--model", f"arbor/{model}"], env


AGENT_CLIS = {
    cli.name: cli
    for cli in (
        AgentCli("claude-code", "@anthropic-ai/claude-code", "2.1.332", "claude", prepare_claude_code),
        AgentCli("codex", "@openai/codex", "0.171.0", "codex", prepare_codex),
        AgentCli("qwen-code", "@qwen-code/qwen-code", "0.24.4", "qwen", prepare_qwen_code),
        AgentCli("opencode", "opencode-ai", "1.18.33", "opencode", prepare_opencode),
    )
}
