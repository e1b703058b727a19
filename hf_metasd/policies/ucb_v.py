"""UCB-V: an upper confidence bound that uses each drafter's reward variance (Audibert, Munos & Szepesvári, 2009)."""

from __future__ import annotations

import dataclasses
import math

from .._validation import check_real
from .base import IndexPolicy, PolicySettings, setting
from .registry import register_policy

__all__ = ["UCBV", "UCBVSettings"]


@dataclasses.dataclass(frozen=True)
class UCBVSettings(PolicySettings):
    """Settings of `UCBV`."""

    zeta: float = setting(
        1.0,
        "exploration scale zeta >= 0 on ln t; larger explores more, 0 is greedy",
        check_real,
        low=0.0,
        hint="Use 1.0.",
    )
    c: float = setting(
        1.0,
        "weight c >= 0 of the range term 3 b zeta ln t / n; larger explores more",
        check_real,
        low=0.0,
        hint="Use 1.0.",
    )
    b: float = setting(
        1.0,
        "reward range b > 0: rewards must lie in [0, b]; larger explores more",
        check_real,
        low=0.0,
        low_open=True,
        hint="Use 1.0 (the range of the built-in rewards).",
    )


@register_policy
class UCBV(IndexPolicy):
    r"""UCB-V: UCB with an empirical-Bernstein bonus.

    Pull every drafter once (in pool order), then at each round pick

    .. math::

        i_t = \arg\max_i \; \bar r_i + \sqrt{\frac{2 V_i \zeta \ln t}{n_i}} + c \, \frac{3 b \zeta \ln t}{n_i}

    Symbols: :math:`\bar r_i` drafter *i*'s mean reward, :math:`V_i = \frac{1}{n_i} \sum_s (r_s - \bar r_i)^2` the
    empirical (biased, :math:`1/n`) variance of its rewards, :math:`n_i` its number of pulls, :math:`t = \sum_j n_j`
    the number of rounds so far, *b* the reward range (rewards must lie in :math:`[0, b]`; within 1e-6 outside is
    clipped). Ties go to the lowest index. The variance comes from running sums of rewards and of squared rewards
    (`sq_sums`), so the policy stays O(K) per round.

    Knobs: larger :math:`\zeta` scales both bonus terms up (more exploration; ``0`` is greedy on the means); larger
    *c* weighs the range term, the one that does not shrink with a small variance, more (more exploration); larger
    *b* declares a wider reward range, which also enlarges the range term (more exploration).

    Why. Rewards in speculative decoding are dense and often nearly constant (a drafter that copies the target scores
    1.0 every round, variance 0). With :math:`V_i \approx 0` the bonus is :math:`3 c b \zeta \ln t / n_i`, which falls
    like :math:`1 / n_i` instead of UCB's :math:`\sqrt{2 \ln t / n_i}`: it is the smaller one once
    :math:`n_i > 4.5 (c b \zeta)^2 \ln t`, and a worse drafter with gap :math:`\Delta` is pulled about
    :math:`3 c b \zeta \ln t / \Delta` times instead of :math:`2 \ln t / \Delta^2`. So, with the defaults, UCB-V
    explores *more* than ``ucb`` (beta = 1) over the first few dozen pulls of a drafter and far less later: on two
    drafters scoring 1.0 and alternately 0.8 / 0.9 it gives the worse one 82 of the first 300 rounds (UCB 80) but
    168 of the first 3000 (UCB 311). Lower *c* to shorten the early phase.

    Prior (`set_prior`): a prior mean :math:`m_i` counts as *w* rewards equal to :math:`m_i`: it adds *w* to
    :math:`n_i` and to *t*, :math:`w m_i` to the reward sum and :math:`w m_i^2` to the sum of squares (so a prior
    alone has variance 0), and the drafter is not pulled first. Prior means must lie in :math:`[0, b]`.

    Args:
        zeta: :math:`\zeta \ge 0`, exploration scale.
        c: :math:`c \ge 0`, weight of the range term.
        b: :math:`b > 0`, reward range.
        seed: unused (deterministic); accepted for a uniform interface.

    Example:
        >>> from hf_metasd.policies import UCBV
        >>> policy = UCBV()
        >>> policy.reset(num_arms=2)
        >>> for arm, r in [(0, 1.0), (1, 0.5), (0, 0.0), (1, 0.5)]:
        ...     policy.update(arm, r)
        >>> policy.means(), policy.variances()     # same means, same pulls; only drafter 0 varies
        ([0.5, 0.5], [0.25, 0.0])
        >>> # t = 4: 0.5 + sqrt(2 * 0.25 * ln 4 / 2) + 3 ln 4 / 2 and 0.5 + 0 + 3 ln 4 / 2
        >>> [round(s, 4) for s in policy.scores()], policy.select()
        ([3.1681, 2.5794], 0)
    """

    name = "ucb_v"
    learns_side_observations = True
    settings_class = UCBVSettings
    supports_prior = True
    arm_state = {"sq_sums": float}
    sq_sums: list[float]

    def __init__(self, zeta: float = 1.0, c: float = 1.0, b: float = 1.0, *, seed: int | None = None) -> None:
        self._configure(seed, zeta=zeta, c=c, b=b)

    def reward_bound(self) -> float:
        return self.b

    def _observe(self, arm: int, reward: float) -> None:
        super()._observe(arm, reward)
        self.sq_sums[arm] += reward * reward

    def variances(self) -> list[float]:
        r""":math:`V_i` for every drafter, prior included (0.0 for drafters with no observation)."""
        self._check_ready()
        out = []
        for q, pq, n, mean in zip(self.sq_sums, self.prior_sq_sums, self.effective_counts(), self.means()):
            out.append(max(0.0, (q + pq) / n - mean * mean) if n else 0.0)  # max: round-off below 0
        return out

    def scores(self) -> list[float]:
        """The UCB-V index of every drafter (``inf`` for drafters never pulled and without a prior)."""
        self._check_ready()
        e = self.zeta * self._log_rounds()
        return [
            mean + math.sqrt(2.0 * var * e / n) + self.c * 3.0 * self.b * e / n if n else math.inf
            for mean, var, n in zip(self.means(), self.variances(), self.effective_counts())
        ]
