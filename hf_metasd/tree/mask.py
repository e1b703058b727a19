r"""The attention mask and position ids of a tree's verification pass.

The pass feeds the tree's :math:`W` nodes (`hf_metasd.tree.TokenTree`: the root, then every drafted token, parents
before children) on a cache of :math:`C` positions. Node :math:`i` must see what it would see in the sequence its
path spells: every cached position and its own ancestors (itself included), nothing of another branch. So the pass
gets a 4-D mask of shape ``(1, 1, W, C + W)``,

.. math::

    M_{i, k} = 0 \text{ if } k < C \text{ or } (k - C) \in \mathrm{anc}(i), \qquad M_{i, k} = m \text{ otherwise},

with :math:`m` the dtype's most negative number (added to the attention scores before their softmax, as transformers'
eager and sdpa attentions take a prepared float mask), and position ids by depth, :math:`C + \mathrm{depth}(i)`: a
node's rotary (or absolute) position is the one its token would have in its own sequence. transformers hands a 4-D
mask to the attention as it is (`masking_utils`: "already prepared, or custom"). A chain's mask is the causal one.

Example:
    >>> import torch
    >>> from hf_metasd.tree import TokenTree
    >>> tree = TokenTree.from_drafts(7, [(0, torch.tensor([1, 2]), None), (1, torch.tensor([4]), None)])
    >>> ancestor_matrix(tree).int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 1]]
    >>> tree_position_ids(tree, cached=5).tolist()
    [[5, 6, 7, 6]]
    >>> mask = tree_attention_mask(tree, cached=2, dtype=torch.float32)
    >>> mask.shape, (mask[0, 0] == 0).int().tolist()[3]
    (torch.Size([1, 1, 4, 6]), [1, 1, 1, 0, 0, 1])
"""

from __future__ import annotations

import torch

from .token_tree import TokenTree

__all__ = ["ancestor_matrix", "tree_attention_mask", "tree_position_ids"]


def ancestor_matrix(tree: TokenTree) -> torch.Tensor:
    """``(W, W)`` bool: entry ``[i, j]`` is whether node `j` is node `i` or one of its ancestors."""
    width = tree.width
    out = torch.zeros(width, width, dtype=torch.bool)
    for node in range(width):
        parent = tree.parents[node]
        if parent >= 0:
            out[node] = out[parent]  # parents come first: their row is complete
        out[node, node] = True
    return out


def tree_position_ids(tree: TokenTree, cached: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``(1, W)`` position ids: `cached` plus each node's depth (the root sits right after the cache)."""
    return (torch.tensor(tree.depths, dtype=torch.long, device=device) + int(cached))[None]


def tree_attention_mask(
    tree: TokenTree, cached: int, dtype: torch.dtype, device: torch.device | str | None = None
) -> torch.Tensor:
    """``(1, 1, W, cached + W)`` float mask: 0 where a node may attend (every cached position, its ancestors and
    itself), the dtype's most negative number elsewhere."""
    seen = torch.cat((torch.ones(tree.width, int(cached), dtype=torch.bool), ancestor_matrix(tree)), dim=1)
    mask = torch.zeros(seen.shape, dtype=dtype)
    mask.masked_fill_(~seen, torch.finfo(dtype).min)
    return mask[None, None].to(device)
