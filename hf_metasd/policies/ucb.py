"""MetaSD-UCB: upper confidence bound over drafters (Kim et al., MetaSD)."""

from __future__ import annotations

import dataclasses
import math

from .._validation import check_real
from .base import IndexPolicy, PolicySettings, setting
from .registry import register_policy

__all__ = ["UCB", "UCBSettings"]


@dataclasses.dataclass(frozen=True)
class UCBSettings(PolicySettings):
    """Settings of `UCB`."""

    beta: float = setting(
        1.0,
        "exploration weight beta >= 0; larger explores more, 0 is greedy on the means",
        check_real,
        low=0.0,
        hint="Use 1.0 (the paper's default).",
    )


@register_policy
class UCB(IndexPolicy):
    r"""MetaSD-UCB.

    Pull every drafter once (in pool order), then at each round pick

    .. math:: i_t = \arg\max_i \; \bar r_i + \beta \sqrt{2 \ln t / n_i}

    where :math:`\bar r_i` is drafter *i*'s mean reward, :math:`n_i` its number of pulls (and side observations,
    `Policy.observe`) and *t* the number of rounds so far (pulls). Ties go to the lowest index. Rewards must lie in ``[0, 1]`` (values within 1e-6
    outside are clipped): the bonus is sized for that range.

    With a prior (`set_prior`), :math:`n_i` and :math:`\bar r_i` include drafter *i*'s pseudo-observations and *t*
    all of them, so the prior is exactly as if those rounds had been observed; a drafter with a prior is not pulled
    first.

    Args:
        beta: exploration weight :math:`\beta \ge 0`. Larger explores more; ``0`` is greedy on the means.
        seed: unused (UCB is deterministic); accepted for a uniform interface.

    Example:
        >>> from hf_metasd.policies import UCB
        >>> policy = UCB(beta=1.0)
        >>> policy.reset(num_arms=2)
        >>> for _ in range(2):                            # each arm once
        ...     arm = policy.select(); policy.update(arm, [0.9, 0.1][arm])
        >>> policy.select()                               # 0.9 + sqrt(2 ln 2) > 0.1 + sqrt(2 ln 2)
        0
    """

    name = "ucb"
    learns_side_observations = True
    settings_class = UCBSettings
    supports_prior = True
    max_reward = 1.0

    def __init__(self, beta: float = 1.0, *, seed: int | None = None) -> None:
        self._configure(seed, beta=beta)

    def scores(self) -> list[float]:
        """The UCB index of every arm (``inf`` for arms never pulled); variants override it, `select` stays."""
        self._check_ready()
        log_t = self._log_rounds()
        return [
            mean + self.beta * math.sqrt(2.0 * log_t / n) if n else math.inf
            for mean, n in zip(self.means(), self.effective_counts())
        ]
