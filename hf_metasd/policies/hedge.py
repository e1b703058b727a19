"""Hedge: exponential weights on every drafter's counterfactual reward (full information)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from .._validation import check_real
from .base import Policy, PolicySettings, setting
from .registry import register_policy

__all__ = ["Hedge", "HedgeSettings"]


@dataclasses.dataclass(frozen=True)
class HedgeSettings(PolicySettings):
    """Settings of `Hedge`."""

    eta: float = setting(
        0.5,
        "learning rate eta > 0; larger exploits sooner, smaller explores longer",
        check_real,
        low=0.0,
        low_open=True,
        hint="Use 0.5, or sqrt(8 ln K / T) for T rounds.",
    )


@register_policy
class Hedge(Policy):
    r"""Hedge (Freund & Schapire, 1997): a full-information policy.

    In full-information mode the caller reports, each round, the reward every drafter *would* have earned (for BD,
    each drafter's :math:`1 - \mathrm{TV}` against the target on the verified positions) through
    ``update_all({arm: reward, ...})``. Hedge then draws drafter *i* with probability

    .. math:: p_i = \frac{\exp(\eta \hat G_i)}{\sum_j \exp(\eta \hat G_j)}, \qquad \hat G_i = T \cdot \frac{G_i}{m_i}

    where :math:`G_i` is the sum of the :math:`m_i` rewards observed for drafter *i*, and :math:`T = \max_j m_j` the
    number of rounds observed. When every drafter is observed every round (:math:`m_i = T`), :math:`\hat G_i = G_i`
    is the cumulative counterfactual reward and this is textbook Hedge. `select` **samples** from *p* (with the
    policy's seeded generator); `probabilities()` exposes *p*. A drafter never observed is picked first (lowest
    index).

    Partial observations. ``update(arm, r)`` (the reward of the drafter that drafted, what bandit policies get) is
    also an observation of `arm`. If ``update_all`` follows in the same round (before the next `select`), its values
    supersede the partial one, so an arm reported through both is counted once. Rounds with only ``update`` add to
    :math:`G_{arm}` and :math:`m_{arm}` alone; scaling the mean by *T* keeps drafters observed less often comparable
    (with bandit feedback only, this is Boltzmann exploration on the mean rewards with inverse temperature
    :math:`\eta T`). That mode has no forced exploration: a drafter unlucky in its first rounds may never be drawn
    again, so with bandit feedback only prefer `exp3` or `ucb`.

    Rewards, from `update` and `update_all`, must lie in ``[0, 1]`` (the range `eta`'s tuning assumes; values within
    1e-6 outside are clipped). Hedge weighs cumulative rewards, not mean estimates, so `set_prior` refuses it.

    Args:
        eta: learning rate :math:`\eta > 0`. Larger concentrates on the leader faster (less exploration);
            smaller spreads the draws. The regret-optimal choice for *T* rounds and *K* drafters with rewards in
            ``[0, 1]`` is :math:`\sqrt{8 \ln K / T}`.
        seed: seed of the random generator that draws the drafter.

    Example:
        >>> from hf_metasd.policies import Hedge
        >>> policy = Hedge(eta=1.0, seed=0)
        >>> policy.reset(num_arms=2)
        >>> policy.update_all({0: 0.9, 1: 0.4}); policy.update_all({0: 0.7, 1: 0.2})
        >>> policy.cumulative_rewards()      # G = (1.6, 0.6)
        [1.6, 0.6]
        >>> [round(p, 4) for p in policy.probabilities()]   # e^1.6 / (e^1.6 + e^0.6) = 1 / (1 + e^-1)
        [0.7311, 0.2689]
    """

    name = "hedge"
    full_information = True
    settings_class = HedgeSettings
    max_reward = 1.0
    arm_state = {"observed_sums": float, "observed_counts": int}
    observed_sums: list[float]
    observed_counts: list[int]

    def __init__(self, eta: float = 0.5, *, seed: int | None = None) -> None:
        self._configure(seed, eta=eta)
        self._pending: tuple[int, float] | None = None  # partial observation of this round, applied at `select`
        self._covered: set[int] = set()  # arms reported by `update_all` since the last `select`

    def reset(self, num_arms: int) -> None:
        super().reset(num_arms)
        self._pending = None
        self._covered = set()

    # ------------------------------------------------------------------ observations
    def _observe(self, arm: int, reward: float) -> None:
        super()._observe(arm, reward)  # counts the pull
        if arm not in self._covered:
            self._pending = (arm, reward)

    def update_all(self, rewards: Mapping[int, float]) -> None:
        self._check_ready()
        clean: dict[int, float] = {}
        for arm, reward in rewards.items():
            arm = int(arm)
            if not 0 <= arm < self.num_arms:
                raise IndexError(
                    f"`rewards` keys must be arms in [0, {self.num_arms}), but has {arm}. Report one reward per drafter."
                )
            clean[arm] = self._check_reward(reward, name=f"rewards[{arm}]")
        if self._pending is not None and self._pending[0] not in clean:
            self._apply(*self._pending)
        self._pending = None
        for arm, r in clean.items():
            self._apply(arm, r)
        self._covered.update(clean)

    def _apply(self, arm: int, reward: float) -> None:
        self.observed_sums[arm] += reward
        self.observed_counts[arm] += 1

    def _flush(self) -> None:
        if self._pending is not None:
            self._apply(*self._pending)
            self._pending = None
        self._covered = set()

    # ------------------------------------------------------------------ choice
    def cumulative_rewards(self) -> list[float]:
        r""":math:`\hat G_i = T \, G_i / m_i` for every drafter (0.0 for drafters never observed)."""
        self._check_ready()
        sums, counts = list(self.observed_sums), list(self.observed_counts)
        if self._pending is not None:
            arm, r = self._pending
            sums[arm] += r
            counts[arm] += 1
        horizon = max(counts)
        return [horizon * s / m if m else 0.0 for s, m in zip(sums, counts)]

    def probabilities(self) -> list[float]:
        """:math:`p_i` for every drafter (softmax of :math:`\\eta \\hat G`, computed stably)."""
        logits = [self.eta * g for g in self.cumulative_rewards()]
        top = max(logits)
        ws = [math.exp(x - top) for x in logits]
        total = sum(ws)
        return [w / total for w in ws]

    def select(self) -> int:
        self._check_ready()
        self._flush()
        for arm, m in enumerate(self.observed_counts):
            if m == 0:
                return arm
        return self._sample(self.probabilities())

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["pending"] = list(self._pending) if self._pending is not None else None
        state["covered"] = sorted(self._covered)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        pending = state["pending"]
        self._pending = (int(pending[0]), float(pending[1])) if pending is not None else None
        self._covered = {int(a) for a in state["covered"]}
