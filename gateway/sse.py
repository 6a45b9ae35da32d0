"""Server-sent events exactly as OpenAI frames them: `data: <json>\n\n`, then `data: [DONE]\n\n`."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from gateway.completion_bodies import dump_json

MEDIA_TYPE = "text/event-stream"
DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy buffering


def sse_data(payload: BaseModel | dict[str, Any]) -> bytes:
    text = dump_json(payload) if isinstance(payload, BaseModel) else json.dumps(payload, separators=(",", ":"))
    return f"data: {text}\n\n".encode()
