"""Discounted UCB: UCB on exponentially discounted counts, for drafters whose quality drifts."""

from __future__ import annotations

import dataclasses
import math

from .._validation import check_real
from .base import PolicySettings, _log_or_zero, setting
from .registry import register_policy
from .ucb import UCB

__all__ = ["DiscountedUCB", "DiscountedUCBSettings"]


@dataclasses.dataclass(frozen=True)
class DiscountedUCBSettings(PolicySettings):
    """Settings of `DiscountedUCB`."""

    gamma: float = setting(
        0.998,
        "discount in (0, 1]; smaller forgets faster (more re-exploration)",
        check_real,
        low=0.0,
        high=1.0,
        low_open=True,
        hint="Use 0.998 (an effective memory of ~500 rounds).",
    )
    beta: float = setting(
        0.25, "exploration weight beta >= 0; larger explores more, 0 is greedy", check_real, low=0.0, hint="Use 0.25."
    )


@register_policy
class DiscountedUCB(UCB):
    r"""Discounted UCB (D-UCB, Garivier & Moulines, 2011), with MetaSD-UCB's bonus.

    After every round, all drafters' statistics fade by :math:`\gamma` and the drafter *a* that drafted adds its
    reward *r*:

    .. math:: N_j \leftarrow \gamma N_j + \mathbb{1}[j = a], \qquad S_j \leftarrow \gamma S_j + r\,\mathbb{1}[j = a]

    Every drafter is pulled once first (in pool order); then each round picks

    .. math:: i_t = \arg\max_i \; \frac{S_i}{N_i} + \beta \sqrt{2 \ln n / N_i}, \qquad n = \sum_j N_j

    Symbols: :math:`N_i` and :math:`S_i` are the discounted pull count and reward sum of drafter *i*, *n* the
    discounted number of rounds (it tends to :math:`1 / (1 - \gamma)`, the effective memory). A drafter not pulled
    for a while sees :math:`N_i` shrink and its bonus grow, so it is tried again: that is what lets the policy notice
    that a drafter became better. With :math:`\gamma = 1` this is exactly `ucb`. Ties go to the lowest index.
    Rewards must lie in ``[0, 1]``.

    Prior (`set_prior`): drafter *i*'s prior mean :math:`m_i` counts as *w* observations made before the first round,
    so it fades like them: after *t* rounds it adds :math:`w \gamma^t` to :math:`N_i` and :math:`w m_i \gamma^t` to
    :math:`S_i` (and to *n*). With :math:`\gamma = 1` that is `ucb`'s prior.

    Args:
        gamma: discount :math:`\gamma \in (0, 1]`. Smaller forgets faster (more re-exploration, quicker adaptation to
            a change, noisier means); ``1`` never forgets.
        beta: exploration weight :math:`\beta \ge 0`. Larger explores more; ``0`` is greedy on the discounted means.
        seed: unused (deterministic); accepted for a uniform interface.

    Defaults. :math:`\gamma = 0.998` remembers about 500 rounds. Because :math:`\ln n` stays below
    :math:`\ln(1 / (1 - \gamma))`, the bonus never shrinks the way UCB's does, so :math:`\beta = 1` keeps paying for
    exploration forever: in `hf_metasd.benchmark.simulate` (stationary rates 0.8 / 0.6 / 0.4, 5 drafted tokens, noise-free BD
    reward, 8000 tokens, 5 seeds) :math:`\beta = 1` drafted 26% of the rounds with worse drafters, :math:`\beta = 0.25`
    4%. Hence :math:`\beta = 0.25`; rerun ``recipes/studies/simulate_regret.py`` to compare on your own rates.

    Example:
        >>> from hf_metasd.policies import DiscountedUCB
        >>> policy = DiscountedUCB(gamma=0.5, beta=1.0)
        >>> policy.reset(num_arms=2)
        >>> policy.update(0, 1.0); policy.update(1, 0.0)
        >>> policy.discounted_counts, policy.discounted_sums
        ([0.5, 1.0], [0.5, 0.0])
        >>> [round(s, 4) for s in policy.scores()]   # 1 + sqrt(2 ln 1.5 / 0.5), 0 + sqrt(2 ln 1.5 / 1)
        [2.2735, 0.9005]
    """

    name = "discounted_ucb"
    learns_side_observations = False  # its discount / window is about pulls
    settings_class = DiscountedUCBSettings
    arm_state = {"discounted_counts": float, "discounted_sums": float}
    discounted_counts: list[float]
    discounted_sums: list[float]

    def __init__(self, gamma: float = 0.998, beta: float = 0.25, *, seed: int | None = None) -> None:
        self._configure(seed, gamma=gamma, beta=beta)

    def _observe(self, arm: int, reward: float) -> None:
        super()._observe(arm, reward)
        g = self.gamma
        self.discounted_counts = [g * n for n in self.discounted_counts]
        self.discounted_sums = [g * s for s in self.discounted_sums]
        self.discounted_counts[arm] += 1.0
        self.discounted_sums[arm] += reward

    def scores(self) -> list[float]:
        """The D-UCB index of every drafter (``inf`` where the discounted count, prior included, is 0)."""
        self._check_ready()
        counts, sums = list(self.discounted_counts), list(self.discounted_sums)
        if self.prior_means is not None:
            fade = self.gamma**self.t
            counts = [c + p * fade for c, p in zip(counts, self.prior_counts)]
            sums = [s + p * fade for s, p in zip(sums, self.prior_sums)]
        log_n = _log_or_zero(sum(counts))
        return [s / c + self.beta * math.sqrt(2.0 * log_n / c) if c > 0.0 else math.inf for s, c in zip(sums, counts)]
