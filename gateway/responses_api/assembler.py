"""Protocol events -> the response's output items, and the Responses stream events that build them.

One assembler serves both replies: a stream sends its events, a whole reply only keeps the
response object it built, so the two always agree. The events, for reasoning then a call:

    response.created, response.in_progress                  (opening)
    response.output_item.added       {reasoning item}       output_index 0
    response.content_part.added      {reasoning_text}
    response.reasoning_text.delta    ...
    response.reasoning_text.done, response.content_part.done, response.output_item.done
    response.output_item.added       {function_call item}   output_index 1
    response.function_call_arguments.delta ...
    response.function_call_arguments.done, response.output_item.done
    response.completed | response.incomplete                (terminal, after the store)

Text makes a `message` item (`content_part.added`, `output_text.delta`, `output_text.done`,
`content_part.done`). An item closes when output of another kind starts. Every event carries
`sequence_number`, 0 first.

Whitespace that is all the text between or before calls (a newline between two calls, the
blank line after a think block) opens no message item: it is held until text follows, and
dropped if a call follows or the turn ends after calls. Within one delta the order is
reasoning, text, calls (the protocol merges a step's output by kind, as chat streams it).
`reasoning_tokens` counts the tokens of deltas that carried reasoning text: a delta that also
closed the think block counts whole, so it may exceed the reasoning by a step's tokens.
"""

from __future__ import annotations

import time
from typing import Any

from gateway.errors import ApiError
from gateway.responses_api.objects import (
    FunctionCallOutput,
    IncompleteDetails,
    InputTokensDetails,
    ItemStatus,
    MessageOutput,
    OutputItem,
    OutputText,
    OutputTokensDetails,
    ReasoningOutput,
    ReasoningText,
    ResponseError,
    ResponseObject,
    ResponseUsage,
    dump_response,
    new_item_id,
)
from shared.protocol import DeltaEvent, FinalEvent, ToolCallDelta

StreamEvent = dict[str, Any]


