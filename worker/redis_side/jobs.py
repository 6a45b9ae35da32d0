"""A stream entry -> a `JobSpec` the owner thread can run: validated body, prompt ids, sampling, output.

Three ways a job fails before it runs, each a named exception carrying its `ErrorEvent` code:
  - `PoisonJob`: the entry or its body is malformed. It can never succeed, on any worker: error
    event (when the entry has an id to send it to) and a dead letter.
  - `JobRejected`: well formed, but this request cannot be served (a template that refuses the
    messages, prompt + max_tokens over the context): error event, acknowledged.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from shared.openai_messages import Message
from shared.openai_schema import ChatCompletionRequest, CompletionRequest, GenerationRequest, to_sampling_params
from shared.protocol import ErrorCode, Job, JobState
from shared.sampling import SamplingParams
from worker.chat.template import ChatTemplateError, flatten_text_parts
from worker.engine.runner import ContextLengthError
from worker.serving.handoff import JobSpec
from worker.serving.lane_output import OutputOptions, ReasoningOptions
from worker.serving_model import ServingModel

THINK_START, THINK_END = "<think>", "</think>"
FORCED_CLOSE = "\n" + THINK_END + "\n\n"  # what a spent reasoning budget appends
_NUM_TAIL_IDS = 8  # prompt ids decoded to see whether the template opened the think tag
# Set by the worker itself; a request's chat_template_kwargs cannot override them.
RESERVED_TEMPLATE_ARGS = frozenset({"messages", "tools", "documents", "add_generation_prompt"})


class PoisonJob(ValueError):
    """A malformed entry or body: dead-lettered at once. `request_id` is None if even that is unreadable."""

    def __init__(self, message: str, request_id: str | None):
        super().__init__(message)
        self.request_id = request_id
        self.code = ErrorCode.INVALID_REQUEST


class JobRejected(ValueError):
    """A valid request this worker cannot serve; `code` is its ErrorEvent code."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


def parse_job(fields: dict[str, str]) -> Job:
    try:
        return Job.from_fields(fields)
    except ValidationError as error:
        raise PoisonJob(f"malformed job entry: {_first_error(error)}", _str_or_none(fields.get("id"))) from error


def parse_request(job: Job) -> GenerationRequest:
    model = CompletionRequest if job.kind == "completion" else ChatCompletionRequest
    try:
        return model.model_validate_json(job.body)
    except (ValidationError, ValueError) as error:
        raise PoisonJob(f"malformed {job.kind} request body: {_first_error(error)}", job.id) from error


def build_spec(
    job: Job, entry_id: str, attempt: int, resume: JobState, served: ServingModel, max_lanes: int
) -> JobSpec:
    request = parse_request(job)
    if request.n > max_lanes:
        raise JobRejected(f"n={request.n} exceeds this worker's {max_lanes} lanes", ErrorCode.INVALID_REQUEST)
    prompt_ids = encode_prompt(request, served)
    runner = served.runner
    room = max(runner.max_context - len(prompt_ids), 1)
    requested = request.requested_max_tokens()
    max_tokens = room if requested is None else requested
    if isinstance(request, ChatCompletionRequest) and request.fit_max_tokens and max_tokens > room:
        max_tokens = room
        request = request.model_copy(update={"max_tokens": room, "max_completion_tokens": None})
    params = to_sampling_params(request, default_max_tokens=max_tokens)
    try:
        if job.kind != "count":  # a prompt is counted whatever its length
            runner.check_fits(len(prompt_ids), params.max_tokens)
    except ContextLengthError as error:
        limit = f" ({served.context_limit})" if served.context_limit else ""
        raise JobRejected(f"{error}{limit}", ErrorCode.CONTEXT_LENGTH_EXCEEDED) from error
    _check_in_vocabulary("logit_bias", params.logit_bias, served)
    output = output_options(request, served, prompt_ids, params)
    if params.structured is not None:
        params = _with_structured_output(params, output, served)
    return JobSpec(
        job.id,
        entry_id,
        attempt,
        job.kind,
        job.created,
        job.deadline,
        prompt_ids,
        params,
        request.n,
        output,
        resume,
        priority=job.priority,
    )


def _with_structured_output(params: SamplingParams, output: OutputOptions, served: ServingModel) -> SamplingParams:
    """A constraint starts where the answer does: after the think block when the prompt opened
    one (a model that may open the tag itself cannot: the grammar does not allow it). A forced
    call is written in this model's tool-call format, JSON with this worker's whitespace. Its
    grammar is compiled here, off the owner thread, so the owner only copies it."""
    structured, masks = params.structured, served.runner.grammar_masks
    assert structured is not None and masks is not None, "load_serving_model sets the masks"
    structured = replace(structured, tool_format=served.tool_parser, whitespace=served.json_whitespace)
    params = replace(params, structured=structured)
    reasoning = output.reasoning
    if reasoning is not None and reasoning.starts_in_reasoning:
        params = replace(params, constraint_after=reasoning.end_tag)
    try:
        masks.compile(structured.check())
    except ValueError as error:  # GrammarUnavailable, or a grammar this tokenizer cannot serve
        raise JobRejected(f"{structured.field}: {error}", ErrorCode.INVALID_REQUEST) from error
    return params


