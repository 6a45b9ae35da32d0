"""Tool-call formats by model family: one parser protocol, a plain dict registry, the rule that picks one.

Every parser takes the model's answer text (after the think block) piece by piece and splits it
into content and OpenAI tool-call deltas; `finish()` gives the complete calls of a non-streamed
response. However the text is cut into pieces, the calls are the same as for the whole text, and
a malformed call comes back as content (the lane then ends with finish_reason "stop").

    hermes       <tool_call>{"name": "f", "arguments": {...}}</tool_call>        (Hermes, Qwen2.5/3)
    qwen3_xml    <tool_call>\\n<function=f>\\n<parameter=p>\\nvalue\\n</parameter>\\n</function>\\n</tool_call>
                                                                        (Qwen3-Coder, Qwen3.5)
    llama3_json  [<|python_tag|>]{"name": "f", "parameters": {...}}                (Llama 3.x)
    mistral      [TOOL_CALLS][{"name": "f", "arguments": {...}}] or [TOOL_CALLS]f[ARGS]{...}

The worker picks one from what its chat template asks the model to write (`choose_tool_parser`),
unless ARBOR_TOOL_PARSER / --tool-parser names one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from shared.tool_call_grammar import TOOL_FORMATS
from worker.chat.delimited_calls import DelimitedCallParser
from worker.chat.llama3_json import LLAMA3_JSON
from worker.chat.mistral_calls import MISTRAL
from worker.chat.qwen3_xml import qwen3_xml_format
from worker.chat.tool_calls import ToolCallDelta, ToolCallParser

ToolSchemas = Mapping[str, Any]  # function name -> its parameters' JSON schema


class ToolParser(Protocol):
    @property
    def done(self) -> bool:
        """`max_calls` calls have closed: what follows is not output."""
        ...

    def feed(self, text: str) -> ToolCallDelta: ...

    def flush(self) -> ToolCallDelta:
        """End of output: whatever is held back (a partial marker, an unclosed call) as content."""
        ...

    def finish(self) -> list[dict[str, Any]]:
        """Every well-formed call so far, as complete OpenAI tool calls."""
        ...


ToolParserFactory = Callable[[ToolSchemas, "int | None"], ToolParser]

TOOL_PARSERS: dict[str, ToolParserFactory] = {
    "hermes": lambda schemas, max_calls: ToolCallParser(max_calls=max_calls),
    "qwen3_xml": lambda schemas, max_calls: DelimitedCallParser(qwen3_xml_format(schemas), max_calls),
    "llama3_json": lambda schemas, max_calls: DelimitedCallParser(LLAMA3_JSON, max_calls),
    "mistral": lambda schemas, max_calls: DelimitedCallParser(MISTRAL, max_calls),
}
assert tuple(TOOL_PARSERS) == TOOL_FORMATS, "the grammar side builds forced calls for exactly these formats"

# What a template writes into the prompt when it asks for each format, most specific first: a
# Qwen3.5 template mentions both "<tool_call>" and "<function=", so the XML marks come before Hermes';
# a Hermes template names "parameters" (the tools' schemas), so Hermes comes before that Llama mark.
_TEMPLATE_MARKS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("qwen3_xml", ("<function=", "<parameter=")),
    ("mistral", ("[TOOL_CALLS]",)),
    ("llama3_json", ("<|python_tag|>",)),
    ("hermes", ("<tool_call>",)),
    ("llama3_json", ('"parameters": dictionary',)),  # Llama 3.2's JSON instruction, without the tag
)


def choose_tool_parser(template_source: str | None) -> tuple[str, str]:
    """(parser name, why): the format the chat template asks for; hermes when it names none."""
    source = template_source or ""
    for name, marks in _TEMPLATE_MARKS:
        found = [mark for mark in marks if mark in source]
        if found and (name != "qwen3_xml" or len(found) == len(marks)):
            return name, f"the chat template writes {' and '.join(found)}"
    return "hermes", "the chat template names no tool-call format (hermes is the default)"


def make_tool_parser(name: str, schemas: ToolSchemas, max_calls: int | None = None) -> ToolParser:
    return TOOL_PARSERS[name](schemas, max_calls)
