"""Prompt-lookup drafter: model-free n-gram matching over the prompt and the text generated so far.

The search is transformers' `PromptLookupCandidateGenerator.get_candidates`, written as a pure function
(`prompt_lookup_candidates`) so that it can be tested on hand-made sequences: for ``n`` from `max_matching_ngram_size`
down to 1, take the last ``n`` tokens, find their occurrences in the sequence left to right, and propose the (up to
`num_output_tokens`) tokens that followed the first occurrence that has a non-empty continuation.
"""

from __future__ import annotations

from collections.abc import Callable
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
    "ngram_occurrences",
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
    occurrences: Callable[[int], list[int]] | None = None,
) -> torch.Tensor:
    """Tokens that followed the earliest earlier occurrence of the sequence's last n-gram (transformers' semantics).

    Args:
        input_ids: ``(L,)`` or ``(1, L)`` token ids (prompt + generated text).
        num_output_tokens: most tokens to propose.
        max_matching_ngram_size: longest n-gram tried first; shorter ones down to 1 are tried when it does not match.
        is_allowed: optional ``f(prefix (1, L'), candidates (n,)) -> (n,) bool``: the proposal is cut before the first
            candidate that is not allowed (transformers uses the logits processors for this), and a match whose
            first token is not allowed is skipped.
        occurrences: optional ``f(n)``: `ngram_occurrences` of `input_ids` for ``n`` (a drafter remembers them).

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
    find = occurrences if occurrences is not None else (lambda n: ngram_occurrences(ids, n))
    for ngram_size in range(min(max_matching_ngram_size, length - 1), 0, -1):
        for idx in find(ngram_size):
            start = idx + ngram_size
            end = min(start + num_output_tokens, length)
            if start >= end:
                continue
            chosen = allowed_prefix(ids[0, start:end], ids, is_allowed)
            if chosen.numel() == 0:
                continue  # transformers: no valid token here -> look for another match
            return chosen
    return ids[0, :0]


def ngram_occurrences(ids: torch.Tensor, ngram_size: int) -> list[int]:
    """The start positions, ascending, of every occurrence in `ids` ``(1, L)`` of its last `ngram_size` tokens (the
    last is that n-gram itself).

    Example:
        >>> ngram_occurrences(torch.tensor([[5, 6, 7, 5, 6]]), 2)
        [0, 3]
    """
    windows = ids.unfold(dimension=1, size=ngram_size, step=1)
    return (windows == ids[0, -ngram_size:]).all(dim=2).nonzero(as_tuple=True)[1].tolist()


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
        self.reset()

    def reset(self) -> None:
        """Forget the remembered n-gram search (assigned fresh: `spawn` copies do not share it)."""
        self._last_search: tuple[Any, dict[int, list[int]]] | None = None  # (the sequence's key, n -> occurrences)

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
        return prompt_lookup_candidates(
            input_ids,
            limit,
            self.max_matching_ngram_size,
            is_allowed=is_allowed,
            occurrences=self._occurrences(input_ids.reshape(1, -1)),
        )

    def match_length(self, input_ids: torch.LongTensor) -> int:
        """The length of the n-gram a `draft` on `input_ids` ``(1, L)`` would continue, without drafting: the longest
        ``n <= max_matching_ngram_size`` whose last ``n`` tokens occur earlier with a token after them, 0 where none
        does (it would abstain). The call's logits processors can make a draft skip that match for a shorter one.
        The search is remembered, so that the draft (or a replayed round's proposal) on the same sequence does not
        repeat it. For a contextual policy (`hf_metasd.policies.RoundContext`).

        Example:
            >>> drafter = PromptLookupDrafter(max_matching_ngram_size=3)
            >>> drafter.match_length(torch.tensor([[5, 6, 7, 8, 6, 7]])), drafter.match_length(torch.tensor([[1, 2]]))
            (2, 0)
        """
        ids = input_ids.reshape(1, -1)
        length = ids.shape[1]
        occurrences = self._occurrences(ids)
        for ngram_size in range(min(self.max_matching_ngram_size, length - 1), 0, -1):
            if occurrences(ngram_size)[0] < length - ngram_size:  # an occurrence before the n-gram itself
                return ngram_size
        return 0

    def _occurrences(self, ids: torch.Tensor) -> Callable[[int], list[int]]:
        """`ngram_occurrences` of `ids` ``(1, L)`` by n-gram size, remembered for the last sequence searched."""
        key = (ids.dtype, ids.detach().cpu().numpy().tobytes())
        if self._last_search is None or self._last_search[0] != key:
            self._last_search = (key, {})
        found = self._last_search[1]

        def occurrences(ngram_size: int) -> list[int]:
            if ngram_size not in found:
                found[ngram_size] = ngram_occurrences(ids, ngram_size)
            return found[ngram_size]

        return occurrences