def encode_prompt(request: GenerationRequest, served: ServingModel) -> list[int]:
    if isinstance(request, CompletionRequest):
        if len(request.prompts()) != 1:  # the gateway makes one job per prompt
            raise JobRejected(f"a job holds one prompt, not {len(request.prompts())}", ErrorCode.INVALID_REQUEST)
        prompt = request.prompt_value()
        if isinstance(prompt, str):
            return served.encode_text(prompt)
        _check_in_vocabulary("prompt", prompt, served)
        return list(prompt)
    tools = _tools(request)
    kwargs = {k: v for k, v in (request.chat_template_kwargs or {}).items() if k not in RESERVED_TEMPLATE_ARGS}
    try:
        return served.encode_chat(chat_messages(request.messages), tools, **kwargs)
    except ChatTemplateError as error:
        raise JobRejected(str(error), ErrorCode.INVALID_REQUEST) from error


def output_options(
    request: GenerationRequest, served: ServingModel, prompt_ids: list[int], params: SamplingParams
) -> OutputOptions:
    stops = OutputOptions(
        stop=tuple(params.stop),
        include_stop=request.include_stop_str_in_output,
        min_tokens=params.min_tokens,
    )
    if isinstance(request, CompletionRequest):
        echo = _prompt_text(request, served) if request.echo else ""
        return replace(
            stops, num_logprobs=request.logprobs, echo=echo, num_prompt_logprobs=request.num_prompt_logprobs()
        )
    num_logprobs = (request.top_logprobs or 0) if request.logprobs else None
    tools = _tools(request)
    parse_tool_calls = tools is not None
    return replace(
        stops,
        reasoning=_reasoning(request, served, prompt_ids),
        parse_tool_calls=parse_tool_calls,
        single_tool_call=parse_tool_calls and request.parallel_tool_calls is False,
        tool_parser=served.tool_parser,
        tool_schemas=_tool_schemas(tools or []),
        num_logprobs=num_logprobs,
    )


def _check_in_vocabulary(field: str, token_ids: Iterable[int], served: ServingModel) -> None:
    """Token ids a request names (the gateway cannot know the vocabulary) must be the model's."""
    largest = max(token_ids, default=-1)
    if largest >= served.runner.vocab_size:
        raise JobRejected(
            f"{field}: token id {largest} is outside this model's vocabulary of {served.runner.vocab_size} tokens",
            ErrorCode.INVALID_REQUEST,
        )


def _prompt_text(request: CompletionRequest, served: ServingModel) -> str:
    """The prompt as text: as sent, or its token ids decoded (special tokens kept, as given)."""
    prompt = request.prompt_value()
    return prompt if isinstance(prompt, str) else served.tokenizer.decode(prompt, skip_special_tokens=False)


def _reasoning(request: ChatCompletionRequest, served: ServingModel, prompt_ids: list[int]) -> ReasoningOptions | None:
    budget = request.reasoning_budget_tokens()
    template = served.template.source if served.template is not None else ""
    if THINK_START not in template and budget is None:
        return None
    tokenizer = served.tokenizer
    tail = tokenizer.decode(prompt_ids[-_NUM_TAIL_IDS:], skip_special_tokens=False)
    close_ids = tuple(tokenizer.encode(FORCED_CLOSE, add_special_tokens=False).ids)
    return ReasoningOptions(THINK_START, THINK_END, tail.rstrip().endswith(THINK_START), budget, close_ids)


def chat_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """A request's messages as the chat template reads them."""
    flat = flatten_text_parts([message.model_dump(exclude_none=True) for message in messages])
    # `content: null` (an assistant turn that only calls tools) becomes "", as vLLM hands it to
    # string-content templates, which read `message.content` unguarded.
    return [_parse_tool_call_arguments({"content": "", **message}) for message in flat]


def _parse_tool_call_arguments(message: dict[str, Any]) -> dict[str, Any]:
    # Templates expect a tool call's arguments as a mapping (`arguments | tojson`, `arguments.items()`);
    # OpenAI clients send them as JSON text. As vLLM does, hand templates the parsed object.
    calls = message.get("tool_calls")
    if not calls:
        return message
    parsed = []
    for call in calls:
        function = dict(call["function"])
        function["arguments"] = _json_object_or_text(function.get("arguments", ""))
        parsed.append({**call, "function": function})
    return {**message, "tool_calls": parsed}


def _json_object_or_text(text: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


def _tool_schemas(tools: list[dict[str, Any]]) -> dict[str, Any]:
    functions = [tool.get("function") or {} for tool in tools]
    return {function["name"]: function.get("parameters") or {} for function in functions if "name" in function}


def _tools(request: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    if not request.tools or request.tool_choice == "none":
        return None
    return [tool.model_dump(exclude_none=True) for tool in request.tools]


def _first_error(error: ValidationError | ValueError) -> str:
    if isinstance(error, ValidationError) and error.errors():
        first = error.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or "body"
        return f"{where}: {first.get('msg', '')}"
    return str(error)


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
