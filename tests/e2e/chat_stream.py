"""A raw SSE chat client for the fault tests: what a client saw, and how its stream ended.

`ChatStream` folds `data:` lines into text; `BackgroundStream` runs one streaming request in a
thread while a test breaks something, so the test can watch it (`request_id` and `num_chunks`
arrive as the stream does) and then judge the outcome. A hang shows as an httpx read timeout.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

import httpx


@dataclass
class ChatStream:
    text: str = ""
    request_id: str | None = None  # the chunks' id: the job's id in Redis
    num_chunks: int = 0
    finish_reason: str | None = None
    error: dict | None = None  # an SSE error event's (or an HTTP error envelope's) "error" object
    done: bool = False  # `data: [DONE]` arrived

    def feed(self, line: str) -> None:
        if not line.startswith("data: "):
            return
        payload = line.removeprefix("data: ")
        if payload == "[DONE]":
            self.done = True
            return
        data = json.loads(payload)
        if "error" in data:
            self.error = data["error"]
            return
        self.num_chunks += 1
        self.request_id = data["id"]
        for choice in data["choices"]:
            self.text += choice["delta"].get("content") or ""
            self.finish_reason = choice.get("finish_reason") or self.finish_reason

    @property
    def complete(self) -> bool:
        return self.done and self.error is None and self.finish_reason is not None

    @property
    def clean_error(self) -> bool:
        """Ended by an error in the OpenAI envelope (an SSE error event is followed by [DONE])."""
        return self.error is not None and {"message", "type", "code"} <= set(self.error)


class BackgroundStream(threading.Thread):
    """One streaming chat request, read in a thread; `failure` holds a transport error, if any."""

    def __init__(self, base_url: str, body: dict, read_timeout_s: float):
        super().__init__(daemon=True)
        self.base_url = base_url
        self.body = body | {"stream": True}
        self.read_timeout_s = read_timeout_s
        self.stream = ChatStream()
        self.status: int | None = None
        self.failure: httpx.HTTPError | None = None

    def run(self) -> None:
        try:
            with (
                httpx.Client(base_url=self.base_url, timeout=self.read_timeout_s) as http,
                http.stream("POST", "/v1/chat/completions", json=self.body) as response,
            ):
                self.status = response.status_code
                if response.status_code != 200:
                    self.stream.error = json.loads(response.read())["error"]
                    return
                for line in response.iter_lines():
                    self.stream.feed(line)
        except httpx.HTTPError as error:
            self.failure = error

    def finish(self, timeout_s: float) -> ChatStream:
        """The stream once it has ended; fails if it is still running after `timeout_s` (a hang)."""
        self.join(timeout_s)
        assert not self.is_alive(), f"the stream did not end within {timeout_s} s: {self.stream}"
        assert not isinstance(self.failure, httpx.TimeoutException), f"the stream hung: {self.failure!r}"
        return self.stream
