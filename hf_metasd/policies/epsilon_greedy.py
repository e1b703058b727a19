"""Epsilon-greedy: the best mean so far, except a random drafter with probability epsilon."""

from __future__ import annotations

import dataclasses

from .._validation import check_real
from .base import Policy, PolicySettings, setting
from .registry import register_policy

__all__ = ["EpsilonGreedy", "EpsilonGreedySettings"]


@dataclasses.dataclass(frozen=True)
class EpsilonGreedySettings(PolicySettings):
    """Settings of `EpsilonGreedy`."""

    epsilon: float = setting(
        0.1,
        "exploration probability in [0, 1]; larger explores more, 0 is greedy",
        check_real,
        low=0.0,
        high=1.0,
        hint="Use 0.1.",
    )


@register_policy
class EpsilonGreedy(Policy):
    r"""Epsilon-greedy.

    Pull every drafter once (in pool order), then at each round

    .. math::

        i_t = \begin{cases} \text{uniform over } \{0, \dots, K-1\} & \text{with probability } \varepsilon \\
        \arg\max_i \bar r_i & \text{otherwise} \end{cases}

    where :math:`\bar r_i = S_i / n_i` is drafter *i*'s mean reward over its :math:`n_i` rounds and *K* the number
    of drafters. Ties in the argmax go to the lowest index. The random draw may land on the greedy drafter, so the
    greedy drafter is picked with probability :math:`1 - \varepsilon + \varepsilon / K`. Any finite reward scale
    works (only the order of the means matters).

    Prior (`set_prior`): :math:`\bar r_i = (S_i + w m_i) / (n_i + w)` for a drafter with prior mean :math:`m_i`,
    and that drafter is not pulled first.

    Args:
        epsilon: :math:`\varepsilon \in [0, 1]`. Larger explores more (``1`` is uniform random); ``0`` is purely
            greedy after the first pull of each drafter.
        seed: seed of the random generator for the exploration coin and the random drafter.

    Example:
        >>> from hf_metasd.policies import EpsilonGreedy
        >>> policy = EpsilonGreedy(epsilon=0.0)
        >>> policy.reset(num_arms=3)
        >>> [policy.select() for _ in range(2)]      # nothing learnt yet: the first untried drafter
        [0, 0]
        >>> for arm, r in [(0, 0.4), (1, 0.7), (2, 0.1)]:
        ...     policy.update(arm, r)
        >>> policy.select()                          # greedy on the means 0.4, 0.7, 0.1
        1
    """

    name = "epsilon_greedy"
    learns_side_observations = True
    settings_class = EpsilonGreedySettings
    supports_prior = True

    def __init__(self, epsilon: float = 0.1, *, seed: int | None = None) -> None:
        self._configure(seed, epsilon=epsilon)

    def select(self) -> int:
        self._check_ready()
        untried = self._first_untried()
        if untried is not None:
            return untried
        if self._rng.random() < self.epsilon:
            return self._rng.randrange(self.num_arms)
        return self._argmax(self.means())
