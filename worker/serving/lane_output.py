"""One choice's emitted tokens -> the fields of its delta events: text, reasoning, tool calls, logprobs.

The pipeline, per token:  ids -> detokenizer + stop strings (TextOutput)
 (worker.chat.forced_calls.py), and after                          -> think tags (ReasoningParser): reasoning | content
 (worker.chat.forced_calls.py), and after                          -> the model family's tool-call format (worker/chat/tool_parser.py): content | tool_calls

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
 (worker.chat.forced_calls.py), and afterstart_tag: str = "<think>"
 (worker.chat.forced_calls.py), and afterend_tag: str = "</think>"
 (worker.chat.forced_calls.py), and afterstarts_in_reasoning: bool = False  # the prompt already opened the think tag
 (worker.chat.forced_calls.py), and afterbudget: int | None = None  # tokens allowed inside the tags; None: unbounded
 (worker.chat.forced_calls.py), and afterclose_ids: tuple[int, ...] = ()  # forced when the budget is spent: the end tag (and a break)


@dataclass(slots=True, frozen=True)
class OutputOptions:
 (worker.chat.forced_calls.py), and afterstop: tuple[str, ...] = ()
 (worker.chat.forced_calls.py), and afterinclude_stop: bool = False  # include_stop_str_in_output: the stop string ends the text, included
 (worker.chat.forced_calls.py), and aftermin_tokens: int = 0  # stop strings are looked for only after this many tokens (vLLM's min_tokens)
 (worker.chat.forced_calls.py), and afterecho: str = ""  # completions' echo: the prompt's text, before the first output
 (worker.chat.forced_calls.py), and afterreasoning: ReasoningOptions | None = None
 (worker.chat.forced_calls.py), and afterparse_tool_calls: bool = False
 (worker.chat.forced_calls.py), and aftersingle_tool_call: bool = False  # parallel_tool_calls=false: the lane ends when its first call closes
 (worker.chat.forced_calls.py), and after# tool_choice required or named: the lane ends at a call that repeats an earlier one
 (worker.chat.forced_calls.py), and after# (worker.chat.forced_calls.py), and after MAX_PARALLEL_CALLS calls, as the grammar does
 (worker.chat.forced_calls.py), and afterforced_tool_calls: bool = False
 (worker.chat.forced_calls.py), and aftertool_parser: str = "hermes"  # a name in worker.chat.tool_parser.TOOL_PARSERS
 (worker.chat.forced_calls.py), and aftertool_schemas: Mapping[str, Any] = field(default_factory=dict)  # function name -> parameters schema
 (worker.chat.forced_calls.py), and afternum_logprobs: int | None = None  # None: no logprobs; k: the chosen token's and the top k
 (worker.chat.forced_calls.py), and afternum_prompt_logprobs: int | None = None  # None: none; k: each prompt token's and the top k


@dataclass(slots=True)
class LaneDelta:
 (worker.chat.forced_calls.py), and aftertext: str = ""
 (worker.chat.forced_calls.py), and afterreasoning: str = ""
 (worker.chat.forced_calls.py), and aftertool_calls: list[dict[str, Any]] = field(default_factory=list)

 (worker.chat.forced_calls.py), and afterdef extend(self, other: LaneDelta) -> None:
 (worker.chat.forced_calls.py), and after    self.text += other.text
 (worker.chat.forced_calls.py), and after    self.reasoning += other.reasoning
 (worker.chat.forced_calls.py), and after    self.tool_calls.extend(other.tool_calls)

 (worker.chat.forced_calls.py), and after@property
 (worker.chat.forced_calls.py), and afterdef empty(self) -> bool:
 (worker.chat.forced_calls.py), and after    return not (self.text or self.reasoning or self.tool_calls)


class LaneOutput:
 (worker.chat.forced_calls.py), and afterdef __init__(self, tokenizer: tokenizers.Tokenizer, options: OutputOptions, prompt_ids: Sequence[int]):
 (worker.chat.forced_calls.py), and after    self.options = options
 (worker.chat.forced_calls.py), and after    self._text = TextOutput(tokenizer, list(options.stop), prompt_ids, options.include_stop, options.min_tokens)
 (worker.chat.forced_calls.py), and after    reasoning = options.reasoning
 (worker.chat.forced_calls.py), and after    self._reasoning = (
 (worker.chat.forced_calls.py), and after        ReasoningParser(reasoning.start_tag, reasoning.end_tag, reasoning.starts_in_reasoning)
 (worker.chat.forced_calls.py), and after        if reasoning is not None
 (worker.chat.forced_calls.py), and after        else None
 (worker.chat.forced_calls.py), and after    )
 (worker.chat.forced_calls.py), and after    self._tools = _tool_parser(options) if options.parse_tool_calls else None
 (worker.chat.forced_calls.py), and after    self.num_reasoning_tokens = 0
 (worker.chat.forced_calls.py), and after    self._forced = False
 (worker.chat.forced_calls.py), and after    self._echo = options.echo  # goes out with the first delta (dropped with it when replayed)

 (worker.chat.forced_calls.py), and after@property
 (worker.chat.forced_calls.py), and afterdef stopped(self) -> bool:
 (worker.chat.forced_calls.py), and after    """A stop string was hit, or the calls allowed have closed: the lane must finish."""
 (worker.chat.forced_calls.py), and after    return self._text.stopped or self._calls_done

 (worker.chat.forced_calls.py), and after@property
 (worker.chat.forced_calls.py), and afterdef stop_sequence(self) -> str | None:
 (worker.chat.forced_calls.py), and after    """The stop string that ended the text, if one did."""
 (worker.chat.forced_calls.py), and after    return self._text.stop_sequence

 (worker.chat.forced_calls.py), and after@property
 (worker.chat.forced_calls.py), and afterdef _calls_done(self) -> bool:
 (worker.chat.forced_calls.py), and after    """The one call allowed, the last a forced turn allows, or a repeated one has closed."""
 (worker.chat.forced_calls.py), and after    return self._tools is not None and self._tools.done

 (worker.chat.forced_calls.py), and after@property
 (worker.chat.forced_calls.py), and afterdef made_tool_calls(self) -> bool:
 (worker.chat.forced_calls.py), and after    """At least one well-formed tool call (finish_reason "tool_calls")."""
 (worker.chat.forced_calls.py), and after    return self._tools is not None and bool(self._tools.finish())

 (worker.chat.forced_calls.py), and afterdef add(self, token_ids: Sequence[int]) -> LaneDelta:
 (worker.chat.forced_calls.py), and after    if self._reasoning is None and self._tools is None:  # plain text: no parser's delta per token
 (worker.chat.forced_calls.py), and after        echo = self.take_echo() if token_ids else ""
 (worker.chat.forced_calls.py), and after        return LaneDelta(text=echo + "".join([self._text.add((token,)) for token in token_ids]))
 (worker.chat.forced_calls.py), and after    delta = LaneDelta()
 (worker.chat.forced_calls.py), and after    for token in token_ids:
 (worker.chat.forced_calls.py), and after        if self._calls_done:
 (worker.chat.forced_calls.py), and after            break  # what a step emitted after the last call is not output
 (worker.chat.forced_calls.py), and after        delta.extend(self._route(self._text.add([token])))
 (worker.chat.forced_calls.py), and after        if self._reasoning is not None and self._reasoning.in_reasoning:
 (worker.chat.forced_calls.py), and after            self.num_reasoning_tokens += 1
 (worker.chat.forced_calls.py), and after    return delta

 (worker.chat.forced_calls.py), and afterdef take_echo(self) -> str:
 (worker.chat.forced_calls.py), and after    """The prompt's text, once: with the first output (or with the prompt's logprobs)."""
 (worker.chat.forced_calls.py), and after    echo, self._echo = self._echo, ""
 (worker.chat.forced_calls.py), and after    return echo

 (worker.chat.forced_calls.py), and afterdef finish(self) -> LaneDelta:
 (worker.chat.forced_calls.py), and after    """Everything held back, at the end of the lane (nothing, after the last call allowed)."""
 (worker.chat.forced_calls.py), and after    if self._calls_done:
 (worker.chat.forced_calls.py), and after        return LaneDelta()
 (worker.chat.forced_calls.py), and after    delta = self._route(self._text.finish())
 (worker.chat.forced_calls.py), and after    delta.text = self.take_echo() + delta.text  # a lane that generated nothing (max_tokens 0)
 (worker.chat.forced_calls.py), and after    if self._reasoning is not None:
 (worker.chat.forced_calls.py), and after        flushed = self._reasoning.flush()
 (worker.chat.forced_calls.py), and after        delta.reasoning += flushed.reasoning
 (worker.chat.forced_calls.py), and after        delta.extend(self._content(flushed.content))
 (worker.chat.forced_calls.py), and after    if self._tools is not None:
 (worker.chat.forced_calls.py), and after        held = self._tools.flush()
 (worker.chat.forced_calls.py), and after        delta.text += held.content
 (worker.chat.forced_calls.py), and after    return delta

 (worker.chat.forced_calls.py), and afterdef tokens_to_force(self) -> list[int]:
 (worker.chat.forced_calls.py), and after    """The close tag's ids, once, when the reasoning budget is spent (else [])."""
 (worker.chat.forced_calls.py), and after    options, parser = self.options.reasoning, self._reasoning
 (worker.chat.forced_calls.py), and after    if options is None or parser is None or options.budget is None or self._forced:
 (worker.chat.forced_calls.py), and after        return []
 (worker.chat.forced_calls.py), and after    if not parser.in_reasoning or self.num_reasoning_tokens < options.budget:
 (worker.chat.forced_calls.py), and after        return []
 (worker.chat.forced_calls.py), and after    self._forced = True
 (worker.chat.forced_calls.py), and after    parser.force_end()
 (worker.chat.forced_calls.py), and after    return list(options.close_ids)

 (worker.chat.forced_calls.py), and afterdef _route(self, text: str) -> LaneDelta:
 (worker.chat.forced_calls.py), and after    if self._reasoning is None:
 (worker.chat.forced_calls.py), and after        return self._content(text)
 (worker.chat.forced_calls.py), and after    split = self._reasoning.feed(text)
 (worker.chat.forced_calls.py), and after    delta = self._content(split.content)
 (worker.chat.forced_calls.py), and after    delta.reasoning = split.reasoning
 (worker.chat.forced_calls.py), and after    return delta

 (worker.chat.forced_calls.py), and afterdef _content(self, text: str) -> LaneDelta:
 (worker.chat.forced_calls.py), and after    if self._tools is None:
 (worker.chat.forced_calls.py), and after        return LaneDelta(text=text)
 (worker.chat.forced_calls.py), and after    parsed = self._tools.feed(text)
 (worker.chat.forced_calls.py), and after    return LaneDelta(text=parsed.content, tool_calls=parsed.tool_calls)


