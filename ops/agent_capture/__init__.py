"""Recording what agent CLIs (Claude Code, Codex, Qwen Code, opencode) send to Arbor."""
