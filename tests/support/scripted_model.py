"""A tiny Llama checkpoint whose greedy output is a script: deterministic tool calls through the real decoder.

The weights make a bigram model: the next token depends only on the current one. Every layer's
output projections (`o_proj`, `down_proj`) are zero, so the residual stream is the embedding;
each scripted token's embedding is its own one-hot direction (every other token shares slot 0),
the final RMSNorm keeps it one-hot, and `lm_head` maps direction k to the scripted successor of
token k with a logit of SCALE * sqrt(hidden_size), far above every other logit (all 0). Token
`a` -> successor `b` for every consecutive pair of the script; anything unscripted -> eos.

The chat template decides where the script starts: instead of the usual generation prompt it
ends the prompt with a marker token, `<|plain|>` without tools, else `<|stepN|>` where N is the
number of assistant messages so far (each assistant turn, tool call or answer, moves the script
on one step; capped at the last step). An agent conversation therefore runs:

    user                   -> step 0: "Sure." + get_weather(Paris)
    + assistant, tool      -> step 1: get_time(Paris)
    + assistant, tool      -> step 2: "It is sunny in Paris at noon."
    + assistant, user      -> step 3: "Checking Tokyo." + get_weather(Tokyo) and get_time(Tokyo)
    + assistant, tool x2   -> step 4: "It is raining in Tokyo at 20:00."

Being a bigram model, a token may appear twice in the script only with the same successor;
that is why the calls' JSON differs in spacing (`build_bigram_table` checks it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tests.support.tiny_models import train_tokenizer

EOS = "<|im_end|>"
SCALE = 30.0
HIDDEN_SIZE = 64

_HEAD = '<tool_call>{{"name": "{}", "arguments": '
_HEAD_COMPACT = '<tool_call>{{"name":"{}","arguments":'
_PARIS, _TOKYO, _TOKYO_COMPACT = '{"city": "Paris"}', '{"city": "Tokyo"}', '{"city":"Tokyo"}'
_END, _END_NEWLINE = "}</tool_call>", "}</tool_call>\n"


@dataclass(frozen=True, slots=True)
class ScriptedCall:
    name: str
    arguments: dict


@dataclass(frozen=True, slots=True)
class ScriptedTurn:
    marker: str  # the special token the chat template ends the prompt with
    pieces: tuple[str, ...]  # one token each, emitted in order, then eos
    content: str  # the text outside tool calls, as the API reports it
    calls: tuple[ScriptedCall, ...] = ()

    @property
    def text(self) -> str:
        return "".join(self.pieces)


PLAIN = ScriptedTurn("<|plain|>", ("Hello!", " I am a scripted model."), "Hello! I am a scripted model.")
STEPS: tuple[ScriptedTurn, ...] = (
    ScriptedTurn(
        "<|step0|>",
        ("Sure.", _HEAD.format("get_weather"), _PARIS, _END),
        "Sure.",
        (ScriptedCall("get_weather", {"city": "Paris"}),),
    ),
    ScriptedTurn(
        "<|step1|>", (_HEAD.format("get_time"), _PARIS, _END), "", (ScriptedCall("get_time", {"city": "Paris"}),)
    ),
    ScriptedTurn("<|step2|>", ("It is sunny", " in Paris", " at noon."), "It is sunny in Paris at noon."),
    ScriptedTurn(
        "<|step3|>",
        (
            "Checking Tokyo.",
            _HEAD_COMPACT.format("get_weather"),
            _TOKYO,
            _END_NEWLINE,
            _HEAD_COMPACT.format("get_time"),
            _TOKYO_COMPACT,
            _END,
        ),
        "Checking Tokyo.\n",
        (ScriptedCall("get_weather", {"city": "Tokyo"}), ScriptedCall("get_time", {"city": "Tokyo"})),
    ),
    ScriptedTurn("<|step4|>", ("It is raining", " in Tokyo", " at 20:00."), "It is raining in Tokyo at 20:00."),
)
TURNS = (PLAIN, *STEPS)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
    for name, description in (("get_weather", "Current weather in a city"), ("get_time", "Local time in a city"))
]

# ChatML with tools in the system part; assistant tool calls rendered Hermes-style; the generation
# prompt ends with the marker that starts the scripted turn.
CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\\n# Tools\\n' }}"
    "{% for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{% endfor %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% set ns = namespace(step=0) %}"
    "{% for message in messages %}"
    "{% if message.role == 'assistant' %}{% set ns.step = ns.step + 1 %}{% endif %}"
    "{{ '<|im_start|>' + message.role + '\\n' }}{{ message.content if message.content is string else '' }}"
    "{% for call in message.tool_calls or [] %}"
    "{{ '<tool_call>' }}{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}"
    "{{ '</tool_call>' }}{% endfor %}{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if not tools %}{{ '<|plain|>' }}"
    "{% else %}{{ '<|step%d|>' % ([ns.step, " + str(len(STEPS) - 1) + "] | min) }}{% endif %}"
    "{% endif %}"
)


def build_bigram_table(turns: tuple[ScriptedTurn, ...] = TURNS) -> dict[str, str]:
    """token text -> the token text that must follow it; fails on a token with two successors."""
    table: dict[str, str] = {}
    for turn in turns:
        sequence = [turn.marker, *turn.pieces, EOS]
        for token, successor in zip(sequence, sequence[1:]):
            assert table.setdefault(token, successor) == successor, (
                f"scripted token {token!r} is followed by both {table[token]!r} and {successor!r}"
            )
    return table


def make_scripted_model(folder: Path, max_position_embeddings: int = 4096) -> Path:
    """Write config.json, model.safetensors, tokenizer.json, tokenizer_config.json; return the folder.
    A bigram model reads no position: any context length serves the same script."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    table = build_bigram_table()
    tokenizer = train_tokenizer()
    tokenizer.add_special_tokens([turn.marker for turn in TURNS])
    tokenizer.add_tokens(sorted({piece for turn in TURNS for piece in turn.pieces}))
    tokenizer.save(str(folder / "tokenizer.json"))
    vocab_size, eos_id = tokenizer.get_vocab_size(), tokenizer.token_to_id(EOS)
    config = dict(
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        vocab_size=vocab_size,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        hidden_act="silu",
        bos_token_id=None,
        eos_token_id=eos_id,
        torch_dtype="float32",
    )
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file(_bigram_weights(tokenizer, table, vocab_size, eos_id), str(folder / "model.safetensors"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": CHAT_TEMPLATE,
                "eos_token": EOS,
                "bos_token": None,
                "add_bos_token": False,
            }
        )
    )
    return folder


