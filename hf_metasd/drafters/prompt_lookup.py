"""Prompt-lookup drafter: model-free n-gram matching over the prompt and the text generated so far.

The search is transformers' `PromptLookupCandidateGenerator.get_candidates`, written as a pure function
(`prompt_lookup_candidates`) so that it can be tested on hand-made sequences: for ``n`` from `max_matching_ngram_size`
down to 1, take the last ``n`` tokens, find their occurrences in the sequence left to right, and propose the (up to
`num_output_tokens`) tokens that followed the first occurrence that has a non-empty continuation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from .._validation import check_int
from . import register_drafter_kind
from .base import Drafter, target_vocab_size

if TYPE_CHECKING:
    from ..pool.config import DrafterSpec

__all__ = ["PromptLookupDrafter", "forbidden_tokens", "logits_processor_filter", "prompt_lookup_candidates"]

#: Longest n-gram a pool file may ask prompt lookup to match (each draft tries every size down to 1).
MAX_NGRAM_SIZE = 64


def prompt_lookup_candidates(
    input_ids: torch.Tensor,
    num_output_tokens: int,
    max_matching_ngram_size: int = 2,
    *,
    is_allowed: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
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
            chosen = ids[0, start:end]
            if is_allowed is not None:
                allowed = is_allowed(ids, chosen)
                first_bad = (~allowed).nonzero()
                if first_bad.numel():
                    chosen = chosen[: int(first_bad[0, 0])]
                if chosen.numel() == 0:
                    continue  # transformers: no valid token here -> look for another match
            return chosen
    return ids[0, :0]


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


def logits_processor_filter(
    logits_processor: Any, width: int | None
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
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


@register_drafter_kind
class PromptLookupDrafter(Drafter):
    """Model-free drafter that copies continuations of n-grams found earlier in the sequence.

    Useful when the output repeats its input (summaries, code edits, RAG answers). It has no logits
    (``returns_logits = False``): BD then scores it as a one-hot drafter, and speculative sampling falls back to
    transformers' token matching, which stays lossless. It costs no forward pass, so it has no catch-up cost either.

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
    returns_logits = False
    replayable = True

    def __init__(
        self, max_matching_ngram_size: int = 2, num_output_tokens: int | None = None, *, name: str | None = None
    ) -> None:
        check_int("max_matching_ngram_size", max_matching_ngram_size, low=1, hint="Use e.g. 2.")
        if num_output_tokens is not None:
            check_int("num_output_tokens", num_output_tokens, low=1, hint="Use e.g. 10.")
        super().__init__(name)
        self.max_matching_ngram_size = max_matching_ngram_size
        self.num_output_tokens = num_output_tokens
        self._logits_width: int | None = None

    def spawn(self, target: Any = None) -> PromptLookupDrafter:
        """The call's copy; it keeps the target's logits width to apply its logits processors to candidates."""
        clone = super().spawn(target)
        clone._logits_width = None if target is None else target_vocab_size(target)
        return clone

    def config(self) -> dict[str, Any]:
        return {"max_matching_ngram_size": self.max_matching_ngram_size, "num_output_tokens": self.num_output_tokens}

    @classmethod
    def validate_spec(cls, spec: DrafterSpec, where: str) -> None:
        """The upper bounds of a pool file (the constructor checks the rest): ``max_matching_ngram_size`` at most
        `MAX_NGRAM_SIZE` (64), ``num_output_tokens`` at most `MAX_NUM_ASSISTANT_TOKENS` (128)."""
        from ..pool.config import MAX_NUM_ASSISTANT_TOKENS, check_at_most

        check_at_most(
            spec.params.get("max_matching_ngram_size"), f"{where} `params.max_matching_ngram_size`", MAX_NGRAM_SIZE
        )
        check_at_most(
            spec.params.get("num_output_tokens"), f"{where} `params.num_output_tokens`", MAX_NUM_ASSISTANT_TOKENS
        )
        super().validate_spec(spec, where)

    def _allowed_by(self, logits_processor: Any) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
        return logits_processor_filter(logits_processor, self._logits_width)

    def draft(
        self,
        input_ids: torch.LongTensor,
        num_tokens: int,
        *,
        logits_processor: Any = None,
        do_sample: bool = False,
    ) -> tuple[torch.LongTensor, None]:
        if num_tokens < 1:
            return input_ids[:, :0], None
        limit = num_tokens if self.num_output_tokens is None else min(num_tokens, self.num_output_tokens)
        tokens = prompt_lookup_candidates(
            input_ids, limit, self.max_matching_ngram_size, is_allowed=self._allowed_by(logits_processor)
        )
        return tokens.reshape(1, -1).to(input_ids.device), None
