"""Beta-Bernoulli Thompson sampling with fractional rewards."""

from __future__ import annotations

import dataclasses

from .._validation import check_real
from .base import Policy, PolicySettings, setting
from .registry import register_policy

__all__ = ["ThompsonSampling", "ThompsonSamplingSettings"]


@dataclasses.dataclass(frozen=True)
class ThompsonSamplingSettings(PolicySettings):
    """Settings of `ThompsonSampling`."""

    prior_alpha: float = setting(
        1.0,
        "Beta prior pseudo-successes alpha_0 > 0 (shared by every drafter)",
        check_real,
        low=0.0,
        low_open=True,
        hint="Use 1.0 (a uniform prior with prior_beta=1).",
    )
    prior_beta: float = setting(
        1.0,
        "Beta prior pseudo-failures beta_0 > 0; larger alpha_0 + beta_0 explores less early on",
        check_real,
        low=0.0,
        low_open=True,
        hint="Use 1.0 (a uniform prior with prior_alpha=1).",
    )


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

    Per-drafter priors (`set_prior`) are Beta pseudo-counts on top of :math:`(\alpha_0, \beta_0)`: a prior mean
    :math:`m_i` with weight *w* adds :math:`w m_i` to :math:`\alpha_i` and :math:`w (1 - m_i)` to
    :math:`\beta_i`.

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
    learns_side_observations = True
    settings_class = ThompsonSamplingSettings
    supports_prior = True
    max_reward = 1.0

    def __init__(self, prior_alpha: float = 1.0, prior_beta: float = 1.0, *, seed: int | None = None) -> None:
        self._configure(seed, prior_alpha=prior_alpha, prior_beta=prior_beta)

    def posterior(self) -> list[tuple[float, float]]:
        r""":math:`(\alpha_i, \beta_i)` for every drafter (per-drafter priors included)."""
        self._check_ready()
        return [
            (self.prior_alpha + s + ps, self.prior_beta + n - s + (pn - ps))
            for s, n, ps, pn in zip(self.sums, self.counts, self.prior_sums, self.prior_counts)
        ]

    def select(self) -> int:
        samples = [self._rng.betavariate(a, b) for a, b in self.posterior()]
        return self._argmax(samples)
