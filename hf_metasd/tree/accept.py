r"""Which path of a verified `TokenTree` the target keeps: greedy, or lossless multi-draft speculative sampling.

The verification pass gives the target's processed logits :math:`z_i` at every node :math:`i` (the distribution of the
token after the node's path), so acceptance walks down from the root.

**Greedy** (`accept_greedy`): at node :math:`i` the target's token is :math:`t_i = \arg\max z_i`; if a child of
:math:`i` holds :math:`t_i` the walk moves there, else :math:`t_i` is the round's own (bonus) token and the walk
ends. The kept tokens are the target's own greedy chain as far as the tree holds it, plus one: exactly what plain
greedy decoding produces, whatever the drafts. On a chain this is single-drafter token matching.

**Sampling** (`accept_sampled`; SpecInfer's multi-step speculative sampling, Miao et al. 2024): at node :math:`i`
with target distribution :math:`p = \mathrm{softmax}(z_i)`, the arms whose drafts continue past :math:`i` made
proposals :math:`x_1, \dots, x_m` (arm order), each drawn from the arm's own processed distribution :math:`q_k` at
that position (a deterministic drafter's is one-hot, :math:`q_k = \delta_{x_k}`). For :math:`k = 1, \dots, m`:
accept :math:`x_k` with probability :math:`\min(1, p(x_k) / q_k(x_k))` and move to its node; otherwise replace
:math:`p` by the residual :math:`\max(0, p - q_k) / \lVert \max(0, p - q_k) \rVert_1` and try the next. When all are
rejected, the bonus token is drawn from the last :math:`p`. Each step's token is distributed as :math:`p`, so the
output follows the target's distribution, for any number of drafts and any mix of drafters (one draft: standard
speculative sampling; one-hot: sample-and-compare's distribution). Random numbers come from torch's global
generator, as transformers' speculative sampling takes them.

Example:
    >>> import torch
    >>> from hf_metasd.tree import TokenTree
    >>> tree = TokenTree.from_drafts(9, [(0, torch.tensor([1, 2]), None), (1, torch.tensor([1, 3]), None)])
    >>> scores = torch.full((tree.width, 5), -1.0)
    >>> scores[0, 1] = scores[1, 3] = scores[3, 4] = 1.0   # the target: 1 after the root, 3 after 1, then 4
    >>> accept_greedy(tree, scores)
    ([1, 3], [1, 3, 4])
"""

from __future__ import annotations

import torch

from .token_tree import TokenTree

__all__ = ["accept_greedy", "accept_sampled"]


def accept_greedy(tree: TokenTree, scores: torch.Tensor) -> tuple[list[int], list[int]]:
    """The target's greedy path through `tree`: the accepted nodes (root left out) and the round's tokens (their
    tokens, then the target's own). `scores` ``(W, V)`` are the target's processed logits at every node."""
    tokens = tree.tokens.tolist()
    best = scores.argmax(dim=-1).tolist()
    node, path = 0, []
    while True:
        child = next((c for c in tree.children[node] if tokens[c] == best[node]), None)
        if child is None:
            return path, [tokens[n] for n in path] + [best[node]]
        path.append(child)
        node = child


def _proposal(tree: TokenTree, arm: int, node: int, child: int, vocab: int) -> torch.Tensor:
    """Arm `arm`'s proposal distribution at `node` (the one its token at `child` was drawn from)."""
    logits = tree.draft_logits.get(arm)
    if logits is None:  # a deterministic drafter: one-hot
        q = torch.zeros(vocab)
        q[int(tree.tokens[child])] = 1.0
        return q
    return logits[tree.depths[node]].float().softmax(dim=-1)


def accept_sampled(tree: TokenTree, scores: torch.Tensor) -> tuple[list[int], list[int]]:
    """Multi-draft speculative sampling down `tree` (see the module docstring): the accepted nodes (root left out)
    and the round's tokens. `scores` ``(W, V)`` are the target's processed logits at every node."""
    scores = scores.float().cpu()
    vocab = scores.shape[-1]
    node, path = 0, []
    while True:
        p = scores[node].softmax(dim=-1)
        moved = False
        for arm, child in tree.proposals(node):
            q = _proposal(tree, arm, node, child, vocab)
            token = int(tree.tokens[child])
            ratio = p[token] / q[token] if q[token] > 0 else torch.tensor(float("inf"))
            if float(torch.rand(())) <= float(ratio):
                path.append(child)
                node, moved = child, True
                break
            residual = (p - q).clamp_min(0.0)
            total = float(residual.sum())
            if total > 0.0:  # p == q leaves nothing: then the proposal was accepted with probability 1
                p = residual / total
        if not moved:
            bonus = int(torch.multinomial(p, num_samples=1))
            return path, [int(tree.tokens[n]) for n in path] + [bonus]
