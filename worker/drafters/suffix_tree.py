"""A depth-bounded suffix tree with occurrence counts, over several token sequences. Torch-free.

The tree answers, for any substring of up to `max_depth` tokens of its sequences: how often did
it occur (`count`), how often was it followed by a token (`continued`), and by which tokens how
often (its children's counts): the frequencies suffix decoding drafts from
(worker/drafters/suffix_proposal.py).

A substring that occurred once needs no nodes below it: its one occurrence says what follows.
So a node of count 1 is a *leaf* that points at its occurrence (a sequence and the position of
its last token), and the tokens after it are read from the sequence (`Position`s below a leaf
carry an offset, `extra`). Unique text costs about one node a token; only repeated substrings
(where drafts come from) grow a branch, and a leaf is turned into an inner node (`_split`) when
its substring occurs a second time.

Appending a token (`extend`) extends every repeated suffix of the sequence's tail by it: each
sequence keeps those inner nodes (`active`, the root included), so a token costs O(its longest
repeated suffix), O(1) on new text. A sequence with a window (`max_history`) drops its oldest
position as it grows past it; `remove` drops a whole sequence; with `max_nodes`, the oldest
sequences are dropped until the tree fits. Dropping position p walks the substrings that start
there and takes one off each count, to the leaf that was p's alone.

Worked example, max_depth 3, one sequence "a b a b" (positions 0-3):

    a:2 --> b:2 --> leaf a (the occurrence ending at 2; "a b a" after it would be read on)
    b:2 --> leaf a (ending at 2)
    root continued 4; continued(a) = 2; continued(a b) = 1: "a b" was followed by a once
    active after the last b: root, b, a b   (every inner node that is a suffix of the tail)
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

NODE_BYTES = 176  # a node (an inner one with its children dict), measured on CPython 3.12: the memory bound's unit


@dataclass(slots=True)
class _Sequence:
    tokens: list[int] = field(default_factory=list)  # tokens[first:] are in the tree
    first: int = 0  # tokens before it were dropped (cut off the list in bulk, amortized)
    offset: int = 0  # the position of tokens[0] (positions never change: leaves point at them)
    active: list[Node] = field(default_factory=list)  # inner nodes that are suffixes of the tail, shortest first

    @property
    def end(self) -> int:
        """The position after the last token."""
        return self.offset + len(self.tokens)

    def token_at(self, position: int) -> int:
        return self.tokens[position - self.offset]


_LEAF_CHILDREN: dict[int, Node] = {}  # shared by every leaf, never written: a leaf gets its own dict when split


class Node:
    __slots__ = ("children", "count", "continued", "depth", "sequence", "end")

    def __init__(self, depth: int, sequence: _Sequence | None = None, end: int = 0):
        self.children: dict[int, Node] = {} if sequence is None else _LEAF_CHILDREN
        self.count = 0 if sequence is None else 1  # occurrences of this node's substring
        self.continued = 0  # occurrences followed by a token (inner nodes: the children's counts)
        self.depth = depth  # the substring's length
        self.sequence = sequence  # a leaf's one occurrence: its sequence and last token's position
        self.end = end

    @property
    def is_leaf(self) -> bool:
        return self.sequence is not None


Position = tuple[Node, int]  # a node, or `extra` tokens further along a leaf's occurrence


class SuffixTree:
    def __init__(self, max_depth: int = 24, max_history: int | None = None, max_nodes: int | None = None):
        if max_depth < 2:
            raise ValueError(f"max_depth={max_depth} must be >= 2")
        if max_history is not None and max_history <= max_depth:
            raise ValueError(f"max_history={max_history} must exceed max_depth={max_depth}")
        self.max_depth = max_depth
        self.max_history = max_history  # per sequence: older positions are dropped as it grows
        self.max_nodes = max_nodes  # over all sequences: the oldest sequences are dropped past it
        self.root = Node(0)
        self.num_nodes = 0  # not counting the root
        self.version = 0  # bumped when a sequence is added whole or removed: matches may change
        self._sequences: dict[Hashable, _Sequence] = {}  # insertion order = age, oldest first

    @property
    def num_sequences(self) -> int:
        return len(self._sequences)

    @property
    def num_bytes(self) -> int:
        tokens = sum(len(sequence.tokens) for sequence in self._sequences.values())
        return self.num_nodes * NODE_BYTES + 8 * tokens

    def __contains__(self, key: Hashable) -> bool:
        return key in self._sequences

    def active(self, key: Hashable) -> list[Node]:
        """The inner nodes that are suffixes of sequence `key`'s tail, shortest (the root) first."""
        return self._sequences[key].active

    def add(self, key: Hashable, tokens: Iterable[int]) -> None:
        """A whole sequence (replacing one under the same key), newest; then fit under max_nodes."""
        self.remove(key)
        self.extend(key, tokens)
        self.version += 1
        self._fit(keep=key)

    def extend(self, key: Hashable, tokens: Iterable[int]) -> None:
        """Append tokens to sequence `key` (a new one if absent)."""
        sequence = self._sequences.get(key)
        if sequence is None:
            sequence = self._sequences[key] = _Sequence(active=[self.root])
        for token in tokens:
            self._append(sequence, token)
            if self.max_history is not None and len(sequence.tokens) - sequence.first > self.max_history:
                self._drop_first(sequence)

    def remove(self, key: Hashable) -> None:
        sequence = self._sequences.pop(key, None)
        if sequence is None:
            return
        for index in range(sequence.first, len(sequence.tokens)):
            self._drop_occurrence(sequence.tokens, index)
        self.version += 1

    # Reading: positions, their counts and continuations.

    def find(self, substring: Sequence[int]) -> Position | None:
        """Where `substring` ends in the tree; None if it is not there. O(len(substring))."""
        position: Position = (self.root, 0)
        for token in substring:
            found = self.step(position, token)
            if found is None:
                return None
            position = found
        return position

    def step(self, position: Position, token: int) -> Position | None:
        node, extra = position
        if not node.is_leaf:
            child = node.children.get(token)
            return None if child is None else (child, 0)
        return (node, extra + 1) if self._next_in_leaf(node, extra) == token else None

    def count(self, position: Position) -> int:
        return position[0].count  # below a leaf: the leaf's one occurrence

    def continued(self, position: Position) -> int:
        node, extra = position
        if not node.is_leaf:
            return node.continued
        return 0 if self._next_in_leaf(node, extra) is None else 1

    def continuations(self, position: Position) -> list[tuple[int, Position, float]]:
        """(token, position after it, how often it followed) for each token that followed."""
        node, extra = position
        if not node.is_leaf:
            return [(token, (child, 0), child.count / node.continued) for token, child in node.children.items()]
        token = self._next_in_leaf(node, extra)
        return [] if token is None else [(token, (node, extra + 1), 1.0)]

    def depth(self, position: Position) -> int:
        return position[0].depth + position[1]

    def _next_in_leaf(self, leaf: Node, extra: int) -> int | None:
        # Below the depth bound nothing is stored, even where the sequence goes on.
        sequence, position = leaf.sequence, leaf.end + extra + 1
        assert sequence is not None
        if position >= sequence.end or leaf.depth + extra >= self.max_depth:
            return None
        return sequence.token_at(position)

    # Writing.

    def _append(self, sequence: _Sequence, token: int) -> None:
        # Every repeated suffix of the tail gains this token: one more occurrence of each
        # extended substring (a leaf met here occurred once before: it is split). The suffixes
        # that occurred only here extend below their leaves with no work. The token is stored
        # first: a leaf split here may have its one occurrence end right before it.
        position = sequence.end
        sequence.tokens.append(token)
        active = sequence.active
        for node in active:
            node.continued += 1
            child = node.children.get(token)
            if child is None:
                node.children[token] = Node(node.depth + 1, sequence, position)
                self.num_nodes += 1
                continue
            if child.is_leaf:
                self._split(child)
            child.count += 1
        extended = [self.root]
        for node in active:
            child = node.children[token]
            if not child.is_leaf and child.depth < self.max_depth:
                extended.append(child)
        sequence.active = extended

    def _split(self, leaf: Node) -> None:
        # A leaf's substring occurs again: it becomes an inner node, its one occurrence's next
        # token (if stored) a leaf child of it.
        token = self._next_in_leaf(leaf, 0)
        sequence, end = leaf.sequence, leaf.end
        leaf.sequence, leaf.children = None, {}
        if token is not None:
            leaf.children[token] = Node(leaf.depth + 1, sequence, end + 1)
            leaf.continued = 1
            self.num_nodes += 1

    def _drop_first(self, sequence: _Sequence) -> None:
        self._drop_occurrence(sequence.tokens, sequence.first)
        sequence.first += 1
        if sequence.first * 2 >= len(sequence.tokens):  # cut in bulk: amortized O(1) a token
            del sequence.tokens[: sequence.first]
            sequence.offset += sequence.first
            sequence.first = 0
        self.version += 1

    def _drop_occurrence(self, tokens: list[int], index: int) -> None:
        # The substrings starting at tokens[index], as far as they were inserted: one occurrence
        # fewer each, down to the leaf that was this occurrence's alone (its deeper substrings
        # were never stored). A node left with no occurrence leaves its parent.
        node = self.root
        for token in tokens[index : index + self.max_depth]:
            node.continued -= 1
            child = node.children[token]
            child.count -= 1
            if child.count == 0:
                del node.children[token]
                self.num_nodes -= 1
            if child.is_leaf:
                assert child.count == 0, "a leaf had more than one occurrence"
                return
            node = child

    def _fit(self, keep: Hashable) -> None:
        if self.max_nodes is None:
            return
        while self.num_nodes > self.max_nodes and len(self._sequences) > 1:
            self.remove(next(key for key in self._sequences if key != keep))
