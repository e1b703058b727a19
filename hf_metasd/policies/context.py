"""`RoundContext`: what a contextual policy may know about a round before it selects the round's arm.

The candidate generator builds one per round, before `Policy.select`, only for a policy that `uses_context`, and
hands it to `Policy.set_context`. It holds cheap features only (nothing is drafted to compute them): for every arm
whose drafter is model-free and matches the sequence against a source (prompt lookup, a corpus drafter: the drafters
with a ``match_length(input_ids)`` method), the length of the context suffix its draft would continue right now.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

__all__ = ["RoundContext"]


@dataclasses.dataclass(frozen=True)
class RoundContext:
    """The features of one round, known before its arm is selected.

    Args:
        match_lengths: one entry per arm: for an arm whose drafter matches the sequence (prompt lookup, corpus), the
            length in tokens of the context suffix its draft would continue (0: it finds no match and would
            abstain); ``None`` for the other arms (model drafters, the no-draft arm).

    Example:
        >>> context = RoundContext((None, 7, 2, None))    # a model drafter, a corpus, prompt lookup, no draft
        >>> context.match_length                          # the best model-free match
        7
        >>> RoundContext((None, None)).match_length       # no model-free arm: no match
        0
        >>> RoundContext((None, -1))
        Traceback (most recent call last):
        ...
        ValueError: `match_lengths[1]` must be None or an int >= 0, but is -1. Give the match's length in tokens.
    """

    match_lengths: Sequence[int | None]

    def __post_init__(self) -> None:
        if isinstance(self.match_lengths, (str, bytes)) or not isinstance(self.match_lengths, Sequence):
            raise TypeError(
                f"`match_lengths` must be a sequence with one entry per arm, but is {type(self.match_lengths).__name__}"
                f" {self.match_lengths!r}. Pass e.g. (None, 7, 0)."
            )
        for arm, length in enumerate(self.match_lengths):
            if length is not None and (not isinstance(length, int) or isinstance(length, bool) or length < 0):
                raise ValueError(
                    f"`match_lengths[{arm}]` must be None or an int >= 0, but is {length!r}. "
                    "Give the match's length in tokens."
                )
        object.__setattr__(self, "match_lengths", tuple(self.match_lengths))

    @property
    def match_length(self) -> int:
        """The longest of `match_lengths` (0 when no arm matches, or no arm is model-free)."""
        return max((m for m in self.match_lengths if m is not None), default=0)
