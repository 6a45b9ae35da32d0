"""One choice's emitted tokens -> the fields of its delta events: text, reasoning, tool calls, logprobs.

The pipeline, per token:  ids -> detokenizer + stop strings (TextOutput)
                              -> think tags (ReasoningParser): reasoning | content
                              -> the model family's tool-call format (worker/chat/tool_parser.py): content | tool_calls

Tokens go through one at a time, whatever step emitted them. So what the detokenizer holds back
depends on the tokens alone, not on how steps grouped them (replay, below, relies on it: a
detokenizer fed a step that ends inside a character emits nothing for the whole step), and the
reasoning budget is counted per token: a token counts when the parser is inside the think tags
after reading it. Once the budget is spent the close tag
is forced: `tokens_to_force()` hands the owner the tag's token ids (appended to the sequence, so
the model continues with the answer) and the parser treats the tag as content's start. A decode
step may emit several tokens at once, so with speculation the reasoning can run past the budget
by at most one step's tokens; they are already verified and committed, and are kept.

Every stage holds back only what it cannot decide yet, so feeding a resumed job's already
published tokens through a fresh `LaneOutput` (and dropping what comes out) leaves it exactly
where the dead worker's was: the rest of the stream continues without a seam.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import tokenizers

from shared.protocol import PromptLogprob, TokenLogprob, TopLogprob
from shared.tool_call_grammar import MAX_PARALLEL_CALLS
from worker.chat.forced_calls import ForcedCalls
from worker.chat.reasoning import ReasoningParser
from worker.chat.tool_parser import ToolParser, make_tool_parser
from worker.engine.logits_processing import TokenLogprobs
from worker.engine.prompt_logprobs import PromptLogprobs
from worker.engine.text_output import TextOutput


@dataclass(slots=True, frozen=True)
class ReasoningOptions:
    start_tag: str = "<think>"
    end_tag: str = "</think>"
    starts_in_reasoning: bool = False  # the prompt already opened the think tag
    budget: int | None = None  # tokens allowed inside the tags; None: unbounded
    close_ids: tuple[int, ...] = ()  # forced when the budget is spent: the end tag (and a break)


@dataclass(slots=True, frozen=True)
class OutputOptions:
    stop: tuple[str, ...] = ()
    include_stop: bool = False  # include_stop_str_in_output: the stop string ends the text, included
    min_tokens: int = 0  # stop strings are looked for only after this many tokens (vLLM's min_tokens)
    echo: str = ""  # completions' echo: the prompt's text, before the first output
    reasoning: ReasoningOptions | None = None
    parse_tool_calls: bool = False
    single_tool_call: bool = False  # parallel_tool_calls=false: the lane ends when its first call closes
    # tool_choice required or named: the lane ends at a call that repeats an earlier one
    # (worker/chat/forced_calls.py), and after MAX_PARALLEL_CALLS calls, as the grammar does
    forced_tool_calls: bool = False
    tool_parser: str = "hermes"  # a name in worker.chat.tool_parser.TOOL_PARSERS
    tool_schemas: Mapping[str, Any] = field(default_factory=dict)  # function name -> parameters schema
    num_logprobs: int | None = None  # None: no logprobs; k: the chosen token's and the top k
    num_prompt_logprobs: int | None = None  # None: none; k: each prompt token's and the top k


@dataclass(slots=True)
class LaneDelta:
    text: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def extend(self, other: LaneDelta) -> None:
        self.text += other.text
        self.reasoning += other.reasoning
        self.tool_calls.extend(other.tool_calls)

    @property
    def empty(self) -> bool:
        return not (self.text or self.reasoning or self.tool_calls)


class LaneOutput:
    def __init__(self, tokenizer: tokenizers.Tokenizer, options: OutputOptions, prompt_ids: Sequence[int]):
        self.options = options
        self._text = TextOutput(tokenizer, list(options.stop), prompt_ids, options.include_stop, options.min_tokens)
        reasoning = options.reasoning
        self._reasoning = (
            ReasoningParser(reasoning.start_tag, reasoning.end_tag, reasoning.starts_in_reasoning)
            if reasoning is not None
            else None
        )
        self._tools = _tool_parser(options) if options.parse_tool_calls else None
        self.num_reasoning_tokens = 0
        self._forced = False
        self._echo = options.echo  # goes out with the first delta (dropped with it when replayed)

    @property
    def stopped(self) -> bool:
        """A stop string was hit, or the calls allowed have closed: the lane must finish."""
        return self._text.stopped or self._calls_done

    @property
    def stop_sequence(self) -> str | None:
        """The stop string that ended the text, if one did."""
        return self._text.stop_sequence

    @property
    def _calls_done(self) -> bool:
        """The one call allowed, the last a forced turn allows, or a repeated one has closed."""
        return self._tools is not None and self._tools.done

    @property
    def made_tool_calls(self) -> bool:
        """At least one well-formed tool call (finish_reason "tool_calls")."""
        return self._tools is not None and bool(self._tools.finish())

    def add(self, token_ids: Sequence[int]) -> LaneDelta:
        if self._reasoning is None and self._tools is None:  # plain text: no parser's delta per token
            echo = self.take_echo() if token_ids else ""
            return LaneDelta(text=echo + "".join([self._text.add((token,)) for token in token_ids]))
        delta = LaneDelta()
        for token in token_ids:
            if self._calls_done:
                break  # what a step emitted after the last call is not output
            delta.extend(self._route(self._text.add([token])))
            if self._reasoning is not None and self._reasoning.in_reasoning:
                self.num_reasoning_tokens += 1
        return delta

    def take_echo(self) -> str:
        """The prompt's text, once: with the first output (or with the prompt's logprobs)."""
        echo, self._echo = self._echo, ""
        return echo

    def finish(self) -> LaneDelta:
        """Everything held back, at the end of the lane (nothing, after the last call allowed)."""
        if self._calls_done:
            return LaneDelta()
        delta = self._route(self._text.finish())
        delta.text = self.take_echo() + delta.text  # a lane that generated nothing (max_tokens 0)
        if self._reasoning is not None:
            flushed = self._reasoning.flush()
            delta.reasoning += flushed.reasoning
            delta.extend(self._content(flushed.content))
        if self._tools is not None:
            held = self._tools.flush()
            delta.text += held.content
        return delta

    def tokens_to_force(self) -> list[int]:
        """The close tag's ids, once, when the reasoning budget is spent (else [])."""
        options, parser = self.options.reasoning, self._reasoning
        if options is None or parser is None or options.budget is None or self._forced:
            return []
        if not parser.in_reasoning or self.num_reasoning_tokens < options.budget:
            return []
        self._forced = True
        parser.force_end()
        return list(options.close_ids)

    def _route(self, text: str) -> LaneDelta:
        if self._reasoning is None:
            return self._content(text)
        split = self._reasoning.feed(text)
        delta = self._content(split.content)
        delta.reasoning = split.reasoning
        return delta

    def _content(self, text: str) -> LaneDelta:
        if self._tools is None:
            return LaneDelta(text=text)
        parsed = self._tools.feed(text)
        return LaneDelta(text=parsed.content, tool_calls=parsed.tool_calls)


