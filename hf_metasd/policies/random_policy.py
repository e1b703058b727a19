"""Uniformly random drafter each round: the no-learning baseline."""

from __future__ import annotations

from .base import Policy
from .registry import register_policy

__all__ = ["RandomPolicy"]


@register_policy
class RandomPolicy(Policy):
    r"""Uniform random choice.

    Each round picks :math:`i_t \sim \mathrm{Uniform}\{0, \dots, K-1\}` independently of every reward, with *K* the
    number of drafters. It has no knob: exploration is total and nothing is learnt (`update` only records counts and
    sums, so `means()` still reports what each drafter earned; any reward but NaN is accepted, and `set_prior`
    refuses it). It is the lower baseline of the simulator: its regret grows linearly with the number of rounds.

    Args:
        seed: seed of the random generator.

    Example:
        >>> from hf_metasd.policies import RandomPolicy
        >>> policy = RandomPolicy(seed=0)
        >>> policy.reset(num_arms=3)
        >>> picks = [policy.select() for _ in range(300)]
        >>> sorted(set(picks)), all(80 < picks.count(a) < 120 for a in range(3))
        ([0, 1, 2], True)
    """

    name = "random"
    uses_rewards = False

    def select(self) -> int:
        self._check_ready()
        return self._rng.randrange(self.num_arms)
