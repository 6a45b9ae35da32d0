"""The shape of a request Codex CLI sends mid-session, recorded from its Responses client."""

from __future__ import annotations

from typing import Any

SHELL = {
    "type": "function",
    "name": "shell",
    "description": "Runs a shell command and returns its output.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "array", "items": {"type": "string"}}, "workdir": {"type": "string"}},
        "required": ["command"],
        "additionalProperties": False,
    },
}


def codex_body(model: str) -> dict[str, Any]:
    """Hosted and custom tools, replayed reasoning with encrypted content, calls of tools Arbor never
    runs, `store`, `include`, a prompt cache key: streamed."""
    return {
        "model": model,
        "instructions": "You are a coding agent running in the Codex CLI.",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions/>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context/>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list the files"}]},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": "**Listing files**"}],
                "content": None,
                "encrypted_content": "gAAAAABo-opaque",
            },
            {
                "type": "function_call",
                "id": "fc_1",
                "name": "shell",
                "arguments": '{"command":["ls"]}',
                "call_id": "c1",
            },
            {"type": "function_call_output", "call_id": "c1", "output": "README.md\nsrc"},
            {"type": "custom_tool_call", "status": "completed", "call_id": "c2", "name": "apply_patch", "input": "***"},
            {"type": "custom_tool_call_output", "call_id": "c2", "output": "Done!"},
            {
                "type": "web_search_call",
                "id": "ws_1",
                "status": "completed",
                "action": {"type": "search", "query": "x"},
            },
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Two files."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
        ],
        "tools": [
            SHELL,
            {
                "type": "custom",
                "name": "apply_patch",
                "description": "Edit files.",
                "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
            },
            {"type": "web_search"},
            {"type": "local_shell"},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": True,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199a1b2-session",
        "text": {"verbosity": "medium"},
    }


def codex_probe(model: str) -> dict[str, Any]:
    """What Codex sends to check a provider before a session: empty input, one token."""
    return {"model": model, "input": "", "max_output_tokens": 1, "store": False, "stream": False}
