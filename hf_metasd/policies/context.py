"""`RoundContext`: what is known about each arm before a round drafts, for a contextual policy.

Plain numbers, no model: the candidate generator computes them (`hf_metasd.round_context`) and a policy whose
`Policy.contextual` is true reads them in `Policy.select_in`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RoundContext"]


@dataclass(frozen=True)
class RoundContext:
    """Per arm (the pool's drafters, then the no-draft arm if the call has one):

    Attributes:
        rates: the expected tokens per second of a round of the arm at this position (``None``: it cannot draft this
            round, it abstained, or nothing is measured yet to rate it).
        lengths: the draft length at that rate (0 for the no-draft arm and an arm without a rate).
        match_lengths: for an arm whose proposal continues a match of the context it scores (corpus drafters), the
            match's length in tokens this round (0: no match); ``None`` for the other arms.

    Example:
        >>> RoundContext(rates=(3.0, None), lengths=(2, 0)).rates[0]
        3.0
    """

    rates: tuple[float | None, ...]
    lengths: tuple[int, ...]
    match_lengths: tuple[int | None, ...] = ()
