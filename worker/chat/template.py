"""Hugging Face chat templates, rendered exactly as `transformers`' `apply_chat_template(tokenize=False)`.

A model's prompt format is part of its training: one stray newline changes the tokens the model sees.
So the jinja environment below mirrors the one `transformers` builds (transformers/utils/
chat_template_utils.py): an immutable sandbox with `trim_blocks` and `lstrip_blocks`, the
`loopcontrols` extension, a pass-through `{% generation %}` tag, a `tojson` filter that does not
HTML-escape, the `raise_exception` and `strftime_now` globals, and the same preparation of the
inputs (keys whose value is None dropped, reasoning aliased under the names templates read, only
plain JSON data visible to the template). The special tokens (`bos_token`, `eos_token`, ...) are
template variables; keyword arguments such as `enable_thinking` override them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import jinja2
import jinja2.exceptions
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from shared.openai_messages import TEXT_PART_SEPARATOR

# The first name is the one chat templates read; the others are older spellings clients still send.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ValueError):
    """A chat template that cannot be compiled, or that refuses (or fails on) the given messages."""


class ChatTemplate:
    """One model's chat template, compiled once, rendered per request."""

    def __init__(self, source: str, special_tokens: Mapping[str, str]) -> None:
        self.source = source
        self.special_tokens = dict(special_tokens)  # bos_token, eos_token, ... as template variables
        self._template = _compile(source)

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        if not messages:
            raise ChatTemplateError("messages=[] must hold at least one message")
        chat = _prepare_messages(messages)
        variables = _plain_data({**self.special_tokens, **template_kwargs})  # kwargs win, as in transformers
        try:
            return self._template.render(
                messages=chat,
                tools=_plain_data(tools),
                documents=_plain_data(documents),
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except _TemplateRaised as exc:
            raise ChatTemplateError(f"chat template rejected the messages: {exc.message}") from exc
        except (jinja2.TemplateError, TypeError, ValueError, LookupError, AttributeError, RecursionError) as exc:
            # A template written for string contents meets a list, a role it does not know, a tool
            # schema its macros recurse on forever (Hermes on `"type": ["string", "null"]`), ...
            raise ChatTemplateError(f"chat template failed to render: {type(exc).__name__}: {exc}") from exc


def flatten_text_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Join OpenAI text parts (`[{"type": "text", "text": ...}, ...]`) into one string per message.

    `transformers` hands list contents to the template untouched, and most templates then fail on
    them; callers that serve text-only models flatten first. Parts are joined with a newline, as
    vLLM does for text-only models. Returns new messages; the input is not modified.
    """
    return [_flatten_message(message, index) for index, message in enumerate(messages)]


def _flatten_message(message: dict[str, Any], index: int) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, list):
        return dict(message)
    texts = []
    for part_index, part in enumerate(content):
        where = f"messages[{index}].content[{part_index}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind != "text":
            raise ChatTemplateError(f"{where}.type={kind!r} is not supported; only 'text' parts are")
        if not isinstance(part.get("text"), str):
            raise ChatTemplateError(f"{where}.text={part.get('text')!r} must be a string")
        texts.append(part["text"])
    return {**message, "content": TEXT_PART_SEPARATOR.join(texts)}


class _TemplateRaised(jinja2.TemplateError):
    """What `raise_exception(...)` throws, told apart from template bugs for a clearer message."""


def _compile(source: str) -> jinja2.Template:
    try:
        return _environment().from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template syntax error at line {exc.lineno}: {exc.message}") from exc


def _environment() -> ImmutableSandboxedEnvironment:
    # Chat templates come from model repositories: untrusted code, hence the immutable sandbox.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant spans for training masks; here it is
    a no-op wrapper, but templates that use it must still parse."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        # A call block, as in transformers, so `{% set %}` inside the tag is scoped the same way.
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        body: str = caller()  # the tag's rendered body
        return body


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own `tojson` HTML-escapes `<`, `>`, `&` and `'`, which a prompt must not contain.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict(...)` for templates, without the class object (and its attributes) behind it."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """`namespace(...)` that refuses underscore names, so templates cannot reach CPython internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Namespace's own signature trick
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} must not start with '_'")


def _prepare_messages(messages: list[Any]) -> list[dict[str, Any]]:
    chat = []
    for index, message in enumerate(_plain_data(list(messages))):
        if not isinstance(message, dict):
            raise ChatTemplateError(f"messages[{index}]={message!r} must be a dict")
        # Clients send `content: null` or `tool_calls: null`; templates handle a missing key far better.
        chat.append(_alias_reasoning({key: value for key, value in message.items() if value is not None}))
    return chat


def _alias_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    # Templates read `reasoning_content` (Qwen) or `thinking` (gpt-oss); fill both from whichever came.
    reasoning = next((message[key] for key in _REASONING_FIELDS if message.get(key) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def _plain_data(value: Any) -> Any:
    """Rebuild `value` from plain JSON types, so the sandboxed template sees no foreign methods."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)  # enums and other subclasses carry methods of their own
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain_data(key): _plain_data(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain_data(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain_data(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: _plain_data(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _plain_data(value.model_dump())  # pydantic models, e.g. the gateway's message schemas
    return f"<{type(value).__name__}>"  # anything else: an inert placeholder naming its type
