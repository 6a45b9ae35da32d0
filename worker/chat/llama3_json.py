"""Llama 3.x JSON tool calls: `{"name": "f", "parameters": {...}}`, alone or after `<|python_tag|>`.

Llama 3.1-3.3 templates ask for the object as the whole answer; several calls follow each other
separated by "; " or a line break. A "{" opens a call only at the answer's start or right after
a call, so JSON written inside prose stays content. "arguments" is accepted for "parameters"
(vLLM's llama3_json parser does the same; some fine-tunes write it).
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.chat.delimited_calls import Scan, arguments_object, json_or_none, json_value_end, skip_whitespace

PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True, slots=True)
class Llama3JsonFormat:
    markers: tuple[str, ...] = (PYTHON_TAG,)
    opens_on_brace: bool = True

    def scan(self, marker: str, body: str) -> Scan | None:
        start = skip_whitespace(body)
        if start == len(body):
            return None
        if body[start] != "{":
            return Scan(None, start)  # python_tag then code (a built-in tool): content
        end = json_value_end(body, start)
        if end is None:
            return None
        value = json_or_none(body[start:end])
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return Scan(None, end)
        arguments = arguments_object(value.get("parameters", value.get("arguments", {})))
        return Scan(None if arguments is None else [(value["name"], arguments)], end)


LLAMA3_JSON = Llama3JsonFormat()