def _tool_parser(options: OutputOptions) -> ToolParser:
 (worker.chat.forced_calls.py), and afterif options.single_tool_call:
 (worker.chat.forced_calls.py), and after    return make_tool_parser(options.tool_parser, options.tool_schemas, max_calls=1)
 (worker.chat.forced_calls.py), and afterif options.forced_tool_calls:
 (worker.chat.forced_calls.py), and after    return ForcedCalls(make_tool_parser(options.tool_parser, options.tool_schemas, MAX_PARALLEL_CALLS))
 (worker.chat.forced_calls.py), and afterreturn make_tool_parser(options.tool_parser, options.tool_schemas)


def format_logprobs(tokenizer: tokenizers.Tokenizer, entries: Sequence[TokenLogprobs]) -> list[TokenLogprob]:
 (worker.chat.forced_calls.py), and after"""The runner's logprobs in the OpenAI shape: each token as text, with its UTF-8 bytes."""
 (worker.chat.forced_calls.py), and afterreturn [
 (worker.chat.forced_calls.py), and after    TokenLogprob(
 (worker.chat.forced_calls.py), and after        token=_text(tokenizer, entry.token_id),
 (worker.chat.forced_calls.py), and after        logprob=entry.logprob,
 (worker.chat.forced_calls.py), and after        bytes=list(_text(tokenizer, entry.token_id).encode()),
 (worker.chat.forced_calls.py), and after        top_logprobs=[
 (worker.chat.forced_calls.py), and after            TopLogprob(token=_text(tokenizer, token), logprob=logprob, bytes=list(_text(tokenizer, token).encode()))
 (worker.chat.forced_calls.py), and after            for token, logprob in entry.top
 (worker.chat.forced_calls.py), and after        ],
 (worker.chat.forced_calls.py), and after    )
 (worker.chat.forced_calls.py), and after    for entry in entries
 (worker.chat.forced_calls.py), and after]


