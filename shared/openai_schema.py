"""The request bodies of /v1/chat/completions and /v1/completions, validated strictly.

Every field a vLLM user sends is either handled or refused by name: understood-but-unsupported
values raise `UnsupportedField`; a field Arbor does not know is ignored, as vLLM ignores it
(`shared.request_fields`: logged, counted, a 400 under `ARBOR_STRICT_REQUEST_FIELDS`).
Types are strict: "5" is not a number and "true" is not a boolean (ints are fine for floats).
Deployment limits (max_tokens cap, n cap) come in through the validation context; a max_tokens
above the cap is lowered to it, as llama.cpp's server does, not refused:

    ChatCompletionRequest.model_validate_json(raw, context=limits_context(Limits(8192, 8, 64)))

Without a context (the worker re-reading a job body) the limits are not checked again.

Reasoning budget: `reasoning_budget` is the number of tokens the model may spend between its
think tags before the close tag is forced. OpenAI's `reasoning_effort` maps to a budget:
none -> 0, minimal -> 256, low -> 1024, medium -> 4096, high -> 16384. Give one, not both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from shared.openai_messages import Message, Tool, ToolChoice
from shared.priority import MAX_PRIORITY, MIN_PRIORITY
from shared.request_fields import Lenient
from shared.sampling import LOGIT_BIAS_LIMIT, SamplingParams
from shared.structured_output import (
    StructuredOutput,
    StructuredOutputError,
    choice_output,
    json_schema_output,
    tool_call_output,
)

REASONING_EFFORT_BUDGETS = {"none": 0, "minimal": 256, "low": 1024, "medium": 4096, "high": 16384}
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default when a request omits temperature


class UnsupportedField(ValueError):
    """A field Arbor understands but does not implement; `param` names it for the error envelope."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


@dataclass(frozen=True, slots=True)
class Limits:
    max_tokens: int  # largest max_tokens / max_completion_tokens accepted
    max_n: int
    max_prompts: int  # prompts in one completions request (each becomes a job)


def limits_context(limits: Limits) -> dict[str, Limits]:
    return {"limits": limits}


def _limits(info: ValidationInfo) -> Limits | None:
    return (info.context or {}).get("limits")


class StreamOptions(Lenient):
    include_usage: bool = False


