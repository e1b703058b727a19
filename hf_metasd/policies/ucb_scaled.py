"""Scaled UCB: UCB whose bonus is measured in the rewards' own spread, not in their range."""

from __future__ import annotations

import dataclasses
import math

from .._validation import check_real
from .base import IndexPolicy, PolicySettings, setting
from .registry import register_policy

__all__ = ["ScaledUCB", "ScaledUCBSettings"]


@dataclasses.dataclass(frozen=True)
class ScaledUCBSettings(PolicySettings):
    """Settings of `ScaledUCB`."""

    beta: float = setting(
        1.0,
        "exploration weight beta >= 0, in standard deviations of the rewards; larger explores more, 0 is greedy",
        check_real,
        low=0.0,
        hint="Use 1.0.",
    )


@register_policy
class ScaledUCB(IndexPolicy):
    r"""UCB with the bonus in units of the rewards' observed standard deviation.

    Pull every drafter once (in pool order), then at each round pick

    .. math::

        i_t = \arg\max_i \; \bar r_i + \beta \, \hat\sigma_i \sqrt{\frac{2 \ln t}{n_i}},
        \qquad
        \hat\sigma_i^2 = \frac{n_i V_i + \bar\sigma^2}{n_i + 1},
        \qquad
        \bar\sigma^2 = \max_{u \le t} \frac{1}{T_u} \sum_{(j, s) \text{ by } u} (r_{j,s} - \bar r_u)^2

    Symbols: :math:`\bar r_i`, :math:`n_i` and :math:`V_i = \frac{1}{n_i} \sum_s (r_{i,s} - \bar r_i)^2` drafter
    *i*'s mean reward, pulls and empirical variance; :math:`t` the rounds so far (pulls; side observations add to :math:`n_i` only); :math:`\bar\sigma^2`
    the widest spread of rewards seen so far: at each round *u*, the variance of *every* reward observed by then
    around their grand mean :math:`\bar r_u` (:math:`T_u` rewards), and the largest of these. So :math:`\hat\sigma_i^2` is drafter *i*'s variance shrunk towards the spread of all rewards by one
    pseudo-observation: after one pull a drafter's bonus is sized by how much rewards differ at all, after many by
    how much its own rewards vary. Keeping the widest spread (rather than the current one) keeps every bonus growing
    like :math:`\sqrt{\ln t}` once two rewards have differed, so no drafter is shut out for good: a drafter whose
    first round missed is tried again, later than UCB would (the price of settling fast, see below). Ties go to the
    lowest index. O(K) per round (running sums of rewards and of
    squared rewards).

    Knob: larger :math:`\beta` explores more; ``0`` is greedy on the means. The index does not depend on the units
    of the reward (scale every reward by *a* > 0 and every index scales by *a*), so no reward range enters: it suits
    the cost-aware `speed` reward, whose values are small and close together (a useless drafter scores about
    ``0.15`` against the no-draft arm's ``0.25``), where UCB's :math:`\sqrt{2 \ln t / n_i}` (sized for rewards
    spread over ``[0, 1]``) keeps exploring through a whole answer.

    Why. A round is cheap to observe but an answer is only 20-80 rounds: exploration has to stop within a few pulls
    when drafters differ by more than their rewards' noise. A drafter whose rewards barely vary has
    :math:`\hat\sigma_i^2 \approx \bar\sigma^2 / (n_i + 1)`, so its bonus falls like
    :math:`\bar\sigma \sqrt{2 \ln t} / n_i` rather than UCB's :math:`1 / \sqrt{n_i}`; a drafter whose rewards vary
    widely (one that sometimes hits) keeps a bonus sized by its own :math:`V_i`. The price: a good drafter whose first
    rounds all miss looks like a useless one until :math:`\ln t` has grown. Measured on the embedded pool over
    development prompts (`python recipes/benchmarks/compare_policies.py`, 14 prompts, one run): without the pool's priors
    1.25x plain, as UCB at beta = 1 (1.26x); with them 1.36x, as the pool's tuned UCB (1.36x). On a pool of three
    untrained drafters (`hf-metasd bench --mixed --untrained 3`, one run each): 0.95x plain, UCB at beta = 1
    0.65x (before replayed rounds); 0.93x and 0.57x, then 0.94x and 0.59x; with learned priors
    (`hf_metasd.reward_memory`: only the first call explores) 0.96x and 0.56x in the last run
    (`docs/benchmarks_history.md`).
    Pools built with `recipes/pools/build_default_pool.py` ship priors; a `Policy` instance carried over calls (the
    serving pattern) learns once for every call.

    Prior (`set_prior`): a prior mean :math:`m_i` counts as *w* rewards equal to :math:`m_i`: it adds *w* to
    :math:`n_i` and to *t* (and to *T*), :math:`w m_i` to the reward sums and :math:`w m_i^2` to the sums of squares,
    and the drafter is not pulled first.

    Args:
        beta: :math:`\beta \ge 0`, exploration weight in standard deviations.
        seed: unused (deterministic); accepted for a uniform interface.

    Example:
        >>> from hf_metasd.policies import ScaledUCB
        >>> policy = ScaledUCB()
        >>> policy.reset(num_arms=3)
        >>> for arm, r in [(0, 0.15), (1, 0.15), (2, 0.25), (2, 0.25)]:
        ...     policy.update(arm, r)
        >>> # all four rewards: mean 0.2, variance 0.0025; drafter 2's own variance is 0
        >>> [round(v, 6) for v in policy.variances()]
        [0.00125, 0.00125, 0.000833]
        >>> # t = 4: 0.15 + sqrt(0.00125) sqrt(2 ln 4 / 1) and 0.25 + sqrt(0.000833) sqrt(2 ln 4 / 2)
        >>> [round(s, 4) for s in policy.scores()], policy.select()
        ([0.2089, 0.2089, 0.2840], 2)
    """

    name = "ucb_scaled"
    learns_side_observations = True
    settings_class = ScaledUCBSettings
    supports_prior = True
    max_reward = None
    arm_state = {"sq_sums": float}
    sq_sums: list[float]
    widest_spread: float = 0.0

    def __init__(self, beta: float = 1.0, *, seed: int | None = None) -> None:
        self._configure(seed, beta=beta)

    def reset(self, num_arms: int) -> None:
        super().reset(num_arms)
        self.widest_spread = 0.0

    def _observe(self, arm: int, reward: float) -> None:
        super()._observe(arm, reward)
        self.sq_sums[arm] += reward * reward
        self.widest_spread = max(self.widest_spread, self.current_spread())

    def current_spread(self) -> float:
        """The variance of every reward so far (prior included) around their grand mean; 0.0 if none."""
        self._check_ready()
        total = sum(self.effective_counts())
        if not total:
            return 0.0
        mean = (sum(self.sums) + sum(self.prior_sums)) / total
        return max(0.0, (sum(self.sq_sums) + sum(self.prior_sq_sums)) / total - mean * mean)

    def spread(self) -> float:
        r""":math:`\bar\sigma^2`: the widest `current_spread` seen after any update (and the current one, which
        covers a prior set after the last update)."""
        return max(self.widest_spread, self.current_spread())

    def state_dict(self) -> dict:
        return {**super().state_dict(), "widest_spread": self.widest_spread}

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        self.widest_spread = float(state.get("widest_spread", 0.0))

    def variances(self) -> list[float]:
        r""":math:`\hat\sigma_i^2` for every drafter: its own variance shrunk towards `spread` (that alone if unpulled)."""
        self._check_ready()
        spread = self.spread()
        out = []
        for q, pq, n, mean in zip(self.sq_sums, self.prior_sq_sums, self.effective_counts(), self.means()):
            own = max(0.0, (q + pq) - n * mean * mean) if n else 0.0  # n V_i; max: round-off below 0
            out.append((own + spread) / (n + 1))
        return out

    def scores(self) -> list[float]:
        """The index of every drafter (``inf`` for drafters never pulled and without a prior)."""
        self._check_ready()
        e = 2.0 * self._log_rounds()
        return [
            mean + self.beta * math.sqrt(var * e / n) if n else math.inf
            for mean, var, n in zip(self.means(), self.variances(), self.effective_counts())
        ]
