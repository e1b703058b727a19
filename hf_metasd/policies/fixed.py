"""Fixed: always the same drafter (single-drafter speculative decoding)."""

from __future__ import annotations

import dataclasses

from .._validation import check_int
from .base import Policy, PolicySettings, setting
from .registry import register_policy

__all__ = ["FixedPolicy", "FixedPolicySettings"]


@dataclasses.dataclass(frozen=True)
class FixedPolicySettings(PolicySettings):
    """Settings of `FixedPolicy`."""

    arm: int = setting(
        0,
        "pool index (>= 0) of the one drafter that drafts",
        check_int,
        low=0,
        hint="Pass the pool index of the drafter, e.g. `arm=0`.",
    )


@register_policy
class FixedPolicy(Policy):
    r"""Always pick drafter `arm`: :math:`i_t = a` for every round.

    This is plain single-drafter speculative decoding inside the MetaSD loop, the baseline every learning policy is
    measured against (with `a` the best drafter it is the simulator's oracle for a stationary pool). No exploration
    at all; `update` only records counts and sums (any reward but NaN), and `set_prior` refuses it.

    Args:
        arm: :math:`a \ge 0`, the pool index of the drafter. Checked against the pool size in `reset`.
        seed: unused (deterministic); accepted for a uniform interface.

    Example:
        >>> from hf_metasd.policies import FixedPolicy
        >>> policy = FixedPolicy(arm=1)
        >>> policy.reset(num_arms=3)
        >>> [policy.select() for _ in range(3)]
        [1, 1, 1]
    """

    name = "fixed"
    uses_rewards = False
    settings_class = FixedPolicySettings

    def __init__(self, arm: int = 0, *, seed: int | None = None) -> None:
        self._configure(seed, arm=arm)

    def reset(self, num_arms: int) -> None:
        super().reset(num_arms)
        if self.arm >= num_arms:
            self.num_arms = None  # refuse to be half-ready
            raise ValueError(
                f"`arm` must be < the number of drafters ({num_arms}), but is {self.arm}. "
                f"Pick a drafter index in [0, {num_arms})."
            )

    def select(self) -> int:
        self._check_ready()
        return self.arm

    def fallback(self, exclude: set[int]) -> int | None:
        """None: a fixed drafter that abstains leaves the round to the target alone (single-drafter SD)."""
        return None
