"""EAGLE-3's vocabulary map between a head's draft vocabulary (``Vd`` ids) and the target's (``V`` ids).

``d2t`` (``(Vd,)``, int64) holds offsets: draft id ``d`` is target id ``d + d2t[d]``; ``t2d`` (``(V,)``, bool) marks the
target ids that have a draft id. These are the buffers speculators saves and vLLM reads (``d2t``; it skips ``t2d``).
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import InvalidPoolError

__all__ = ["check_vocab_map", "vocab_map"]


def vocab_map(target_ids: Any, vocab_size: int) -> tuple[torch.LongTensor, torch.BoolTensor]:
    """EAGLE-3's ``(d2t, t2d)`` for a draft vocabulary made of the target tokens `target_ids` (in draft-id order):
    ``d2t[d] = target_ids[d] - d`` (an offset), ``t2d[t] = t in target_ids``.

    Example:
        >>> d2t, t2d = vocab_map([3, 5, 6], 8)
        >>> d2t.tolist(), t2d.nonzero().flatten().tolist()
        ([3, 4, 4], [3, 5, 6])
    """
    ids = torch.as_tensor(target_ids, dtype=torch.long).flatten()
    d2t = ids - torch.arange(ids.numel())
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids.clamp(0, vocab_size - 1)] = True  # out-of-range ids are refused just below
    check_vocab_map(d2t, t2d, vocab_size, "`target_ids`")
    return d2t, t2d


def check_vocab_map(d2t: torch.Tensor, t2d: torch.Tensor, vocab_size: int, where: str) -> None:
    """Raise `InvalidPoolError` unless ``d + d2t[d]`` are ``Vd`` distinct target ids in ``[0, V)`` and `t2d` is
    exactly their mask (``Vd = len(d2t)``, ``V = vocab_size = len(t2d)``)."""
    fix = "Rebuild the map with `hf_metasd.feature_head.vocab_map(target_ids, vocab_size)`."
    ids = torch.arange(d2t.numel(), device=d2t.device) + d2t.long()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise InvalidPoolError(
            f"{where} must map every draft id to a target id in [0, {vocab_size}), but maps to "
            f"[{int(ids.min())}, {int(ids.max())}]. {fix}"
        )
    if ids.unique().numel() != ids.numel():
        raise InvalidPoolError(f"{where} must map draft ids to distinct target ids, but repeats some. {fix}")
    if t2d.shape != (vocab_size,) or int(t2d.sum()) != ids.numel() or not bool(t2d[ids].all()):
        raise InvalidPoolError(
            f"{where} must have `t2d` marking exactly the {ids.numel()} target ids `d2t` maps to, but marks "
            f"{int(t2d.sum())} others or has shape {tuple(t2d.shape)}. {fix}"
        )
