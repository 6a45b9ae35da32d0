"""A forced turn's calls: a tool parser wrapped so the turn ends at a call that repeats an earlier one.

Under `tool_choice` "required" with parallel calls, a small model that has written its call
often writes the very same call again, and again, until `max_tokens`. The grammar allows the
next call (it cannot compare one call with another), so the turn's end is decided here: a call
with the same name and the same arguments text as an earlier call of the turn is not output,
and the parser is `done` (the lane ends, `finish_reason` "tool_calls").

Streaming must not show a call that is then taken back, so the deltas of a call that could still
become a repeat are held: while its name and its arguments so far are a prefix of an earlier
call's, nothing of it goes out. Worked example, after call 0 `f({"a":1})` closed:

    call 1 streams  name f, args '{"a":'   -> held (a prefix of call 0)
                    args '{"a":2'          -> diverged: the held deltas and this one go out
    call 1 instead  args '{"a":1}', closes -> the same call: its deltas are dropped, done

Parsers that emit a call whole when it closes (the delimited formats) need no holding: the
call is compared at once. The grammar (shared/tool_call_grammar.py) writes nothing but calls and
the separators between them ("\\n", "; "), so whitespace outside the calls is not content either:
a turn of calls has no content, whether it ends at EOS or at a repeat.
"""

from __future__ import annotations

from typing import Any

from worker.chat.tool_calls import ToolCallDelta
from worker.chat.tool_parser import ToolParser


class ForcedCalls:
    """A `ToolParser` (wrapping one) that is `done` at the first repeated call, and passes no
    whitespace-only content."""

    def __init__(self, parser: ToolParser):
        self._parser = parser
        self._streamed: dict[int, tuple[str, str]] = {}  # index -> (name, arguments so far)
        self._indices: dict[str, int] = {}  # call id -> index
        self._free: set[int] = set()  # indices that cannot be a repeat any more: they stream
        self._held: list[dict[str, Any]] = []  # deltas not sent yet, in order
        self._num_closed = 0  # calls of the inner parser's `finish()` kept
        self._repeated = False

    @property
    def done(self) -> bool:
        return self._repeated or self._parser.done

    def feed(self, text: str) -> ToolCallDelta:
        inner = self._parser.feed(text)
        self._indices |= {d["id"]: d["index"] for d in inner.tool_calls if "id" in d}
        cut = self._close_calls()  # the repeat's index: it and what follows are not output
        for call_delta in inner.tool_calls:
            if cut is None or call_delta["index"] < cut:
                self._hold(call_delta)
        self._held = [d for d in self._held if cut is None or d["index"] < cut]
        return ToolCallDelta(content=_unless_blank(inner.content), tool_calls=self._release())

    def flush(self) -> ToolCallDelta:
        """A call still held at the end (cut by max_tokens) goes out as the plain parser would send it."""
        delta = ToolCallDelta() if self._repeated else self._parser.flush()
        delta.tool_calls[:0], self._held = self._held, []
        delta.content = _unless_blank(delta.content)
        return delta

    def finish(self) -> list[dict[str, Any]]:
        return self._parser.finish()[: self._num_closed]

    def _close_calls(self) -> int | None:
        """Keeps the calls closed since the last look, up to a repeat; the repeat's index, or None."""
        closed = self._parser.finish()
        for call in closed[self._num_closed :]:
            function = call["function"]
            kept = [(c["function"]["name"], c["function"]["arguments"]) for c in closed[: self._num_closed]]
            if (function["name"], function["arguments"]) in kept:
                self._repeated = True
                return self._indices[call["id"]]
            self._num_closed += 1
            self._free.add(self._indices[call["id"]])
        return None

    def _hold(self, call_delta: dict[str, Any]) -> None:
        index, function = call_delta["index"], call_delta.get("function", {})
        name, arguments = self._streamed.get(index, ("", ""))
        name, arguments = function.get("name") or name, arguments + (function.get("arguments") or "")
        self._streamed[index] = (name, arguments)
        self._held.append(call_delta)
        earlier = [call for i, call in self._streamed.items() if i < index]
        if not any(name == other and text.startswith(arguments) for other, text in earlier):
            self._free.add(index)  # diverged from every earlier call: it can no longer repeat one

    def _release(self) -> list[dict[str, Any]]:
        """The held deltas up to the first whose call may still be a repeat, in order."""
        num_free = next((n for n, d in enumerate(self._held) if d["index"] not in self._free), len(self._held))
        released, self._held = self._held[:num_free], self._held[num_free:]
        return released


def _unless_blank(content: str) -> str:
    return content if content.strip() else ""
