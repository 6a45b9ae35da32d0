"""The event names of a server-sent event stream, read incrementally as its bytes pass through.

Named events (`event: message_start`) keep their name; unnamed ones (chat completions' chunks)
are `message`, and chat's final `data: [DONE]` is `[DONE]`, so a log shows where the end came.
An error inside a 200 stream (an `error` event, or a chat chunk `{"error": ...}`) keeps its data.
"""

from __future__ import annotations

MAX_ERROR_CHARS = 4000


class SseNames:
    def __init__(self) -> None:
        self._pending = b""
        self._name: str | None = None
        self._data: list[str] = []
        self.names: list[str] = []
        self.errors: list[str] = []  # the data of each `error` event: why a 200 stream broke off

    def feed(self, chunk: bytes) -> None:
        lines = (self._pending + chunk).split(b"\n")
        self._pending = lines.pop()
        for raw in lines:
            self._line(raw.rstrip(b"\r").decode("utf-8", "replace"))

    def _line(self, line: str) -> None:
        if not line:
            if self._name is not None or self._data:
                self.names.append("[DONE]" if self._data == ["[DONE]"] else self._name or "message")
            if self._name == "error" or any('"error"' in data[:20] for data in self._data):
                self.errors.append("\n".join(self._data)[:MAX_ERROR_CHARS])
            self._name, self._data = None, []
        elif line.startswith("event:"):
            self._name = line[len("event:") :].strip()
        elif line.startswith("data:"):
            self._data.append(line[len("data:") :].strip())


def squeeze(names: list[str]) -> list[str]:
    """Runs of one name as `name x N`: a stream of 300 deltas reads as one line."""
    squeezed: list[str] = []
    run = 0
    for index, name in enumerate(names):
        run += 1
        if index + 1 == len(names) or names[index + 1] != name:
            squeezed.append(name if run == 1 else f"{name} x{run}")
            run = 0
    return squeezed