def _bigram_weights(tokenizer, table: dict[str, str], vocab_size: int, eos_id: int) -> dict:
    import torch

    assert len(table) < HIDDEN_SIZE, f"{len(table)} scripted tokens need more than hidden_size={HIDDEN_SIZE}"
    head_dim, num_kv_heads, intermediate = HIDDEN_SIZE // 4, 2, 32
    embed = torch.zeros(vocab_size, HIDDEN_SIZE)  # [vocab, hidden]
    embed[:, 0] = 1.0  # slot 0: every unscripted token
    lm_head = torch.zeros(vocab_size, HIDDEN_SIZE)  # [vocab, hidden]
    lm_head[eos_id, 0] = SCALE
    for slot, (token, successor) in enumerate(sorted(table.items()), start=1):
        token_id, successor_id = tokenizer.token_to_id(token), tokenizer.token_to_id(successor)
        assert token_id is not None and successor_id is not None, (token, successor)
        embed[token_id] = 0.0
        embed[token_id, slot] = 1.0
        lm_head[successor_id, slot] = SCALE
    layer = "model.layers.0."
    zeros = torch.zeros
    return {
        "model.embed_tokens.weight": embed,
        f"{layer}input_layernorm.weight": torch.ones(HIDDEN_SIZE),
        f"{layer}post_attention_layernorm.weight": torch.ones(HIDDEN_SIZE),
        f"{layer}self_attn.q_proj.weight": zeros(HIDDEN_SIZE, HIDDEN_SIZE),
        f"{layer}self_attn.k_proj.weight": zeros(num_kv_heads * head_dim, HIDDEN_SIZE),
        f"{layer}self_attn.v_proj.weight": zeros(num_kv_heads * head_dim, HIDDEN_SIZE),
        f"{layer}self_attn.o_proj.weight": zeros(HIDDEN_SIZE, HIDDEN_SIZE),  # attention adds nothing
        f"{layer}mlp.gate_proj.weight": zeros(intermediate, HIDDEN_SIZE),
        f"{layer}mlp.up_proj.weight": zeros(intermediate, HIDDEN_SIZE),
        f"{layer}mlp.down_proj.weight": zeros(HIDDEN_SIZE, intermediate),  # nor does the MLP
        "model.norm.weight": torch.ones(HIDDEN_SIZE),
        "lm_head.weight": lm_head,
    }
