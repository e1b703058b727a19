r"""`TokenTree`: the drafts of one round, several arms at once, merged into one tree of tokens.

Each arm :math:`a` of the round drafted a chain :math:`x^a_1 \dots x^a_{n_a}` after the same sequence. The tree's
root is the sequence's last token (the one the target's cache lacks, fed first by every verification pass); each
draft is a path from the root, and drafts that begin alike share their common prefix: a token drafted by two arms
after the same prefix is one node. The target then verifies every node in one pass (`hf_metasd.tree.mask`), each
node seeing the cache and its own ancestors only.

Nodes are numbered in the order the drafts are inserted (arm order, then depth), so that a node's parent always has a
smaller index: the order of the rows fed to the target, and a topological order of the tree. A round of one arm is a
chain, the tree of one path, and verifies exactly as single-drafter speculative decoding does.

Example:
    >>> import torch
    >>> tree = TokenTree.from_drafts(7, [(0, torch.tensor([1, 2, 3]), None), (2, torch.tensor([1, 5]), None)])
    >>> tree.tokens.tolist(), tree.parents, tree.depths
    ([7, 1, 2, 3, 5], [-1, 0, 1, 2, 1], [0, 1, 2, 3, 2])
    >>> tree.branches, tree.width, tree.is_chain
    ({0: [1, 2, 3], 2: [1, 4]}, 5, False)
    >>> tree.path_tokens([1, 4])
    [1, 5]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

__all__ = ["TokenTree"]


@dataclass
class TokenTree:
    """The tree of one round's drafts (see the module docstring).

    Attributes:
        tokens: ``(W,)`` the token of each node; node 0 is the root (the sequence's last token).
        parents: the parent of each node (``-1`` for the root); always smaller than the node's own index.
        depths: each node's depth (the root 0; a drafted token at depth :math:`d` is its draft's :math:`d`-th).
        children: each node's children, in insertion order.
        branches: arm -> the nodes its draft runs through, in order (``len == n_a``), in the order arms were given.
        draft_logits: arm -> ``(n_a, V)`` the processed logits its tokens were drafted from, or ``None`` (a
            deterministic drafter); row :math:`d` is the distribution of its token at depth :math:`d + 1`.
    """

    tokens: torch.Tensor
    parents: list[int]
    depths: list[int]
    children: list[list[int]]
    branches: dict[int, list[int]] = field(default_factory=dict)
    draft_logits: dict[int, torch.Tensor | None] = field(default_factory=dict)

    @classmethod
    def from_drafts(cls, root: int, drafts: Sequence[tuple[int, torch.Tensor, torch.Tensor | None]]) -> TokenTree:
        """The tree of `drafts`, each ``(arm, tokens (n,), logits (n, V) or None)``, after the root token `root`.

        An arm may appear once; an empty draft adds no node (and no branch).
        """
        tokens, parents, depths, children = [int(root)], [-1], [0], [[]]
        branches: dict[int, list[int]] = {}
        draft_logits: dict[int, torch.Tensor | None] = {}
        for arm, draft, logits in drafts:
            if arm in branches:
                raise ValueError(f"`drafts` must hold one draft per arm, but arm {arm} has two. Merge them first.")
            draft = [int(t) for t in draft.reshape(-1).tolist()]
            if not draft:
                continue
            node, branch = 0, []
            for token in draft:
                child = next((c for c in children[node] if tokens[c] == token), None)
                if child is None:
                    child = len(tokens)
                    tokens.append(token)
                    parents.append(node)
                    depths.append(depths[node] + 1)
                    children.append([])
                    children[node].append(child)
                branch.append(child)
                node = child
            branches[arm] = branch
            draft_logits[arm] = None if logits is None else logits[: len(draft)]
        return cls(torch.tensor(tokens, dtype=torch.long), parents, depths, children, branches, draft_logits)

    @property
    def width(self) -> int:
        """Nodes of the tree, root included: the rows of its verification pass."""
        return len(self.parents)

    @property
    def num_drafted(self) -> int:
        """Drafted tokens the pass verifies (nodes but the root)."""
        return self.width - 1

    @property
    def is_chain(self) -> bool:
        """Whether the tree is one path (one arm's draft, or drafts that are prefixes of each other)."""
        return all(len(c) <= 1 for c in self.children)

    @property
    def arms(self) -> list[int]:
        """The arms with a draft in the tree, in the order given."""
        return list(self.branches)

    def ancestors(self, node: int) -> list[int]:
        """The nodes from the root to `node`, both included."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def path_tokens(self, nodes: Sequence[int]) -> list[int]:
        """The tokens of `nodes`."""
        return [int(self.tokens[n]) for n in nodes]

    def chain(self) -> list[int]:
        """The nodes of a chain tree, in order (the root left out)."""
        if not self.is_chain:
            raise ValueError("`chain` needs a tree that is one path, but this one branches. Read `branches`.")
        return list(range(1, self.width))

    def proposals(self, node: int) -> list[tuple[int, int]]:
        """The proposals made at `node`: ``(arm, child)`` for every arm whose draft runs through `node` (the root:
        every arm) and continues past it, in arm order."""
        depth = self.depths[node]
        out = []
        for arm, branch in self.branches.items():
            if len(branch) > depth and (depth == 0 or branch[depth - 1] == node):
                out.append((arm, branch[depth]))
        return out

    def accepted_by(self, arm: int, path: Sequence[int]) -> int:
        """How many of `arm`'s drafted tokens lie on `path` (the accepted nodes, root left out): the common prefix
        of its branch and the path."""
        count = 0
        for mine, kept in zip(self.branches.get(arm, []), path):
            if mine != kept:
                break
            count += 1
        return count

    def path_arm(self, path: Sequence[int], prefer: int | None = None) -> int | None:
        """The arm whose draft covers most of `path` (accepted nodes, root left out): `prefer` on a tie, else the
        first in arm order; ``None`` for an empty path."""
        if not path:
            return None
        covered = {arm: self.accepted_by(arm, path) for arm in self.branches}
        most = max(covered.values())
        if prefer is not None and covered.get(prefer) == most:
            return prefer
        return next(arm for arm, count in covered.items() if count == most)
