r"""One verification pass over a `TokenTree`, and what the target keeps of it.

`verify_tree` feeds the tree's nodes (the root, the sequence's last token, then every drafted token) on the target's
cache with the tree's 4-D mask and depth positions (`hf_metasd.tree.mask`), processes each node's logits with the
call's logits processors on that node's own sequence (the sequence so far, then the tokens of the node's path), picks
the path (`hf_metasd.tree.accept`) and returns a `TreeVerdict`: the round's tokens and, per kept token, the processed
and raw logits of the row that produced it, as a chain round gives them to the loop. `TreeVerdict.keep` then
leaves the target's cache holding the kept tokens only (`hf_metasd.tree.cache.keep_rows`).

Example:
    >>> import torch
    >>> from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM
    >>> from hf_metasd.tree import TokenTree
    >>> _ = torch.manual_seed(0)
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
    ...                          num_hidden_layers=1, num_attention_heads=2)).eval()
    >>> ids = torch.tensor([[3, 5, 7, 9]])
    >>> cache = DynamicCache(config=model.config)
    >>> _ = model(ids[:, :-1], cache=cache)                       # the cache holds all but the last token
    >>> tree = TokenTree.from_drafts(9, [(0, torch.tensor([4, 6]), None), (1, torch.tensor([8]), None)])
    >>> verdict = verify_tree(model, tree, ids, cache)
    >>> plain = model.generate(ids, do_sample=False, max_new_tokens=1)
    >>> verdict.tokens[0] == int(plain[0, -1]), verdict.rows[0]   # the root's row gives the target's next token
    (True, 0)
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import torch

from .accept import accept_greedy, accept_sampled
from .cache import keep_rows
from .mask import tree_attention_mask, tree_position_ids
from .token_tree import TokenTree

__all__ = ["TreeVerdict", "verify_tree"]


@dataclass
class TreeVerdict:
    """What the target kept of a verified tree.

    Attributes:
        tree: the verified tree.
        path: the accepted nodes (the root left out), in order.
        tokens: the round's tokens: the accepted nodes' tokens, then the target's own.
        rows: the pass's rows that produced each of `tokens` (the root's, then each accepted node's).
        scores: ``(W, V)`` float32, the target's processed logits at every node (the rewards of every arm in the
            tree read their branch's rows).
        raw: ``(W, V)`` float32, the same before the logits processors (``output_logits``).
        cached: the cache length before the pass.
        outputs: the pass's model outputs.
        recorded: what each feature recorder recorded in the pass, ``(1, W, kH)`` per recorder.
    """

    tree: TokenTree
    path: list[int]
    tokens: list[int]
    rows: list[int]
    scores: torch.Tensor
    raw: torch.Tensor
    cached: int
    outputs: Any = None
    recorded: dict[tuple[int, ...], torch.Tensor] = field(default_factory=dict)

    @property
    def num_accepted(self) -> int:
        """Drafted tokens kept before any stopping criterion."""
        return len(self.path)

    def token_tensor(self, device: torch.device | str | None = None) -> torch.LongTensor:
        """`tokens` as ``(1, a + 1)``."""
        return torch.tensor([self.tokens], dtype=torch.long, device=device)

    def kept_scores(self, raw: bool = False) -> torch.Tensor:
        """``(1, a + 1, V)``: the processed (or `raw`) logits of the rows that produced the round's tokens."""
        return (self.raw if raw else self.scores)[self.rows][None]

    def path_features(self) -> dict[tuple[int, ...], torch.Tensor]:
        """Each recorder's features ``(1, a + 1, kH)`` of the rows of `rows` (the root and the accepted nodes), as a
        chain pass over the kept path would have recorded them."""
        return {layers: feature[:, self.rows] for layers, feature in self.recorded.items()}

    def keep(self, kept: int) -> None:
        """Leave the target's cache holding the sequence's first ``kept`` new tokens but the last (fed next round):
        the root and the first ``kept - 1`` accepted nodes."""
        keep_rows(self.outputs.cache, self.cached, self.rows[:kept])


def _processed(
    tree: TokenTree, logits: torch.Tensor, input_ids: torch.LongTensor, logits_processor: Any
) -> torch.Tensor:
    """Each node's logits processed on the node's own sequence: `input_ids`, then the tokens of its path."""
    scores = logits.clone()
    if logits_processor is None or len(logits_processor) == 0:
        return scores
    for node in range(tree.width):
        path = tree.ancestors(node)[1:]
        prefix = torch.cat((input_ids, tree.tokens[path][None].to(input_ids.device)), dim=-1)
        scores[node : node + 1] = logits_processor(prefix, scores[node : node + 1])
    return scores


def tree_pass(
    model: Any,
    tree: TokenTree,
    cache: Any,
    cached: int,
    recorders: Mapping[tuple[int, ...], Any] | None = None,
) -> tuple[Any, dict[tuple[int, ...], torch.Tensor]]:
    """The target's forward pass over `tree`'s nodes on `cache` (`cached` positions), every row's logits kept;
    returns its outputs and what each recorder recorded."""
    device = model.device
    dtype = model.dtype if model.dtype.is_floating_point else torch.float32
    inputs = {
        "input_ids": tree.tokens[None].to(device),
        "attention_mask": tree_attention_mask(tree, cached, dtype, device),
        "position_ids": tree_position_ids(tree, cached, device),
        "cache": cache,
        "use_cache": True,
    }
    with ExitStack() as hooks:
        for recorder in (recorders or {}).values():
            hooks.enter_context(recorder)
        with model._optimize_model_for_decode():
            outputs = model(**inputs)
    recorded = {}
    for layer_ids, recorder in (recorders or {}).items():
        recorded[layer_ids] = recorder.features()
        recorder.clear()
    return outputs, recorded


def verify_tree(
    model: Any,
    tree: TokenTree,
    input_ids: torch.LongTensor,
    cache: Any,
    *,
    logits_processor: Any = None,
    do_sample: bool = False,
    recorders: Mapping[tuple[int, ...], Any] | None = None,
) -> TreeVerdict:
    """Verify `tree` after `input_ids` ``(1, L)``, whose last token is the tree's root and which `cache` holds but
    for that token (see the module docstring)."""
    cached = int(cache.get_seq_length())
    outputs, recorded = tree_pass(model, tree, cache, cached, recorders)
    raw = outputs.logits[0, -tree.width :].to(dtype=torch.float32, device=input_ids.device)
    scores = _processed(tree, raw, input_ids, logits_processor)
    path, tokens = (accept_sampled if do_sample else accept_greedy)(tree, scores)
    return TreeVerdict(tree, path, tokens, [0, *path], scores, raw, cached, outputs, recorded)
