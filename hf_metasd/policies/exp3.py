"""EXP3: exponential weights for adversarial bandits (Auer et al., 2002)."""

from __future__ import annotations

import dataclasses
import math

from .._validation import check_real
from .base import Policy, PolicySettings, setting
from .registry import register_policy

__all__ = ["EXP3", "EXP3Settings"]


@dataclasses.dataclass(frozen=True)
class EXP3Settings(PolicySettings):
    """Settings of `EXP3`."""

    gamma: float = setting(
        0.1,
        "uniform-exploration share and learning rate in (0, 1]; larger explores more",
        check_real,
        low=0.0,
        high=1.0,
        low_open=True,
        hint="Use 0.1, or sqrt(K ln K / ((e - 1) T)) for T rounds.",
    )


@register_policy
class EXP3(Policy):
    r"""EXP3 (exponential-weight algorithm for exploration and exploitation).

    Each round draws drafter *i* with probability

    .. math:: p_i = (1 - \gamma) \frac{w_i}{\sum_j w_j} + \frac{\gamma}{K}

    and, after observing reward :math:`r \in [0, 1]` for the drafter *i* that drafted, updates only its weight with
    the importance-weighted estimate :math:`\hat r_i = r / p_i`:

    .. math:: \ln w_i \leftarrow \ln w_i + \gamma \, \hat r_i / K

    where :math:`K` is the number of drafters and :math:`w_i` starts at 1. Weights are kept as :math:`\ln w_i` and
    normalised with the log-sum-exp trick, so long runs never overflow. :math:`p_i` in the update is the
    probability with which *i* was drawn (weights do not change between `select` and `update`). Rewards must lie in
    ``[0, 1]`` (values within 1e-6 outside are clipped); EXP3 makes no stationarity assumption, which suits drafters
    whose quality drifts with the prompt. It keeps no mean reward per drafter, so `set_prior` refuses it.

    Args:
        gamma: :math:`\gamma \in (0, 1]`, both the uniform-exploration share and the learning rate. Larger explores
            more (``1`` is uniform random and learns nothing useful); smaller exploits sooner but adapts slower.
            Auer et al.'s tuning is :math:`\min(1, \sqrt{K \ln K / ((e - 1) T)})` for a horizon of *T* rounds.
        seed: seed of the random generator that draws the drafter.

    Example:
        >>> from hf_metasd.policies import EXP3
        >>> policy = EXP3(gamma=0.5, seed=0)
        >>> policy.reset(num_arms=2)
        >>> policy.probabilities()
        [0.5, 0.5]
        >>> policy.update(0, 1.0)       # r_hat = 1 / 0.5 = 2, ln w_0 += 0.5 * 2 / 2 = 0.5
        >>> [round(p, 4) for p in policy.probabilities()]  # 0.5 * e^0.5 / (e^0.5 + 1) + 0.25
        [0.5612, 0.4388]
    """

    name = "exp3"
    settings_class = EXP3Settings
    max_reward = 1.0
    arm_state = {"log_weights": float}
    log_weights: list[float]

    def __init__(self, gamma: float = 0.1, *, seed: int | None = None) -> None:
        self._configure(seed, gamma=gamma)

    def probabilities(self) -> list[float]:
        """:math:`p_i` for every drafter: the mixture of the normalised weights and the uniform distribution."""
        self._check_ready()
        top = max(self.log_weights)
        ws = [math.exp(lw - top) for lw in self.log_weights]
        total = sum(ws)
        k = self.num_arms
        return [(1.0 - self.gamma) * w / total + self.gamma / k for w in ws]

    def select(self) -> int:
        self._check_ready()
        return self._sample(self.probabilities())

    def _observe(self, arm: int, reward: float) -> None:
        p = self.probabilities()[arm]  # the probability `select` drew `arm` with: weights change only here
        super()._observe(arm, reward)
        self.log_weights[arm] += self.gamma * (reward / p) / self.num_arms