class JsonSchemaFormat(Lenient):
    """`response_format.json_schema`: the answer is JSON that validates against `schema`. `strict`
    is accepted either way: the schema is always enforced token by token, never just suggested."""

    model_config = ConfigDict(populate_by_name=True)

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(Lenient):
    """`text`, `json_object` (the answer is one JSON object) or `json_schema` (one that validates)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise UnsupportedField("response_format", "json_schema is given with type 'json_schema', and only then")
        return self

    def structured_output(self) -> StructuredOutput | None:
        if self.type == "json_object":
            return StructuredOutput("json_object", "", "response_format")
        if self.json_schema is not None:
            return json_schema_output(self.json_schema.schema_, "response_format.json_schema.schema")
        return None


class StructuredOutputs(Lenient):
    """vLLM's `structured_outputs`: one of json (a schema), regex, choice, grammar (Lark or GBNF)
    or json_object."""

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def structured_outputs(self) -> list[StructuredOutput]:
        found = []
        if self.json_ is not None:
            found.append(json_schema_output(self.json_, "structured_outputs.json"))
        if self.regex is not None:
            found.append(StructuredOutput("regex", self.regex, "structured_outputs.regex"))
        if self.choice is not None:
            found.append(choice_output(self.choice, "structured_outputs.choice"))
        if self.grammar is not None:
            found.append(StructuredOutput("grammar", self.grammar, "structured_outputs.grammar"))
        if self.json_object:
            found.append(StructuredOutput("json_object", "", "structured_outputs.json_object"))
        return found


class _GenerationRequest(Lenient):
    """Fields both endpoints share: the model, streaming, n and sampling."""

    model: str = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)  # -1 and 0 both mean off
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    ignore_eos: bool = False
    include_speculation_stats: bool = False  # Arbor's: `usage.speculation`, what drafting did for this request
    # vLLM's: lower runs sooner; None takes the API key's default (`shared.priority`)
    priority: int | None = Field(None, ge=MIN_PRIORITY, le=MAX_PRIORITY)
    include_stop_str_in_output: bool = False  # vLLM's: the stop string that ended the text is kept
    min_tokens: int | None = Field(None, ge=0)  # vLLM's: tokens before EOS, stop tokens or stop strings may end it
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None  # OpenAI's on chat; vLLM takes it on completions too
    structured_outputs: StructuredOutputs | None = None  # vLLM's
    guided_json: dict[str, Any] | str | None = None  # vLLM's older names for the same constraints
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @field_validator("n")
    @classmethod
    def _n_within_cap(cls, value: int, info: ValidationInfo) -> int:
        limits = _limits(info)
        if limits is not None and value > limits.max_n:
            raise ValueError(f"n={value} exceeds the limit of {limits.max_n}")
        return value

    @field_validator("max_tokens", "max_completion_tokens", check_fields=False)
    @classmethod
    def _max_tokens_within_cap(cls, value: int | None, info: ValidationInfo) -> int | None:
        """Lowered to the deployment's cap rather than refused (the worker lowers it further to the
        room the prompt leaves): agent CLIs ask for 32000 whatever the model."""
        limits = _limits(info)
        if value is not None and limits is not None:
            return min(value, limits.max_tokens)
        return value

    @field_validator("stop")
    @classmethod
    def _stops_not_empty(cls, value: str | list[str] | None) -> str | list[str] | None:
        if value is not None and any(not stop for stop in _as_list(value)):
            raise ValueError("stop strings must not be empty")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _token_ids_and_range(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        """OpenAI's form: token ids as the JSON object's keys, biases in [-100, 100]. Whether an
        id is inside the vocabulary only the worker knows (it rejects the job if not)."""
        for key, bias in (value or {}).items():
            if not (key.isascii() and key.isdigit()):
                raise ValueError(f"key {key[:40]!r} is not a token id (a non-negative integer)")
            if not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT:
                limit = f"{LOGIT_BIAS_LIMIT:g}"
                raise ValueError(f"bias {bias} for token {key} is outside [-{limit}, {limit}]")
        return value

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _GenerationRequest:
        if self.stream_options is not None and not self.stream:
            raise UnsupportedField("stream_options", "is only allowed when stream is true")
        return self

    @model_validator(mode="after")
    def _min_tokens_within_max(self) -> _GenerationRequest:
        max_tokens = self.requested_max_tokens()
        if self.min_tokens and max_tokens is not None and self.min_tokens > max_tokens:
            raise UnsupportedField("min_tokens", f"{self.min_tokens} is more than max_tokens ({max_tokens})")
        return self

    @model_validator(mode="after")
    def _one_constraint_that_compiles(self) -> _GenerationRequest:
        """At most one constraint, checked by the grammar engine here, before anything is queued
        (cached by grammar: a repeated schema costs a dict lookup)."""
        try:
            found = self.structured_outputs_requested()
            if len(found) > 1:
                raise UnsupportedField(found[1].field, f"cannot be combined with {found[0].field}: give one constraint")
            if found and self.min_tokens:
                raise UnsupportedField("min_tokens", f"cannot be combined with {found[0].field}, which ends the text")
            if found:
                found[0].check()
        except StructuredOutputError as error:
            raise _unsupported(error) from None
        return self

    def structured_outputs_requested(self) -> list[StructuredOutput]:
        found = [] if self.response_format is None else [self.response_format.structured_output()]
        if self.structured_outputs is not None:
            found += self.structured_outputs.structured_outputs()
        if self.guided_json is not None:
            found.append(json_schema_output(self.guided_json, "guided_json"))
        if self.guided_regex is not None:
            found.append(StructuredOutput("regex", self.guided_regex, "guided_regex"))
        if self.guided_choice is not None:
            found.append(choice_output(self.guided_choice, "guided_choice"))
        if self.guided_grammar is not None:
            found.append(StructuredOutput("grammar", self.guided_grammar, "guided_grammar"))
        return [output for output in found if output is not None]

    def structured_output(self) -> StructuredOutput | None:
        """The request's one constraint on its text, if any (validation allowed at most one)."""
        found = self.structured_outputs_requested()
        return found[0] if found else None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


