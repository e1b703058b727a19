"""The `Policy` contract: a multi-armed bandit over the drafters of a pool.

A policy knows nothing about models. Each round the candidate generator asks it for an arm (`select`), lets that
drafter draft, and after verification tells it the reward (`update`). Rewards are floats, in ``[0, 1]`` for the
built-in rewards (BE, BD).
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

__all__ = ["Policy"]


class Policy(ABC):
    """Base class of every policy.

    Subclasses set `name` (the registry key), implement `select` and, when they keep more than pull counts and reward
    sums, extend `reset` / `update` / `state_dict`. Settings are keyword arguments of `__init__`, validated there, and
    returned by `config()` so that a pool can save them.

    Attributes:
        num_arms: number of drafters, set by `reset` (``None`` until then).
        counts: pulls per arm, ``counts[i] = n_i``.
        sums: summed rewards per arm; ``sums[i] / counts[i]`` is the empirical mean.
        t: total number of updates since the last `reset`.

    Example:
        >>> from hf_metasd.policies import get_policy
        >>> policy = get_policy("ucb", beta=0.5)
        >>> policy.reset(num_arms=2)
        >>> arm = policy.select(); policy.update(arm, 0.75)
        >>> policy.counts, policy.means()
        ([1, 0], [0.75, 0.0])
    """

    name: ClassVar[str] = ""
    #: True for policies that learn from every drafter's (counterfactual) reward each round, see `update_all`.
    full_information: ClassVar[bool] = False

    def __init__(self, *, seed: int | None = None) -> None:
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise TypeError(f"`seed` must be an int or None, but is {seed!r}. Pass an integer seed.")
        self.seed = seed
        self.num_arms: int | None = None
        self.counts: list[int] = []
        self.sums: list[float] = []
        self.t = 0
        self._rng = random.Random(seed)

    # ------------------------------------------------------------------ contract
    def reset(self, num_arms: int) -> None:
        """Forget everything learnt and prepare for `num_arms` drafters (re-seeds the random generator)."""
        if not isinstance(num_arms, int) or isinstance(num_arms, bool) or num_arms < 1:
            raise ValueError(f"`num_arms` must be a positive int, but is {num_arms!r}. Give the pool size.")
        self.num_arms = num_arms
        self.counts = [0] * num_arms
        self.sums = [0.0] * num_arms
        self.t = 0
        self._rng = random.Random(self.seed)

    @abstractmethod
    def select(self) -> int:
        """Return the index of the drafter that drafts the next round."""

    def fallback(self, exclude: set[int]) -> int | None:
        """The arm that drafts a round whose chosen drafter(s) in `exclude` abstained (had nothing to propose).

        An abstention is not a pull: it says nothing about how good the drafter's drafts are, so it is not
        recorded, and the policy's own choice stays first in later rounds (a prompt-lookup drafter is asked first
        every round and, when it finds no match, the round goes to the fallback). Default: the lowest-index arm
        not yet pulled, else the best of `scores()` (index policies such as UCB) or of the empirical means, among
        the arms not in `exclude`; ``None`` when every arm is excluded (the round is a plain target step).

        Example:
            >>> from hf_metasd.policies import get_policy
            >>> policy = get_policy("epsilon_greedy", epsilon=0.0)
            >>> policy.reset(num_arms=3)
            >>> for arm, reward in [(0, 0.9), (1, 0.2), (2, 0.5)]:
            ...     policy.update(arm, reward)
            >>> policy.fallback({0}), policy.fallback({0, 2}), policy.fallback({0, 1, 2})
            (2, 1, None)
        """
        self._check_ready()
        allowed = [arm for arm in range(self.num_arms) if arm not in exclude]
        if not allowed:
            return None
        untried = [arm for arm in allowed if self.counts[arm] == 0]
        if untried:
            return untried[0]
        scores = getattr(self, "scores", None)
        values = scores() if callable(scores) else self.means()
        return allowed[self._argmax([values[arm] for arm in allowed])]

    def update(self, arm: int, reward: float) -> None:
        """Record `reward` for `arm` (the drafter chosen by the last `select`)."""
        self._check_ready()
        if not 0 <= arm < self.num_arms:
            raise IndexError(
                f"`arm` must be in [0, {self.num_arms}), but is {arm}. Update with the arm `select` gave."
            )
        reward = float(reward)
        if math.isnan(reward):
            raise ValueError(f"`reward` must be a number, but is {reward}. Check the reward function.")
        self.counts[arm] += 1
        self.sums[arm] += reward
        self.t += 1

    def update_all(self, rewards: Mapping[int, float]) -> None:
        """Full-information update: `rewards` maps arms to (counterfactual) rewards observed this round.

        Bandit policies learn only from the arm they pulled, so the default ignores it; full-information policies
        (`full_information = True`) override it.
        """

    def bind(self, num_arms: int) -> None:
        """`reset` a fresh policy; keep a policy that already learnt on a pool of the same size.

        This is what lets a policy *instance* learn across `generate` calls.
        """
        if self.num_arms is None:
            self.reset(num_arms)
        elif self.num_arms != num_arms:
            raise ValueError(
                f"`meta_policy` was bound to {self.num_arms} drafters, but the pool has {num_arms}. "
                "Call `policy.reset(num_arms)` or pass the policy by name to start fresh."
            )

    # ------------------------------------------------------------------ helpers
    def means(self) -> list[float]:
        """Empirical mean reward per arm (0.0 for arms never pulled)."""
        return [s / n if n else 0.0 for s, n in zip(self.sums, self.counts)]

    def config(self) -> dict[str, Any]:
        """Settings that rebuild this policy with `get_policy(name, **config())`."""
        return {"seed": self.seed}

    def state_dict(self) -> dict[str, Any]:
        """Everything learnt, as JSON-serialisable Python values."""
        version, internal, gauss = self._rng.getstate()
        return {
            "name": self.name,
            "config": self.config(),
            "num_arms": self.num_arms,
            "counts": list(self.counts),
            "sums": list(self.sums),
            "t": self.t,
            "rng_state": [version, list(internal), gauss],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        if state.get("name") != self.name:
            raise ValueError(
                f"`state['name']` must be {self.name!r}, but is {state.get('name')!r}. "
                f"Load it into `get_policy({state.get('name')!r})` instead."
            )
        self.num_arms = state["num_arms"]
        self.counts = list(state["counts"])
        self.sums = [float(s) for s in state["sums"]]
        self.t = int(state["t"])
        version, internal, gauss = state["rng_state"]
        self._rng.setstate((version, tuple(internal), gauss))

    def _check_ready(self) -> None:
        if self.num_arms is None:
            raise RuntimeError(f"{type(self).__name__} has no arms yet. Call `reset(num_arms)` first.")

    def _first_untried(self) -> int | None:
        """Lowest-index arm never pulled, or None."""
        for arm, n in enumerate(self.counts):
            if n == 0:
                return arm
        return None

    def _sample(self, probs: list[float]) -> int:
        """An arm drawn from `probs` with one draw of the policy's random generator."""
        u = self._rng.random()
        acc = 0.0
        for arm, p in enumerate(probs):
            acc += p
            if u < acc:
                return arm
        return len(probs) - 1  # u landed in the round-off gap above sum(probs)

    @staticmethod
    def _argmax(values: list[float]) -> int:
        """Index of the largest value; ties go to the lowest index (deterministic, testable)."""
        best = 0
        for i, v in enumerate(values):
            if v > values[best]:
                best = i
        return best

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({settings})"
