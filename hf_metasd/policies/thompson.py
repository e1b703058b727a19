"""Beta-Bernoulli Thompson sampling with fractional rewards."""

from __future__ import annotations

from typing import Any

from ._validation import check_real, check_unit_reward
from .base import Policy
from .registry import register_policy

__all__ = ["ThompsonSampling"]


@register_policy
class ThompsonSampling(Policy):
    r"""Thompson sampling with a Beta posterior per drafter.

    Each round samples :math:`\theta_i \sim \mathrm{Beta}(\alpha_i, \beta_i)` for every drafter and picks
    :math:`\arg\max_i \theta_i`. A reward :math:`r \in [0, 1]` for drafter *i* is a fractional Bernoulli
    observation:

    .. math:: \alpha_i \leftarrow \alpha_i + r, \qquad \beta_i \leftarrow \beta_i + (1 - r),

    so :math:`\alpha_i = \alpha_0 + S_i` and :math:`\beta_i = \beta_0 + n_i - S_i` with :math:`S_i` the summed
    rewards and :math:`n_i` the number of rounds of drafter *i* (the posterior is read off `counts` and `sums`; no
    extra state). Fractional rewards (BE, BD) are a standard relaxation: the posterior mean
    :math:`\alpha_i / (\alpha_i + \beta_i)` tracks the mean reward, but the posterior is narrower than the exact one
    when rewards have small variance, so this is a heuristic, not an exact Bayesian update. Rewards must lie in
    ``[0, 1]`` (values within 1e-6 outside are clipped).

    Args:
        prior_alpha: :math:`\alpha_0 > 0`, prior pseudo-successes.
        prior_beta: :math:`\beta_0 > 0`, prior pseudo-failures. Larger :math:`\alpha_0 + \beta_0` means a more
            confident prior, hence less early exploration; ``1, 1`` is the uniform prior.
        seed: seed of the random generator that samples :math:`\theta`.

    Example:
        >>> from hf_metasd.policies import ThompsonSampling
        >>> policy = ThompsonSampling(seed=0)
        >>> policy.reset(num_arms=2)
        >>> for _ in range(20):
        ...     policy.update(0, 0.9); policy.update(1, 0.1)
        >>> policy.posterior()        # (1 + 18, 1 + 2) and (1 + 2, 1 + 18)
        [(19.0, 3.0), (3.0, 19.0)]
        >>> policy.select()
        0
    """

    name = "thompson"

    def __init__(self, prior_alpha: float = 1.0, prior_beta: float = 1.0, *, seed: int | None = None) -> None:
        super().__init__(seed=seed)
        self.prior_alpha = check_real(
            "prior_alpha", prior_alpha, low=0.0, low_open=True, hint="Use 1.0 (a uniform prior with prior_beta=1)."
        )
        self.prior_beta = check_real(
            "prior_beta", prior_beta, low=0.0, low_open=True, hint="Use 1.0 (a uniform prior with prior_alpha=1)."
        )

    def posterior(self) -> list[tuple[float, float]]:
        """:math:`(\\alpha_i, \\beta_i)` for every drafter."""
        self._check_ready()
        return [(self.prior_alpha + s, self.prior_beta + n - s) for s, n in zip(self.sums, self.counts)]

    def select(self) -> int:
        samples = [self._rng.betavariate(a, b) for a, b in self.posterior()]
        return self._argmax(samples)

    def update(self, arm: int, reward: float) -> None:
        self._check_ready()
        super().update(arm, check_unit_reward(self.name, reward))

    def config(self) -> dict[str, Any]:
        return {"prior_alpha": self.prior_alpha, "prior_beta": self.prior_beta, "seed": self.seed}