class ChatCompletionRequest(_GenerationRequest):
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None  # false: at most one call (the choice ends when it closes)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    chat_template_kwargs: dict[str, Any] | None = None  # e.g. {"enable_thinking": false}
    reasoning_budget: int | None = Field(None, ge=0)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    # OpenAI platform fields. Each is accepted where its value asks for what Arbor does anyway and
    # refused by name where it asks for more: Arbor stores nothing and has one tier and text only.
    store: bool | None = None
    metadata: dict[str, str] | None = Field(None, max_length=16)  # tags, like `user`: accepted, used by nothing
    service_tier: str | None = None
    modalities: list[str] | None = None
    safety_identifier: str | None = None  # OpenAI's successor to `user`

    @field_validator("store")
    @classmethod
    def _nothing_stored(cls, value: bool | None) -> bool | None:
        if value:
            raise UnsupportedField("store", "true is not supported: Arbor keeps no completions")
        return value

    @field_validator("service_tier")
    @classmethod
    def _one_tier(cls, value: str | None) -> str | None:
        return one_service_tier(value)

    @field_validator("modalities")
    @classmethod
    def _text_out(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and value != ["text"]:
            raise UnsupportedField("modalities", "only ['text'] is supported")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise UnsupportedField("top_logprobs", "requires logprobs to be true")
        if self.reasoning_budget is not None and self.reasoning_effort is not None:
            raise UnsupportedField("reasoning_effort", "give reasoning_budget or reasoning_effort, not both")
        forced = self.forced_tool_call()
        text_constraint = super().structured_output()
        if text_constraint is not None and self.tools and self.tool_choice != "none":
            raise UnsupportedField(
                text_constraint.field, "cannot be combined with tools (unless tool_choice is 'none')"
            )
        if forced is not None:
            if self.min_tokens:
                raise UnsupportedField("min_tokens", "cannot be combined with a forced tool call, which ends the text")
            try:
                forced.check()
            except StructuredOutputError as error:
                raise _unsupported(error) from None
        return self

    def forced_tool_call(self) -> StructuredOutput | None:
        """tool_choice 'required' or a named function: the answer is a call (or, with parallel
        calls, calls), in the worker's tool-call format (the worker sets it), its arguments by
        the function's schema."""
        choice = self.tool_choice
        if choice is None or choice in ("auto", "none"):
            return None
        if not self.tools:
            raise UnsupportedField("tool_choice", "a forced tool call needs tools")
        functions = [tool.function.model_dump(exclude_none=True) for tool in self.tools]
        if not isinstance(choice, str):
            functions = [function for function in functions if function["name"] == choice.function.name]
            if not functions:
                raise UnsupportedField("tool_choice", f"names {choice.function.name!r}, which is not in tools")
        parallel = choice == "required" and self.parallel_tool_calls is not False
        return tool_call_output(functions, parallel, "tool_choice")

    def structured_output(self) -> StructuredOutput | None:
        return self.forced_tool_call() or super().structured_output()

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def reasoning_budget_tokens(self) -> int | None:
        """Tokens allowed between the think tags; None means unbounded."""
        if self.reasoning_effort is not None:
            return REASONING_EFFORT_BUDGETS[self.reasoning_effort]
        return self.reasoning_budget


class CompletionRequest(_GenerationRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    # 0 only with echo or prompt_logprobs: the prompt is scored, nothing is generated
    max_tokens: int | None = Field(None, ge=0)
    echo: bool = False  # each choice's text starts with its prompt's text (with logprobs: and its logprobs)
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = Field(None, ge=0, le=20)  # legacy: how many top logprobs per token
    prompt_logprobs: int | None = Field(None, ge=0, le=20)  # vLLM's: each prompt token's logprob and the top n

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_of_four_forms(cls, value: Any) -> Any:
        """One error for a prompt of the wrong shape, not one per member of the union."""

        def ids(item: Any) -> bool:
            return isinstance(item, list) and all(type(token_id) is int for token_id in item)

        if (
            isinstance(value, str)
            or ids(value)
            or (
                isinstance(value, list)
                and (all(isinstance(item, str) for item in value) or all(ids(item) for item in value))
            )
        ):
            return value
        raise ValueError("must be a string, a list of strings, a list of token ids, or a list of lists of token ids")

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, value: Any, info: ValidationInfo) -> Any:
        """Text or token ids, one prompt or a batch, in any of OpenAI's four forms."""
        if value == []:
            raise ValueError("the prompt is empty")
        prompts = _prompt_list(value)
        if any(isinstance(p, list) and not (p and all(token_id >= 0 for token_id in p)) for p in prompts):
            raise ValueError("token ids must be a non-empty list of non-negative integers")
        limits = _limits(info)
        if limits is not None and len(prompts) > limits.max_prompts:
            raise ValueError(f"{len(prompts)} prompts exceed the limit of {limits.max_prompts} per request")
        return value

    def prompts(self) -> list[str | list[int]]:
        """Each prompt: text, or token ids to use as they are (no BOS added, as vLLM does)."""
        return _prompt_list(self.prompt)

    def prompt_value(self) -> str | list[int]:
        """The one prompt of a request that has one (what a job's body always has)."""
        (prompt,) = self.prompts()
        return prompt

    def one_per_prompt(self) -> list[CompletionRequest]:
        """This request for each of its prompts alone: the jobs of a batch."""
        return [self.model_copy(update={"prompt": prompt}) for prompt in self.prompts()]

    @model_validator(mode="after")
    def _scores_the_prompt_without_tokens(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo and self.prompt_logprobs is None:
            raise UnsupportedField("max_tokens", "0 needs echo or prompt_logprobs (otherwise nothing is returned)")
        return self

    def num_prompt_logprobs(self) -> int | None:
        """Top logprobs per prompt token the worker computes (None: no prompt logprobs): echo with
        logprobs asks for the legacy list, prompt_logprobs for vLLM's; both at once get the wider."""
        wanted = [n for n in (self.logprobs if self.echo else None, self.prompt_logprobs) if n is not None]
        return max(wanted, default=None)

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value is not None:
            raise UnsupportedField("suffix", "is not supported")
        return value

    @field_validator("best_of")
    @classmethod
    def _best_of_one(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise UnsupportedField("best_of", f"{value} is not supported; only 1")
        return value


GenerationRequest = ChatCompletionRequest | CompletionRequest


def _prompt_list(prompt: Any) -> list[Any]:
    """ "text" -> ["text"]; [1, 2] -> [[1, 2]]; a list of texts or of id lists stays as it is."""
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return [prompt]
    return list(prompt)


def to_sampling_params(req: GenerationRequest, default_max_tokens: int = 256) -> SamplingParams:
    """The sampler's view of a request; OpenAI defaults where the request is silent."""
    top_k = req.top_k or 0
    requested = req.requested_max_tokens()
    max_tokens = default_max_tokens if requested is None else requested
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=DEFAULT_TEMPERATURE if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=max(top_k, 0),
        min_p=req.min_p or 0.0,
        seed=req.seed,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        stop=_as_list(req.stop),
        stop_token_ids=list(req.stop_token_ids or []),
        ignore_eos=req.ignore_eos,
        logit_bias={int(token_id): bias for token_id, bias in (req.logit_bias or {}).items()},
        # Checked against an explicit max_tokens above; a defaulted one just caps it.
        min_tokens=min(req.min_tokens or 0, max_tokens),
        structured=req.structured_output(),
    )


def _unsupported(error: StructuredOutputError) -> UnsupportedField:
    return UnsupportedField(error.field, str(error).removeprefix(f"{error.field}: "))


def _as_list(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def one_service_tier(value: str | None) -> str | None:
    """`service_tier` as OpenAI's APIs take it: one tier is served, so only its names pass."""
    if value not in (None, "auto", "default"):
        raise UnsupportedField("service_tier", f"{value!r} is not supported; only 'auto' and 'default'")
    return value
