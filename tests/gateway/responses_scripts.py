"""A function tool in the Responses shape, its chat form, and a peer script that calls it."""

from __future__ import annotations

import json

from shared.protocol import Job
from tests.gateway.protocol_peer import Step, delta, final

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CHAT_WEATHER = {
    "type": "function",
    "function": {k: v for k, v in WEATHER.items() if k != "type"},
}


def call_script(job: Job) -> list[Step]:
    """A call on a user turn; an answer from the tool's output on a tool turn."""
    last = job.request()["messages"][-1]
    if last["role"] == "tool":
        return [delta(f"It is {json.loads(last['content'])['temp_c']} C.", token_ids=[1]), final()]
    head = {"index": 0, "id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    return [
        delta("\n", token_ids=[1]),  # whitespace before a call opens no message
        delta(tool_calls=[head], token_ids=[2]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": '{"city": '}}], token_ids=[3]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": '"Paris"}'}}], token_ids=[4]),
        final("tool_calls", completion_tokens=4),
    ]
