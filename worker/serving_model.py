"""A model ready to serve: decoder, tokenizer, chat template and the worker's speculation mode."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import tokenizers
import torch

from shared.json_numbers import JsonNumbers
from shared.structured_output import JsonWhitespace
from worker.chat.template import ChatTemplate, ChatTemplateError
from worker.chat.tool_parser import TOOL_PARSERS, choose_tool_parser
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.grammar_constraint import GrammarMasks
from worker.engine.runner import ModelRunner
from worker.models.decoder import DECODE_BUCKETS, Decoder
from worker.models.loader import LoadedModel, load_model

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class ServingModel:
    name: str
    speculation: str
    loaded: LoadedModel
    runner: ModelRunner
    template: ChatTemplate | None
    tool_parser: str = "hermes"  # the tool-call format its answers are read in (worker/chat/tool_parser.py)
    json_whitespace: JsonWhitespace = "compact"  # JSON in forced calls and schemas (shared/structured_output.py)
    json_numbers: JsonNumbers = "bounded"  # the same JSON's numbers (shared/json_numbers.py)
    context_limit: str = ""  # why runner.max_context is below the model's own (the capacity gate); "" if not

    @property
    def tokenizer(self) -> tokenizers.Tokenizer:
        return self.loaded.tokenizer

    def encode_text(self, text: str) -> list[int]:
        """A raw prompt (completions API): BOS first where the model wants it."""
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        bos = self.loaded.checkpoint.bos_token_id
        if self.loaded.checkpoint.add_bos_token and bos is not None:
            ids = [bos] + ids
        return ids

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None, **template_kwargs) -> list[int]:
        if self.template is None:
            raise ChatTemplateError(f"model {self.name} has no chat template; use a raw prompt")
        text = self.template.render(messages, tools=tools, add_generation_prompt=True, **template_kwargs)
        # The template writes BOS itself where the model wants one; encoding must not add another.
        return self.tokenizer.encode(text, add_special_tokens=False).ids


def load_serving_model(
    model: str | Path | None = None,
    speculation: str = "none",
    options: DraftOptions | None = None,
    dtype: str = "float32",
    max_context: int | None = None,
    num_threads: int | None = None,
    cache_dir: Path | None = None,
    quantize: str = "auto",
    kernels: str = "auto",
    kernel_isa: str = "auto",
    tool_parser: str | None = None,
    json_whitespace: JsonWhitespace = "compact",
    json_numbers: JsonNumbers = "bounded",
) -> ServingModel:
    """`dtype`, `quantize`, `kernels` and `kernel_isa` as worker.models.loader.load_model takes them
    ("float32": the exact path); `tool_parser` None: the one the chat template asks for (logged)."""
    if num_threads:
        torch.set_num_threads(num_threads)
    started = time.monotonic()
    logger.info("loading model %s (dtype %s, quantize %s, kernels %s)", model or "(default)", dtype, quantize, kernels)
    loaded = load_model(
        model, dtype=dtype, cache_dir=cache_dir, quantize=quantize, kernels=kernels, kernel_isa=kernel_isa
    )
    options = options or DraftOptions()
    drafter = load_drafter(speculation, loaded, options)
    logger.info("model %s and drafter %s loaded in %.1f s", loaded.name, speculation, time.monotonic() - started)
    decoder = loaded.decoder
    if isinstance(decoder, Decoder) and decoder.device.type == "cuda":
        decoder.decode_buckets = DECODE_BUCKETS  # on a CPU padding rows only cost
    max_nodes = max(options.tree_budget, options.num_draft or 0, 16)
    runner = ModelRunner(loaded.decoder, loaded.checkpoint.eos_token_ids, drafter, max_context, max_nodes)
    runner.grammar_masks = GrammarMasks.for_model(loaded)  # its tokenizer is read on first use
    source = loaded.checkpoint.chat_template
    template = ChatTemplate(source, loaded.checkpoint.special_tokens) if source else None
    parser = _tool_parser(tool_parser, source)
    return ServingModel(loaded.name, speculation, loaded, runner, template, parser, json_whitespace, json_numbers)


def _tool_parser(chosen: str | None, template_source: str | None) -> str:
    if chosen is not None:
        if chosen not in TOOL_PARSERS:
            raise ValueError(f"tool_parser: {chosen!r} is not one of {', '.join(TOOL_PARSERS)}")
        name, why = chosen, "set by ARBOR_TOOL_PARSER / --tool-parser"
    else:
        name, why = choose_tool_parser(template_source)
    logger.info("tool-call format: %s (%s)", name, why)
    return name


def verify_rows(drafter: object | None) -> int:
    """Rows of a full verification forward in this mode: the root plus the most nodes a draft has."""
    if drafter is None:
        return 1
    budget = getattr(drafter, "tree_budget", None) or getattr(drafter, "num_draft", 0)
    return 1 + int(budget or 0)
