"""Drafters without logits: candidate ids, cut where the call's logits processors forbid a token.

A drafter that proposes token ids without a distribution (prompt lookup, a corpus, a drafter with another tokenizer)
has no logits to run the call's logits processors on. transformers' trick for model-free candidates applies instead:
run the processors on constant logits of the target's width after each candidate's prefix; a candidate they set to
-inf (or the dtype's minimum) is forbidden, and the proposal is cut before it (`forbidden_tokens`,
`logits_processor_filter`, `allowed_prefix`).

`CandidateDrafter` does this once for those kinds: it keeps the target's logits width on the call's copy
(`spawn(target)`), and its `draft` hands the filter to the kind's `candidates`, which proposes the ids. It has no
logits (``returns_logits = False``): BD scores it as a one-hot drafter, and speculative sampling falls back to
transformers' token matching, which stays lossless.
"""

from __future__ import annotations

import warnings
from abc import abstractmethod
from collections.abc import Callable
from typing import Any

import torch

from .base import Drafter
from .vocab import target_vocab_size

__all__ = ["CandidateDrafter", "IsAllowed", "allowed_prefix", "forbidden_tokens", "logits_processor_filter"]

#: ``f(prefix (1, L), candidates (n,)) -> (n,) bool``: which candidates may follow `prefix`, each after the ones before.
IsAllowed = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def forbidden_tokens(logits_processor: Any, prefix: torch.Tensor, width: int) -> torch.Tensor:
    """``(width,)`` bool: the tokens `logits_processor` forbids right after `prefix` ``(1, L)``, i.e. sets to -inf or
    the dtype's minimum when run on constant logits (transformers' trick for model-free candidates).

    Example:
        >>> from transformers import LogitsProcessorList, MinLengthLogitsProcessor
        >>> no_eos = LogitsProcessorList([MinLengthLogitsProcessor(10, eos_token_id=2)])
        >>> forbidden_tokens(no_eos, torch.tensor([[5, 6]]), 4).tolist()
        [False, False, True, False]
    """
    scores = logits_processor(prefix, torch.ones((1, width), dtype=torch.float32, device=prefix.device))[0]
    return torch.isneginf(scores) | (scores == torch.finfo(scores.dtype).min)


def logits_processor_filter(logits_processor: Any, width: int | None) -> IsAllowed | None:
    """transformers' trick as an `is_allowed` for `prompt_lookup_candidates`: run the processors on constant logits
    of the target's `width`; a candidate they set to -inf/min is forbidden. ``None`` without processors or width."""
    if logits_processor is None or len(logits_processor) == 0 or width is None:
        return None

    def is_allowed(prefix: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        allowed = torch.ones(candidates.shape[0], dtype=torch.bool)
        sequence = prefix
        for i, token in enumerate(candidates.tolist()):
            if forbidden_tokens(logits_processor, sequence, width)[token]:
                allowed[i:] = False
                break
            sequence = torch.cat([prefix, candidates[: i + 1].unsqueeze(0)], dim=1)
        return allowed

    return is_allowed


def allowed_prefix(candidates: torch.Tensor, prefix: torch.Tensor, is_allowed: IsAllowed | None) -> torch.Tensor:
    """`candidates` ``(n,)`` up to the first one `is_allowed` forbids after `prefix` ``(1, L)`` (all of them without
    `is_allowed`).

    Example:
        >>> no_threes = lambda prefix, candidates: candidates != 3
        >>> allowed_prefix(torch.tensor([5, 6, 3, 7]), torch.tensor([[1]]), no_threes).tolist()
        [5, 6]
    """
    if is_allowed is None or candidates.numel() == 0:
        return candidates
    bad = (~is_allowed(prefix, candidates)).nonzero()
    return candidates[: int(bad[0, 0])] if bad.numel() else candidates


class CandidateDrafter(Drafter):
    """A drafter that proposes target token ids without logits; subclasses implement `candidates`.

    Attributes:
        _logits_width: the target's logits width, which the call's copy keeps (`spawn(target)`) to apply logits
            processors to candidates; ``None`` before (a kind may set a default, e.g. a corpus's `vocab_size`).
    """

    returns_logits = False
    _logits_width: int | None = None

    def spawn(self, target: Any = None) -> CandidateDrafter:
        """The call's copy; it keeps the target's logits width to apply its logits processors to candidates."""
        clone = super().spawn(target)
        if target is not None:
            clone._logits_width = target_vocab_size(target)
        return clone

    @abstractmethod
    def candidates(
        self, input_ids: torch.LongTensor, num_tokens: int, is_allowed: IsAllowed | None
    ) -> torch.LongTensor:
        """Up to `num_tokens` (>= 1) candidate ids ``(n,)`` after `input_ids` ``(1, L)``, cut before the first one
        `is_allowed` forbids (`allowed_prefix`; ``None``: the call has no logits processors)."""

    def draft(
        self,
        input_ids: torch.LongTensor,
        num_tokens: int,
        *,
        logits_processor: Any = None,
        do_sample: bool = False,
    ) -> tuple[torch.LongTensor, None]:
        """Up to `num_tokens` tokens after `input_ids` ``(1, L)``: ``(tokens (1, n), None)``, ``n`` may be 0 (the
        drafter abstains). Greedy and sampling alike: the target verifies every candidate."""
        if num_tokens < 1:
            return input_ids[:, :0], None
        if self._logits_width is None and logits_processor is not None and len(logits_processor) > 0:
            warnings.warn(
                f"drafter {self.name!r} cannot apply the logits processors to its drafts without the target's "
                "logits width; it proposes them uncut (still lossless: the target verifies every token). "
                "Draft with `drafter.spawn(target)` (as `generate` does).",
                stacklevel=2,
            )
        tokens = self.candidates(input_ids, num_tokens, logits_processor_filter(logits_processor, self._logits_width))
        return tokens.reshape(1, -1).to(input_ids.device), None