def format_prompt_logprobs(
 (worker.chat.forced_calls.py), and aftertokenizer: tokenizers.Tokenizer, first_token_id: int, prompt: PromptLogprobs
) -> list[PromptLogprob]:
 (worker.chat.forced_calls.py), and after"""The prompt's logprobs on the wire; the first token has nothing before it (logprob None)."""
 (worker.chat.forced_calls.py), and afterfirst = PromptLogprob(token_id=first_token_id, token=_text(tokenizer, first_token_id), logprob=None, rank=None)
 (worker.chat.forced_calls.py), and afterentries = [first]
 (worker.chat.forced_calls.py), and afterfor ranked in prompt.entries:
 (worker.chat.forced_calls.py), and after    entry = ranked.entry
 (worker.chat.forced_calls.py), and after    entries.append(
 (worker.chat.forced_calls.py), and after        PromptLogprob(
 (worker.chat.forced_calls.py), and after            token_id=entry.token_id,
 (worker.chat.forced_calls.py), and after            token=_text(tokenizer, entry.token_id),
 (worker.chat.forced_calls.py), and after            logprob=entry.logprob,
 (worker.chat.forced_calls.py), and after            rank=ranked.rank,
 (worker.chat.forced_calls.py), and after            top_ids=[token for token, _ in entry.top],
 (worker.chat.forced_calls.py), and after            top=[TopLogprob(token=_text(tokenizer, token), logprob=logprob) for token, logprob in entry.top],
 (worker.chat.forced_calls.py), and after        )
 (worker.chat.forced_calls.py), and after    )
 (worker.chat.forced_calls.py), and afterreturn entries


def _text(tokenizer: tokenizers.Tokenizer, token_id: int) -> str:
 (worker.chat.forced_calls.py), and afterreturn tokenizer.decode([token_id], skip_special_tokens=False)
