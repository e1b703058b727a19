r"""Precedence: the serving engines' fixed rule between a copier and a model drafter.

Serving engines that pair a copier with a model drafter choose between them by a fixed precedence, not by learning:
TensorRT-LLM lets its suffix-automaton drafter override EAGLE when the suffix match is at least 4 tokens long. This
policy is that rule over a pool, so that a benchmark can compare a learning policy with it on the same drafters:

.. math::

    a_t = \begin{cases} c & \text{if } m_c(t) \ge M \\ d & \text{otherwise,} \end{cases}

where :math:`c` is the copier's arm (a drafter that scores its matches: a corpus drafter, which searches the context
too with ``context_lookup``), :math:`m_c(t)` the length of the context suffix its proposal continues this round (from
the round's context; 0 when it abstains), :math:`d` the model drafter's arm and :math:`M` the threshold
(`min_match`). It learns nothing; both arms draft the lengths the call's draft-length rule chooses for them.

Args:
    copier: the copier's pool index.
    model: the model drafter's pool index.
    min_match: :math:`M \ge 1`; a larger one gives the model drafter more rounds.
    seed: unused (deterministic); accepted for a uniform interface.

Example:
    >>> from hf_metasd.policies import get_policy
    >>> from hf_metasd.policies.context import RoundContext
    >>> policy = get_policy("precedence", copier=1, model=0)
    >>> policy.reset(num_arms=3)
    >>> rates, lengths = (6.0, 5.0, 4.0), (3, 3, 0)
    >>> policy.select_in(RoundContext(rates, lengths, match_lengths=(None, 2, None)))   # a 2-token match: the model
    0
    >>> policy.select_in(RoundContext(rates, lengths, match_lengths=(None, 9, None)))   # a 9-token one: the copier
    1
"""

from __future__ import annotations

import dataclasses

from .._validation import check_int
from .base import Policy, PolicySettings, setting
from .context import RoundContext
from .registry import register_policy

__all__ = ["Precedence", "PrecedenceSettings"]


@dataclasses.dataclass(frozen=True)
class PrecedenceSettings(PolicySettings):
    """Settings of `Precedence`."""

    copier: int = setting(0, "pool index of the copier (a corpus drafter)", check_int, low=0, hint="Pass e.g. 1.")
    model: int = setting(1, "pool index of the model drafter", check_int, low=0, hint="Pass e.g. 0.")
    min_match: int = setting(
        4, "shortest match (tokens) for which the copier drafts", check_int, low=1, hint="Use e.g. 4."
    )


@register_policy
class Precedence(Policy):
    """The copier when its match is at least `min_match` tokens, else the model drafter (see the module
    docstring)."""

    name = "precedence"
    contextual = True
    uses_rewards = False
    settings_class = PrecedenceSettings

    def __init__(self, copier: int = 0, model: int = 1, min_match: int = 4, *, seed: int | None = None) -> None:
        self._configure(seed, copier=copier, model=model, min_match=min_match)

    def reset(self, num_arms: int) -> None:
        super().reset(num_arms)
        for key in ("copier", "model"):
            if getattr(self, key) >= num_arms:
                self.num_arms = None  # refuse to be half-ready
                raise ValueError(
                    f"`{key}` must be < the number of arms ({num_arms}), but is {getattr(self, key)}. "
                    f"Pass a pool index in [0, {num_arms})."
                )

    def select(self) -> int:
        """Without a round's context: the model drafter."""
        self._check_ready()
        return self.model

    def select_in(self, context: RoundContext) -> int:
        """The copier when its match this round is at least `min_match` tokens, else the model drafter."""
        self._check_ready()
        matches = context.match_lengths
        match = matches[self.copier] if self.copier < len(matches) else None
        return self.copier if match is not None and match >= self.min_match else self.model

    def fallback(self, exclude: set[int]) -> int | None:
        """The other of the two when one abstains; ``None`` (a plain step) when both did."""
        self._check_ready()
        for arm in (self.model, self.copier):
            if arm not in exclude:
                return arm
        return None
