"""ChatTemplate must render byte for byte what transformers' apply_chat_template(tokenize=False) renders."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import tokenizers
from tokenizers.models import WordLevel
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from tests.support.smollm2_tokenizer import converted_tokenizer_dir
from worker.chat.template import ChatTemplate, ChatTemplateError, flatten_text_parts

TEMPLATES = Path(__file__).parent / "templates"

QWEN_TOKENS = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
LLAMA_TOKENS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
HERMES_TOKENS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city, e.g. <b>Zürich</b> & 東京",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["c", "f"], "description": "Unit"},
                "days": {"type": "integer", "description": "Days ahead"},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "Query"}}},
    },
}
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]


def _call(name: str, arguments: dict | str, call_id: str = "call_1") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _hf_tokenizer(source: str, special_tokens: dict[str, str]) -> PreTrainedTokenizerBase:
    """A real transformers tokenizer that carries `source` and `special_tokens`: the oracle."""
    vocab = {"[UNK]": 0} | {token: i + 1 for i, token in enumerate(special_tokens.values())}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer(WordLevel(vocab, unk_token="[UNK]")), **special_tokens
    )
    tokenizer.chat_template = source
    return tokenizer


def _assert_same(tokenizer: PreTrainedTokenizerBase, messages: list[dict], **kwargs) -> str:
    expected = tokenizer.apply_chat_template(copy.deepcopy(messages), tokenize=False, **kwargs)
    template = ChatTemplate(tokenizer.chat_template, tokenizer.special_tokens_map)
    before = copy.deepcopy(messages)
    got = template.render(messages, add_generation_prompt=kwargs.pop("add_generation_prompt", False), **kwargs)
    assert got == expected
    assert messages == before  # rendering never edits the caller's messages
    return got


def _template_source(name: str) -> str:
    return (TEMPLATES / name).read_text()


# --- (a) the default model's template, read from its GGUF ----------------------------------------


@pytest.fixture(scope="module")
def smollm2_tokenizer(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(converted_tokenizer_dir(request, tmp_path_factory))


CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3+3? Answer in 日本語 🙂"},
]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_default_model_template_matches_transformers(smollm2_tokenizer, add_generation_prompt: bool) -> None:
    rendered = _assert_same(smollm2_tokenizer, CONVERSATION, add_generation_prompt=add_generation_prompt)
    assert rendered.startswith("<|im_start|>system\nYou are terse.<|im_end|>\n")
    assert rendered.endswith("<|im_start|>assistant\n") == add_generation_prompt


def test_default_model_template_inserts_its_own_system_prompt(smollm2_tokenizer) -> None:
    rendered = _assert_same(smollm2_tokenizer, CONVERSATION[1:], add_generation_prompt=True)
    assert "named SmolLM" in rendered


def test_render_defaults_to_adding_the_generation_prompt(smollm2_tokenizer) -> None:
    template = ChatTemplate(smollm2_tokenizer.chat_template, smollm2_tokenizer.special_tokens_map)
    assert template.render(CONVERSATION).endswith("<|im_start|>assistant\n")


# --- (b) Qwen3: thinking switch, tools, tool calls and tool responses -----------------------------

QWEN3_TOOL_CHAT = [
    {"role": "system", "content": "You are a weather bot."},
    {"role": "user", "content": "Weather in Paris and Tokyo?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Two cities, two calls.",
        "tool_calls": [_call("get_weather", {"city": "Paris", "days": 2}), _call("get_weather", '{"city": "Tokyo"}')],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    {"role": "tool", "tool_call_id": "call_2", "content": '{"temp": 18}'},
    {"role": "assistant", "content": "<think>\nCompare them.\n</think>\n\nParis 21°C, Tokyo 18°C."},
    {"role": "user", "content": "Thanks!"},
]


@pytest.mark.parametrize("enable_thinking", [True, False, None])
@pytest.mark.parametrize("tools", [TOOLS, None])
def test_qwen3_template_matches_transformers(enable_thinking: bool | None, tools: list | None) -> None:
    tokenizer = _hf_tokenizer(_template_source("qwen3.jinja"), QWEN_TOKENS)
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    rendered = _assert_same(tokenizer, QWEN3_TOOL_CHAT, tools=tools, add_generation_prompt=True, **kwargs)
    assert rendered.endswith("<think>\n\n</think>\n\n") == (enable_thinking is False)
    assert ("<b>Zürich</b> & 東京" in rendered) == (tools is not None)  # tojson: no HTML escaping, no \\u


def test_qwen3_template_reasoning_under_older_field_names() -> None:
    # Clients send `reasoning` (vLLM) or `thinking`; transformers aliases both to `reasoning_content`.
    tokenizer = _hf_tokenizer(_template_source("qwen3.jinja"), QWEN_TOKENS)
    for field in ("reasoning", "thinking"):
        chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello", field: "Greet back."}]
        rendered = _assert_same(tokenizer, chat)
        assert "<think>\nGreet back.\n</think>\n\nHello" in rendered


def test_qwen3_template_drops_null_fields_like_transformers() -> None:
    tokenizer = _hf_tokenizer(_template_source("qwen3.jinja"), QWEN_TOKENS)
    chat = [
        {"role": "user", "content": "Hi", "name": None},
        {"role": "assistant", "content": "Hello", "reasoning_content": None, "tool_calls": None},
    ]
    _assert_same(tokenizer, chat, add_generation_prompt=True)


# --- (c) Llama 3.1: tools in the first user message, one call at a time ---------------------------

LLAMA_TOOL_CHAT = [
    {"role": "system", "content": "  Be helpful.  "},
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "tool_calls": [_call("get_weather", {"city": "Oslo", "unit": "c"})]},
    {"role": "tool", "content": {"temp": -3, "sky": "snow"}},
    {"role": "assistant", "content": "It is -3 °C with snow."},
    {"role": "user", "content": "And tomorrow?"},
]


@pytest.mark.parametrize("kwargs", [{}, {"tools_in_user_message": False}, {"date_string": "01 Jan 2025"}])
def test_llama31_template_with_tools_matches_transformers(kwargs: dict) -> None:
    tokenizer = _hf_tokenizer(_template_source("llama3_1.jinja"), LLAMA_TOKENS)
    rendered = _assert_same(tokenizer, LLAMA_TOOL_CHAT, tools=TOOLS, add_generation_prompt=True, **kwargs)
    assert rendered.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>")
    assert '    "name": "get_weather"' in rendered  # tojson(indent=4)


def test_llama31_template_without_tools_matches_transformers() -> None:
    tokenizer = _hf_tokenizer(_template_source("llama3_1.jinja"), LLAMA_TOKENS)
    _assert_same(tokenizer, [LLAMA_TOOL_CHAT[0], LLAMA_TOOL_CHAT[1]], add_generation_prompt=True)


def test_raise_exception_becomes_chat_template_error() -> None:
    source = _template_source("llama3_1.jinja")
    two_calls = [
        {"role": "user", "content": "Weather in Oslo and Rome?"},
        {
            "role": "assistant",
            "tool_calls": [_call("get_weather", {"city": "Oslo"}), _call("get_weather", {"city": "Rome"})],
        },
    ]
    with pytest.raises(Exception, match="single tool-calls"):  # transformers raises jinja2's TemplateError
        _hf_tokenizer(source, LLAMA_TOKENS).apply_chat_template(two_calls, tokenize=False)
    with pytest.raises(ChatTemplateError, match="rejected the messages: This model only supports single tool-calls"):
        ChatTemplate(source, LLAMA_TOKENS).render(two_calls)


# --- (d) Hermes-style tool templates: Qwen2.5 and Hermes 3 ----------------------------------------

HERMES_TOOL_CHAT = [
    {"role": "system", "content": "You call tools."},
    {"role": "user", "content": "Weather in Lima, then search it."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [_call("get_weather", {"city": "Lima"}), _call("search", {"query": "Lima"})],
    },
    {"role": "tool", "content": "22 C"},
    {"role": "tool", "content": "Lima is the capital of Peru."},
    {"role": "assistant", "content": "22 °C in Lima."},
    {"role": "user", "content": "Great."},
]


@pytest.mark.parametrize("name", ["qwen2_5.jinja", "hermes3_tool_use.jinja"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_hermes_style_tool_templates_match_transformers(name: str, add_generation_prompt: bool) -> None:
    tokens = QWEN_TOKENS if name.startswith("qwen") else HERMES_TOKENS
    tokenizer = _hf_tokenizer(_template_source(name), tokens)
    rendered = _assert_same(tokenizer, HERMES_TOOL_CHAT, tools=TOOLS, add_generation_prompt=add_generation_prompt)
    assert '<tool_call>\n{"name": "search", "arguments": {"query": "Lima"}}\n</tool_call>' in rendered


def test_qwen25_template_without_tools_or_system_matches_transformers() -> None:
    tokenizer = _hf_tokenizer(_template_source("qwen2_5.jinja"), QWEN_TOKENS)
    rendered = _assert_same(tokenizer, [{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert "You are Qwen, created by Alibaba Cloud." in rendered


# --- the environment's extras, each checked against transformers ---------------------------------

FEATURES = """\
{%- set ns = namespace(count=0) %}
{%- for message in messages %}
    {%- if loop.index > 2 %}{% break %}{% endif %}
    {%- if message.role == 'system' %}{% continue %}{% endif %}
    {%- set ns.count = ns.count + 1 %}
    {% generation %}[{{ message.role }}] {{ message.content }}{% endgeneration %}
{% endfor %}
count={{ ns.count }} {{ dict(a=1, b='<&>') | tojson }} {{ dict(b=2, a=[1, 'é']) | tojson(indent=2, sort_keys=True) }}
{{ tools | tojson(separators=(',', ':')) }} {{ extra | default('none') }} {{ bos_token }}|{{ eos_token }}
{%- if add_generation_prompt %}<go>{% endif %}
"""


@pytest.mark.parametrize("kwargs", [{}, {"extra": "x"}, {"eos_token": "<override>"}])
def test_environment_extras_match_transformers(kwargs: dict) -> None:
    tokenizer = _hf_tokenizer(FEATURES, LLAMA_TOKENS)
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "user", "content": "v"}]
    rendered = _assert_same(tokenizer, chat, tools=[SEARCH_TOOL], add_generation_prompt=True, **kwargs)
    assert "count=1" in rendered and '"b": "<&>"' in rendered


def test_strftime_now_is_available() -> None:
    rendered = ChatTemplate("{{ strftime_now('%Y') }}", {}).render([{"role": "user", "content": "x"}])
    assert rendered.isdigit() and len(rendered) == 4


# --- errors at the boundary -----------------------------------------------------------------------


def test_syntax_error_names_the_line() -> None:
    with pytest.raises(ChatTemplateError, match="syntax error at line 2"):
        ChatTemplate("{% for m in messages %}\n{{ m.content }\n{% endfor %}", {})


def test_template_bug_becomes_chat_template_error(smollm2_tokenizer) -> None:
    # The SmolLM2 template concatenates strings; a list content makes it fail, in transformers too.
    chat = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    with pytest.raises(TypeError):
        smollm2_tokenizer.apply_chat_template(chat, tokenize=False)
    template = ChatTemplate(smollm2_tokenizer.chat_template, smollm2_tokenizer.special_tokens_map)
    with pytest.raises(ChatTemplateError, match="failed to render: TypeError"):
        template.render(chat)


def test_runaway_template_recursion_becomes_chat_template_error() -> None:
    # Hermes 3's type macro recurses forever on a union type; a client's tool schema must not crash the worker.
    nullable = {
        "type": "function",
        "function": {
            "name": "f",
            "description": "d",
            "parameters": {"type": "object", "properties": {"x": {"type": ["string", "null"], "description": "x"}}},
        },
    }
    with pytest.raises(ChatTemplateError, match="RecursionError"):
        ChatTemplate(_template_source("hermes3_tool_use.jinja"), HERMES_TOKENS).render(
            [{"role": "user", "content": "hi"}], tools=[nullable]
        )


def test_namespace_refuses_underscore_names() -> None:
    template = ChatTemplate("{% set ns = namespace(_x=1) %}{{ ns._x }}", {})
    with pytest.raises(ChatTemplateError, match="_x"):
        template.render([{"role": "user", "content": "x"}])


def test_sandbox_blocks_python_internals() -> None:
    template = ChatTemplate("{{ messages.__class__.__mro__ }}", {})
    with pytest.raises(ChatTemplateError):
        template.render([{"role": "user", "content": "x"}])


def test_empty_and_malformed_messages_are_rejected() -> None:
    template = ChatTemplate("{{ messages | length }}", {})
    with pytest.raises(ChatTemplateError, match="at least one message"):
        template.render([])
    with pytest.raises(ChatTemplateError, match=r"messages\[1\]"):
        template.render([{"role": "user", "content": "x"}, "not a dict"])


# --- flatten_text_parts ---------------------------------------------------------------------------


def test_flatten_text_parts_joins_text_parts_with_newlines(smollm2_tokenizer) -> None:
    chat = [
        {"role": "system", "content": "plain"},
        {"role": "user", "content": [{"type": "text", "text": "line one"}, {"type": "text", "text": "line two"}]},
    ]
    before = copy.deepcopy(chat)
    flat = flatten_text_parts(chat)
    assert flat == [chat[0], {"role": "user", "content": "line one\nline two"}]
    assert chat == before
    _assert_same(smollm2_tokenizer, flat, add_generation_prompt=True)


def test_flatten_text_parts_rejects_non_text_parts() -> None:
    chat = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]
    with pytest.raises(ChatTemplateError, match=r"messages\[0\]\.content\[0\]\.type='image_url'"):
        flatten_text_parts(chat)