class ResponseAssembler:
    def __init__(self, response: ResponseObject) -> None:
        self.response = response
        self._sequence_number = 0
        self._open: OutputItem | None = None
        self._held_text = ""  # whitespace not yet in a message (see the module docstring)
        self._calls: dict[int, FunctionCallOutput] = {}  # the protocol's tool-call index -> item
        self._reasoning_tokens = 0

    def opening(self) -> list[StreamEvent]:
        return [self._lifecycle("response.created"), self._lifecycle("response.in_progress")]

    def add(self, event: DeltaEvent | FinalEvent) -> list[StreamEvent]:
        if isinstance(event, FinalEvent):
            return self._finish(event)
        events: list[StreamEvent] = []
        if event.reasoning:
            self._reasoning_tokens += len(event.token_ids)
            events += self._reasoning(event.reasoning)
        if event.text:
            events += self._text(event.text)
        for call in event.tool_calls:
            events += self._tool_call(call)
        return events

    def terminal(self) -> list[StreamEvent]:
        """response.completed or response.incomplete: sent once the response is stored."""
        kind = "response.incomplete" if self.response.status == "incomplete" else "response.completed"
        return [self._lifecycle(kind)]

    def failed(self, error: ApiError) -> list[StreamEvent]:
        self.response.status = "failed"
        self.response.error = ResponseError(code=error.code, message=error.message)
        return [self._lifecycle("response.failed")]

    # -- items ---------------------------------------------------------------------------------

    def _reasoning(self, text: str) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        if not isinstance(self._open, ReasoningOutput):
            events += self._close()
            events += self._add_item(ReasoningOutput(id=new_item_id("rs")))
        item = self._open
        assert isinstance(item, ReasoningOutput)
        item.content[0].text += text
        return [*events, self._content_event("response.reasoning_text.delta", item, delta=text)]

    def _text(self, text: str, force: bool = False) -> list[StreamEvent]:
        if not isinstance(self._open, MessageOutput):
            self._held_text += text
            if not (force or self._held_text.strip()):
                return []
            text, self._held_text = self._held_text, ""
            events = self._close() + self._add_item(MessageOutput(id=new_item_id("msg")))
        else:
            events = []
        item = self._open
        assert isinstance(item, MessageOutput)
        item.content[0].text += text
        return [*events, self._content_event("response.output_text.delta", item, delta=text, logprobs=[])]

    def _tool_call(self, delta: ToolCallDelta) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        item = self._calls.get(delta.index)
        if item is None:
            self._held_text = ""
            name = delta.function.name if delta.function is not None else None
            item = FunctionCallOutput(id=new_item_id("fc"), call_id=delta.id or new_item_id("call"), name=name or "")
            self._calls[delta.index] = item
            events += self._close() + self._add_item(item)
        fragment = delta.function.arguments if delta.function is not None else None
        if fragment:
            item.arguments += fragment
            events.append(self._item_event("response.function_call_arguments.delta", item, delta=fragment))
        return events

    def _add_item(self, item: OutputItem) -> list[StreamEvent]:
        """output_item.added with the item empty; a message or reasoning item then gets its one
        content part (content_part.added)."""
        self.response.output.append(item)
        self._open = item
        events = [self._event("response.output_item.added", output_index=self._index(item), item=_dump(item))]
        part: OutputText | ReasoningText
        if isinstance(item, MessageOutput):
            item.content.append(part := OutputText())
        elif isinstance(item, ReasoningOutput):
            item.content.append(part := ReasoningText())
        else:
            return events
        events.append(self._content_event("response.content_part.added", item, part=part.model_dump(mode="json")))
        return events

    def _close(self, status: ItemStatus = "completed") -> list[StreamEvent]:
        item, self._open = self._open, None
        if item is None:
            return []
        item.status = status
        events = []
        if isinstance(item, FunctionCallOutput):
            events.append(self._item_event("response.function_call_arguments.done", item, arguments=item.arguments))
        else:
            part = item.content[0]
            done = "response.output_text.done" if isinstance(item, MessageOutput) else "response.reasoning_text.done"
            extra: dict[str, Any] = {"logprobs": []} if isinstance(item, MessageOutput) else {}
            events.append(self._content_event(done, item, text=part.text, **extra))
            events.append(self._content_event("response.content_part.done", item, part=part.model_dump(mode="json")))
        events.append(self._event("response.output_item.done", output_index=self._index(item), item=_dump(item)))
        return events

    # -- the end -------------------------------------------------------------------------------

    def _finish(self, event: FinalEvent) -> list[StreamEvent]:
        incomplete = event.finish_reason == "length"
        events: list[StreamEvent] = []
        if self._held_text and not self._calls:  # a whitespace-only answer is still the answer
            events += self._text("", force=True)
        events += self._close("incomplete" if incomplete else "completed")
        response = self.response
        response.status = "incomplete" if incomplete else "completed"
        response.incomplete_details = IncompleteDetails(reason="max_output_tokens") if incomplete else None
        response.completed_at = int(time.time())
        response.usage = self._usage(event)
        return events

    def _usage(self, event: FinalEvent) -> ResponseUsage:
        usage = event.usage
        cached = usage.cached_tokens
        return ResponseUsage(
            input_tokens=usage.prompt_tokens,
            input_tokens_details=InputTokensDetails(cached_tokens=cached),
            output_tokens=usage.completion_tokens,
            output_tokens_details=OutputTokensDetails(
                reasoning_tokens=min(self._reasoning_tokens, usage.completion_tokens)
            ),
            total_tokens=usage.prompt_tokens + usage.completion_tokens,
        )

    # -- event shapes --------------------------------------------------------------------------

    def _lifecycle(self, kind: str) -> StreamEvent:
        return self._event(kind, response=dump_response(self.response))

    def _item_event(self, kind: str, item: OutputItem, **fields: Any) -> StreamEvent:
        return self._event(kind, item_id=item.id, output_index=self._index(item), **fields)

    def _content_event(self, kind: str, item: OutputItem, **fields: Any) -> StreamEvent:
        return self._item_event(kind, item, content_index=0, **fields)

    def _event(self, kind: str, **fields: Any) -> StreamEvent:
        event = {"type": kind, "sequence_number": self._sequence_number, **fields}
        self._sequence_number += 1
        return event

    def _index(self, item: OutputItem) -> int:
        return next(i for i, candidate in enumerate(self.response.output) if candidate is item)


def _dump(item: OutputItem) -> dict[str, Any]:
    dumped: dict[str, Any] = item.model_dump(mode="json")
    return dumped
