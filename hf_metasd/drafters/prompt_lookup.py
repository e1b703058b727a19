"""Prompt-lookup drafter: model-free n-gram matching over the prompt and the text generated so far.

The search is transformers' `PromptLookupCandidateGenerator.get_candidates`, written as a pure function
(`prompt_lookup_candidates`) so that it can be tested on hand-made sequences: for ``n`` from `max_matching_ngram_size`
down to 1, take the last ``n`` tokens, find their occurrences in the sequence left to right, and propose the (up to
`num_output_tokens`) tokens that followed the first occurrence that has a non-empty continuation.
"""

from __future__ import annotations

from typing import Any

import torch

from .._validation import check_int
from .base import int_error
from .candidates import CandidateDrafter, IsAllowed, allowed_prefix, forbidden_tokens, logits_processor_filter
from .registry import register_drafter_kind
from .spec import MAX_NUM_ASSISTANT_TOKENS, DrafterSpec, check_at_most

__all__ = [
    "PromptLookupDrafter",
    "forbidden_tokens",  # from `hf_metasd.drafters.candidates`, where they live
    "logits_processor_filter",
    "prompt_lookup_candidates",
]

#: Longest n-gram a pool file may ask prompt lookup to match (each draft tries every size down to 1).
MAX_NGRAM_SIZE = 64


def prompt_lookup_candidates(
    input_ids: torch.Tensor,
    num_output_tokens: int,
    max_matching_ngram_size: int = 2,
    *,
    is_allowed: IsAllowed | None = None,
) -> torch.Tensor:
    """Tokens that followed the earliest earlier occurrence of the sequence's last n-gram (transformers' semantics).

    Args:
        input_ids: ``(L,)`` or ``(1, L)`` token ids (prompt + generated text).
        num_output_tokens: most tokens to propose.
        max_matching_ngram_size: longest n-gram tried first; shorter ones down to 1 are tried when it does not match.
        is_allowed: optional ``f(prefix (1, L'), candidates (n,)) -> (n,) bool``: the proposal is cut before the first
            candidate that is not allowed (transformers uses the logits processors for this), and a match whose
            first token is not allowed is skipped.

    Returns:
        ``(n,)`` proposed ids, ``0 <= n <= num_output_tokens`` (empty when nothing matches).

    Example:
        >>> import torch
        >>> seq = torch.tensor([5, 6, 7, 8, 9, 5, 6, 7, 1, 5, 6])
        >>> prompt_lookup_candidates(seq, 3).tolist()        # "5 6" first occurs at 0 -> 7 8 9
        [7, 8, 9]
        >>> prompt_lookup_candidates(seq, 3, max_matching_ngram_size=3).tolist()  # no earlier "1 5 6": falls back to "5 6"
        [7, 8, 9]
        >>> prompt_lookup_candidates(torch.tensor([1, 2, 3]), 3).tolist()   # no earlier "3"
        []
    """
    ids = input_ids.reshape(1, -1)
    length = ids.shape[1]
    for ngram_size in range(min(max_matching_ngram_size, length - 1), 0, -1):
        windows = ids.unfold(dimension=1, size=ngram_size, step=1)
        ngram = ids[0, -ngram_size:]
        match_indices = (windows == ngram).all(dim=2).nonzero(as_tuple=True)[1]
        for idx in match_indices.tolist():
            start = idx + ngram_size
            end = min(start + num_output_tokens, length)
            if start >= end:
                continue
            chosen = allowed_prefix(ids[0, start:end], ids, is_allowed)
            if chosen.numel() == 0:
                continue  # transformers: no valid token here -> look for another match
            return chosen
    return ids[0, :0]


@register_drafter_kind
class PromptLookupDrafter(CandidateDrafter):
    """Model-free drafter that copies continuations of n-grams found earlier in the sequence.

    Useful when the output repeats its input (summaries, code edits, RAG answers). It has no logits (a
    `~hf_metasd.drafters.candidates.CandidateDrafter`). It costs no forward pass, so it has no catch-up cost either.

    Args:
        max_matching_ngram_size: longest n-gram to match (transformers' `max_matching_ngram_size`, default 2).
        num_output_tokens: most tokens to propose per round (transformers' `prompt_lookup_num_tokens`); ``None``
            (default) uses the round's draft length `num_assistant_tokens`. The smaller of the two wins.
        name: label (default ``"prompt_lookup"``).

    Example:
        >>> import torch
        >>> drafter = PromptLookupDrafter()
        >>> tokens, logits = drafter.draft(torch.tensor([[5, 6, 7, 8, 9, 1, 5, 6]]), 2)
        >>> tokens.tolist(), logits
        ([[7, 8]], None)
    """

    kind = "prompt_lookup"
    replayable = True

    def __init__(
        self, max_matching_ngram_size: int = 2, num_output_tokens: int | None = None, *, name: str | None = None
    ) -> None:
        check_int(
            "max_matching_ngram_size",
            max_matching_ngram_size,
            low=1,
            hint="Use e.g. 2.",
            error=int_error(max_matching_ngram_size),
        )
        if num_output_tokens is not None:
            check_int(
                "num_output_tokens", num_output_tokens, low=1, hint="Use e.g. 10.", error=int_error(num_output_tokens)
            )
        super().__init__(name)
        self.max_matching_ngram_size = max_matching_ngram_size
        self.num_output_tokens = num_output_tokens

    def config(self) -> dict[str, Any]:
        return {"max_matching_ngram_size": self.max_matching_ngram_size, "num_output_tokens": self.num_output_tokens}

    @classmethod
    def validate_spec(cls, spec: DrafterSpec, where: str) -> None:
        """The upper bounds of a pool file (the constructor checks the rest): ``max_matching_ngram_size`` at most
        `MAX_NGRAM_SIZE` (64), ``num_output_tokens`` at most `MAX_NUM_ASSISTANT_TOKENS` (128)."""
        check_at_most(
            spec.params.get("max_matching_ngram_size"), f"{where} `params.max_matching_ngram_size`", MAX_NGRAM_SIZE
        )
        check_at_most(
            spec.params.get("num_output_tokens"), f"{where} `params.num_output_tokens`", MAX_NUM_ASSISTANT_TOKENS
        )
        super().validate_spec(spec, where)

    def candidates(self, input_ids: torch.LongTensor, num_tokens: int, is_allowed: IsAllowed | None) -> torch.Tensor:
        """`prompt_lookup_candidates` for at most `num_tokens` (and `num_output_tokens`) tokens."""
        limit = num_tokens if self.num_output_tokens is None else min(num_tokens, self.num_output_tokens)
        return prompt_lookup_candidates(input_ids, limit, self.max_matching_ngram_size, is_allowed=is_allowed)
