"""Round robin: drafters take turns, whatever their rewards."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import Policy
from .registry import register_policy

__all__ = ["RoundRobin"]


@register_policy
class RoundRobin(Policy):
    r"""Cycle through the drafters in pool order.

    Round *t* (counting `select` calls from 0 since `reset`) picks :math:`i_t = t \bmod K`, with *K* the number of
    drafters. The turn advances on `select`, not on `update`, so asking twice moves on twice. There is no knob and
    nothing is learnt (any reward but NaN is recorded; `set_prior` refuses it); every drafter gets the same share of
    rounds, which makes it the baseline for comparing drafters under identical conditions (and a cheap way to
    collect a reward trace for each of them).

    Args:
        seed: unused (deterministic); accepted for a uniform interface.

    Example:
        >>> from hf_metasd.policies import RoundRobin
        >>> policy = RoundRobin()
        >>> policy.reset(num_arms=3)
        >>> [policy.select() for _ in range(5)]
        [0, 1, 2, 0, 1]
    """

    name = "round_robin"
    uses_rewards = False

    def __init__(self, *, seed: int | None = None) -> None:
        super().__init__(seed=seed)
        self._next = 0

    def reset(self, num_arms: int) -> None:
        super().reset(num_arms)
        self._next = 0

    def select(self) -> int:
        self._check_ready()
        arm = self._next
        self._next = (arm + 1) % self.num_arms
        return arm

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["next"] = self._next
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self._next = int(state["next"])
