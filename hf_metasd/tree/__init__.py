"""Verifying several drafters at once: one round's drafts merged into a token tree, verified in one target pass.

One concept per module, imports flowing down the list: `token_tree` (the tree of one round's drafts), `mask` (its
attention mask and position ids), `accept` (the path the target keeps: greedy, or multi-draft speculative sampling),
`cache` (the target's cache after the pass; where a tree cannot run), `verify` (the pass and its verdict), `width`
(which arms and lengths a round's pass is worth), `rounds` (`TreeRounds`: one call's tree rounds, for the candidate
generator).
"""

from .accept import accept_greedy, accept_sampled
from .cache import TREE_ATTENTION, keep_rows, tree_unsupported
from .mask import ancestor_matrix, tree_attention_mask, tree_position_ids
from .rounds import TreeRound, TreeRounds
from .token_tree import TokenTree
from .verify import TreeVerdict, tree_pass, verify_tree
from .width import MAX_TREE_ARMS, choose_tree, expected_tokens, extrapolate, optimistic_rates

__all__ = [
    "MAX_TREE_ARMS",
    "TREE_ATTENTION",
    "TokenTree",
    "TreeRound",
    "TreeRounds",
    "TreeVerdict",
    "accept_greedy",
    "accept_sampled",
    "ancestor_matrix",
    "choose_tree",
    "expected_tokens",
    "extrapolate",
    "keep_rows",
    "optimistic_rates",
    "tree_attention_mask",
    "tree_pass",
    "tree_position_ids",
    "tree_unsupported",
    "verify_tree",
]
