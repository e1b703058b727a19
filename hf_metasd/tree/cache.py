r"""The target's cache after a tree pass, and where a tree pass cannot run.

**Keeping the accepted path** (`keep_rows`). A tree pass appends all :math:`W` nodes to every layer's keys and values
after the :math:`C` cached positions, in node order; the sequence keeps the root and the accepted nodes only. Their
rows are gathered, moved to positions :math:`C, C + 1, \dots` (a node's keys were computed at its depth's position,
which is where it now lies) and the rest is cropped, so the cache holds exactly the kept sequence, as after a chain.

**Where a tree cannot run** (`tree_unsupported`): a tree pass needs a custom 4-D attention mask honoured by every
layer and a cache whose rows can be moved. It is refused (the call verifies chains, and says why once) for

* a cache layer other than transformers' plain `DynamicLayer` of ``(batch, heads, positions, dim)`` keys:
  recurrent and hybrid models (a recurrent state cannot hold two branches), sliding-window layers (their cache keeps
  a window, and their mask is built from positions), static, quantized or offloaded caches;
* an attention implementation other than ``eager`` and ``sdpa`` (flash attention takes no dense mask; flex
  attention takes a block mask);
* position encodings that do not read position ids: ALiBi (bloom: its bias grows with the key's index in the cache,
  not with its depth in the tree), and models whose `forward` takes no ``position_ids``;
* a padded attention mask (the tree mask sees every cached position), and model inputs besides the ids and the mask
  (token type ids, images, ...).

Example:
    >>> import torch
    >>> from transformers import DynamicCache
    >>> cache = DynamicCache()
    >>> keys = torch.arange(7.0).reshape(1, 1, 7, 1)
    >>> _ = cache.update(keys, keys.clone(), 0)
    >>> keep_rows(cache, cached=3, rows=[0, 2, 3])   # root at 3; keep nodes 2 and 3 of the pass (positions 5, 6)
    >>> cache.layers[0].keys.flatten().tolist()
    [0.0, 1.0, 2.0, 3.0, 5.0, 6.0]
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

__all__ = ["TREE_ATTENTION", "keep_rows", "tree_unsupported"]

#: Attention implementations that take a dense 4-D float mask as it is.
TREE_ATTENTION = ("eager", "sdpa")
#: Model inputs a tree pass may leave behind (it feeds ids, a 4-D mask, positions and the cache itself).
_INPUTS = {"attention_mask", "cache", "past_key_values", "use_cache", "position_ids", "logits_to_keep"}


def keep_rows(cache: Any, cached: int, rows: Sequence[int]) -> None:
    """Keep, after the `cached` positions, only the pass's `rows` (node indices, increasing), moved to
    ``cached .. cached + len(rows) - 1``; crop the rest."""
    index = torch.tensor(list(rows), dtype=torch.long) + int(cached)
    end = int(cached) + len(rows)
    for layer in cache.layers:
        for name in ("keys", "values"):
            tensor = getattr(layer, name)
            moved = tensor.index_select(-2, index.to(tensor.device))  # a copy: the rows it reads are not overwritten
            tensor[..., int(cached) : end, :] = moved
            setattr(layer, name, tensor[..., :end, :])


def _layer_reason(cache: Any) -> str | None:
    layers = getattr(cache, "layers", None)
    if layers is None:
        return f"its cache ({type(cache).__name__}) has no layers of keys and values"
    for layer in layers:
        if type(layer) is not DynamicLayer:
            kind = "recurrent or hybrid" if hasattr(layer, "recurrent_states") or hasattr(layer, "conv_states") else ""
            kind = kind or ("sliding-window" if getattr(layer, "is_sliding", False) else "")
            what = f"a {kind} cache layer" if kind else "a cache layer"
            return f"{what} ({type(layer).__name__}) cannot hold a tree's branches; only `DynamicLayer` can"
    return None


def tree_unsupported(model: Any, cache: Any, model_kwargs: dict[str, Any], input_ids: torch.Tensor) -> str | None:
    """Why `model` cannot verify a tree on `cache` in this call (see the module docstring), or ``None``."""
    if input_ids.shape[0] != 1:
        return f"a batch (B = {input_ids.shape[0]} > 1) verifies every row's chain in one pass"
    reason = _layer_reason(cache)
    if reason is not None:
        return reason
    config = model.config
    attention = getattr(config, "_attn_implementation", None)
    if attention not in TREE_ATTENTION:
        return f"the attention implementation {attention!r} takes no custom 4-D mask (only {list(TREE_ATTENTION)})"
    if getattr(config, "alibi", False) or getattr(config, "model_type", "") in ("bloom", "mpt"):
        return "ALiBi positions follow a key's index in the cache, not its depth in the tree"
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return f"sliding-window attention (window {config.sliding_window}) builds its mask from positions"
    parameters = inspect.signature(model.forward).parameters
    if "position_ids" not in parameters:
        return f"{type(model).__name__}.forward takes no `position_ids` (a node's position is its depth)"
    if "cache" not in parameters:
        return (
            f"{type(model).__name__}.forward takes no `cache` argument (a tree pass hands it the cache by that name)"
        )
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool(mask.all()):
        return "a padded attention mask (a tree pass attends to every cached position)"
    extra = sorted(k for k, v in model_kwargs.items() if v is not None and k not in _INPUTS)
    if extra:
        return f"model inputs besides the ids and the mask ({extra}) are not fed to a tree pass"
    return None