def _tool_parser(options: OutputOptions) -> ToolParser:
    if options.single_tool_call:
        return make_tool_parser(options.tool_parser, options.tool_schemas, max_calls=1)
    if options.forced_tool_calls:
        return ForcedCalls(make_tool_parser(options.tool_parser, options.tool_schemas, MAX_PARALLEL_CALLS))
    return make_tool_parser(options.tool_parser, options.tool_schemas)


def format_logprobs(tokenizer: tokenizers.Tokenizer, entries: Sequence[TokenLogprobs]) -> list[TokenLogprob]:
    """The runner's logprobs in the OpenAI shape: each token as text, with its UTF-8 bytes."""
    return [
        TokenLogprob(
            token=_text(tokenizer, entry.token_id),
            logprob=entry.logprob,
            bytes=list(_text(tokenizer, entry.token_id).encode()),
            top_logprobs=[
                TopLogprob(token=_text(tokenizer, token), logprob=logprob, bytes=list(_text(tokenizer, token).encode()))
                for token, logprob in entry.top
            ],
        )
        for entry in entries
    ]


def format_prompt_logprobs(
    tokenizer: tokenizers.Tokenizer, first_token_id: int, prompt: PromptLogprobs
) -> list[PromptLogprob]:
    """The prompt's logprobs on the wire; the first token has nothing before it (logprob None)."""
    first = PromptLogprob(token_id=first_token_id, token=_text(tokenizer, first_token_id), logprob=None, rank=None)
    entries = [first]
    for ranked in prompt.entries:
        entry = ranked.entry
        entries.append(
            PromptLogprob(
                token_id=entry.token_id,
                token=_text(tokenizer, entry.token_id),
                logprob=entry.logprob,
                rank=ranked.rank,
                top_ids=[token for token, _ in entry.top],
                top=[TopLogprob(token=_text(tokenizer, token), logprob=logprob) for token, logprob in entry.top],
            )
        )
    return entries


def _text(tokenizer: tokenizers.Tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)
