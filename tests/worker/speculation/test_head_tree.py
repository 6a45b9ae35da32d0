"""The best-first search over a head's guesses (torch-free): which nodes grow, and the tree."""

from __future__ import annotations

import math

from worker.speculation.head_tree import HeadTreeSearch
from worker.speculation.tree import ROOT


def test_the_worked_example_grows_only_what_can_enter_the_tree():
    search = HeadTreeSearch(budget=3, beam=2, max_depth=4)
    search.add_children(ROOT, [(1, -0.1), (2, -1.2)])  # a, b
    assert search.to_grow(1) == [0, 1]
    search.add_children(0, [(3, -0.2), (4, -2.4)])  # c -0.3, d -2.5
    search.add_children(1, [(5, -0.3), (6, -1.8)])  # e -1.5, f -3.0
    assert search.to_grow(2) == [2]  # c alone is among the best 3 (a, c, b)
    search.add_children(2, [(7, -0.2), (8, -3.7)])  # g -0.5, h -4.0
    tree = search.tree()
    assert tree.tokens == [1, 3, 7] and tree.is_chain
    assert search.to_grow(3) == [6]  # g: among the best, and depth 3 < max_depth
    assert search.to_grow(4) == []


def test_siblings_come_best_first_and_parents_before_children():
    search = HeadTreeSearch(budget=5, beam=4, max_depth=3)
    search.add_children(ROOT, [(1, math.log(0.5)), (2, math.log(0.3)), (3, math.log(0.2))])
    search.add_children(0, [(4, math.log(0.9)), (5, math.log(0.1))])
    search.add_children(1, [(6, math.log(0.6))])
    tree = search.tree()
    # scores: 1 .5, 4 .45, 2 .3, 3 .2, 6 .18, 5 .05 -> the best five
    assert tree.tokens == [1, 4, 2, 3, 6]
    assert tree.parents == [ROOT, 0, ROOT, ROOT, 2]
    assert tree.depths == [1, 2, 1, 1, 2]


def test_the_beam_caps_the_nodes_grown_at_a_depth():
    search = HeadTreeSearch(budget=8, beam=2, max_depth=3)
    search.add_children(ROOT, [(t, -0.1 * t) for t in range(1, 5)])
    assert search.to_grow(1) == [0, 1]
