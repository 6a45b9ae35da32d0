"""Speculation modes by name, and how each finds and loads its drafter."""

from __future__ import annotations

from collections.abc import Callable
from typing import get_args

from shared.settings import Speculation
from worker.drafters.draft_options import DraftOptions
from worker.drafters.ngram import PromptLookupDrafter
from worker.engine.drafter_protocol import Drafter, DrafterError
from worker.models.loaded_model import LoadedModel

SPECULATION_MODES = get_args(Speculation)  # one list, shared with the settings and the CLI


def _ngram(model: LoadedModel, options: DraftOptions) -> Drafter:
    return PromptLookupDrafter(num_draft=options.num_draft or 3)


def _suffix(model: LoadedModel, options: DraftOptions) -> Drafter:
    from worker.drafters.suffix import SuffixDrafter, SuffixOptions

    return SuffixDrafter(SuffixOptions(max_nodes=options.num_draft or options.tree_budget))


def _auto(model: LoadedModel, options: DraftOptions) -> Drafter:
    """Each lane's draft from the source that promises most (worker.drafters.picker): the
    model's MTP head where it has one (in its checkpoint, bundled, or --draft), and suffix decoding."""
    import logging

    from worker.drafters.picker import SourcePicker
    from worker.drafters.suffix import SuffixDrafter, SuffixOptions

    head: Drafter | None
    try:
        head = _mtp(model, options)
    except DrafterError:
        if options.draft is not None:
            raise  # the head the user pointed at does not load: say so, do not serve without it
        head = None
        logging.getLogger(__name__).info(
            "speculation auto: model %s has no MTP head; drafts from suffix decoding", model.name
        )
    return SourcePicker(head, SuffixDrafter(SuffixOptions(max_nodes=options.tree_budget)))


def _mtp(model: LoadedModel, options: DraftOptions) -> Drafter:
    from worker.drafters.mtp import load_mtp_drafter

    return load_mtp_drafter(model, options)


def _mtp_tree(model: LoadedModel, options: DraftOptions) -> Drafter:
    """The MTP head drafting best-first trees of --tree-budget nodes (worker.drafters.mtp_tree)."""
    from worker.drafters.mtp import load_mtp_drafter

    return load_mtp_drafter(model, options, tree=True)


def _dflash(model: LoadedModel, options: DraftOptions) -> Drafter:
    from worker.drafters.dflash import load_dflash_drafter

    return load_dflash_drafter(model, options, tree=False)


def _tree(model: LoadedModel, options: DraftOptions) -> Drafter:
    from worker.drafters.dflash import load_dflash_drafter

    return load_dflash_drafter(model, options, tree=True)


DRAFTERS: dict[str, Callable[[LoadedModel, DraftOptions], Drafter]] = {
    "auto": _auto,
    "mtp": _mtp,
    "mtp-tree": _mtp_tree,
    "dflash": _dflash,
    "tree": _tree,
    "ngram": _ngram,
    "suffix": _suffix,
}


def load_drafter(mode: str, model: LoadedModel, options: DraftOptions) -> Drafter | None:
    if mode == "none":
        return None
    if mode not in DRAFTERS:
        raise DrafterError(f"unknown speculation mode {mode!r}; choose one of {', '.join(SPECULATION_MODES)}")
    return DRAFTERS[mode](model, options)
