"""Successive halving: explore in phases, drop the worse half, then commit to one drafter."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .._validation import check_int
from .base import Policy, PolicySettings, setting
from .registry import register_policy

__all__ = ["SuccessiveHalving", "SuccessiveHalvingSettings"]


@dataclasses.dataclass(frozen=True)
class SuccessiveHalvingSettings(PolicySettings):
    """Settings of `SuccessiveHalving`."""

    budget: int = setting(
        10,
        "rounds per drafter in the first phase, >= 1; larger explores longer",
        check_int,
        low=1,
        hint="Use 10 (rounds per drafter in the first phase).",
    )


@register_policy
class SuccessiveHalving(Policy):
    r"""Successive halving (Karnin et al., 2013) run as an explore-then-commit policy.

    Schedule. Let :math:`S_0` be all *K* drafters. In phase :math:`k = 0, 1, \dots` every surviving drafter in
    :math:`S_k` drafts :math:`m_k = b \cdot 2^k` consecutive rounds, in pool order (so a phase switches drafter only
    :math:`|S_k| - 1` times and costs about :math:`b K` rounds, since :math:`|S_k| \approx K / 2^k`). At the end of
    the phase the survivors are ranked by their empirical mean reward over *all* their rounds so far,

    .. math:: \bar r_i = \frac{1}{n_i} \sum_{s \le t : i_s = i} r_s,

    and the best :math:`\lceil |S_k| / 2 \rceil` are kept (ties go to the lower index). After
    :math:`\lceil \log_2 K \rceil` phases one drafter is left and the policy commits to it for good: no more
    switches. For *K* = 3 and *b* = 10 that is 10 rounds each of drafters 0, 1, 2, then 20 rounds each of the two
    best, then the winner forever.

    Symbols: :math:`b` the `budget`, :math:`n_i` drafter *i*'s number of rounds, :math:`r_s` the reward of round *s*.

    An `update` for a drafter other than the scheduled one (a caller overriding `select`) is recorded in the means
    but does not advance the schedule. Any finite reward scale works (only the order of the means matters).

    Prior (`set_prior`): the ranking uses :math:`\bar r_i = (S_i + w m_i) / (n_i + w)` for a drafter with prior mean
    :math:`m_i`; the schedule is unchanged (every drafter still drafts its :math:`m_0` rounds in phase 0).

    Args:
        budget: :math:`b \ge 1`, rounds per drafter in the first phase. Larger explores longer (more reliable
            elimination, more rounds spent on bad drafters); smaller commits sooner.
        seed: unused (the schedule is deterministic); accepted for a uniform interface.

    Example:
        >>> from hf_metasd.policies import SuccessiveHalving
        >>> policy = SuccessiveHalving(budget=1)
        >>> policy.reset(num_arms=3)
        >>> picks = []
        >>> for _ in range(7):
        ...     arm = policy.select(); picks.append(arm); policy.update(arm, [0.2, 0.9, 0.5][arm])
        >>> picks          # phase 0: 1 round each; keep {1, 2}; phase 1: 2 rounds each; keep {1}
        [0, 1, 2, 1, 1, 2, 2]
        >>> policy.survivors, policy.select()
        ([1], 1)
    """

    name = "successive_halving"
    settings_class = SuccessiveHalvingSettings
    supports_prior = True

    def __init__(self, budget: int = 10, *, seed: int | None = None) -> None:
        self._configure(seed, budget=budget)
        self.survivors: list[int] = []
        self.phase = 0
        self._cursor = 0  # index into `survivors` of the drafter that drafts now
        self._done_in_phase = 0  # rounds the current drafter has drafted in this phase

    def reset(self, num_arms: int) -> None:
        super().reset(num_arms)
        self.survivors = list(range(num_arms))
        self.phase = 0
        self._cursor = 0
        self._done_in_phase = 0

    def rounds_per_arm(self) -> int:
        """:math:`m_k = b \\cdot 2^k`, the rounds each survivor drafts in the current phase."""
        return self.budget * 2**self.phase

    @property
    def committed(self) -> bool:
        """True once one drafter is left."""
        return len(self.survivors) == 1

    def select(self) -> int:
        self._check_ready()
        return self.survivors[self._cursor]

    def _observe(self, arm: int, reward: float) -> None:
        super()._observe(arm, reward)
        if self.committed or arm != self.survivors[self._cursor]:
            return
        self._done_in_phase += 1
        if self._done_in_phase < self.rounds_per_arm():
            return
        self._done_in_phase = 0
        self._cursor += 1
        if self._cursor == len(self.survivors):
            self._halve()

    def _halve(self) -> None:
        means = self.means()
        ranked = sorted(self.survivors, key=lambda i: (-means[i], i))
        keep = (len(self.survivors) + 1) // 2
        self.survivors = sorted(ranked[:keep])
        self.phase += 1
        self._cursor = 0

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.update(
            survivors=list(self.survivors), phase=self.phase, cursor=self._cursor, done_in_phase=self._done_in_phase
        )
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.survivors = [int(i) for i in state["survivors"]]
        self.phase = int(state["phase"])
        self._cursor = int(state["cursor"])
        self._done_in_phase = int(state["done_in_phase"])
