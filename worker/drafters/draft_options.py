"""What a user may say about a drafter (--draft, --num-draft, the tree budget): the options every
drafter's loader takes. Its own module, so the loaders need not import the registry that calls them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(slots=True, frozen=True)
class DraftOptions:
    draft: Path | None = None  # a drafter checkpoint; None = look in the target checkpoint / bundled drafters
    num_draft: int | None = None  # chain length; None = the mode's default (mtp/ngram 3, dflash block_size - 1)
    tree_budget: int = 8  # nodes in a best-first tree (tree) or a suffix draft (suffix, unless num_draft is set)
    tree_top_k: int = 4  # candidates per depth the tree policy may branch into
