r"""`RewardMemory`: the mean reward each arm earned in earlier calls of this process, the next call's prior.

A fresh policy per call (the paper's protocol, and ``meta_policy="ucb_scaled"``) knows nothing at round 1: every
drafter without a prior is pulled once, and a model drafter's first pull also pays its prompt prefill. On a 64-token
answer of ~30 rounds that exploration is a large part of the call, and it is paid again by every call, though the
drafters are the same. Pools built with `recipes/pools/build_default_pool.py` ship priors measured on dev prompts; a pool
of your own drafters (``assistant_models=[d1, d2]``) has none.

So every call records the rewards its policy learnt from (pulls and side observations, `Policy.update` and
`Policy.observe`), and the next call with the same target, drafter, reward, draft length, decoding mode and thread
count starts with their mean as a prior (`Policy.set_prior`, ``meta_prior_weight`` pseudo-observations, 2 by default)
for every arm that has no prior from the call. A learned mean also replaces the pool's prior for its arm: a pool's
priors were measured when it was built, on the builder's machine, and the cost-aware `speed` reward depends on the
machine (on one 2-core CPU the pool's model drafter paid, on another it lost to plain decoding), while the learned
mean was measured here. A call still learns its own rewards on top, so the prior steers only its first rounds:

.. math::

    m_a = \frac{\sum_{s} r_{a,s}}{n_a} \quad \text{over the last } n_a \le \texttt{MAX\_OBSERVATIONS}
    \text{ rewards of arm } a \text{ (older ones fade geometrically)}.

What is learnt stays in the process (a per-target cache, like `hf_metasd.costs.CostModel`'s costs), changes no output
(the target verifies every token), and is off with ``meta_learned_priors=False``. `clear_reward_memory` forgets it;
`reward_memory_scope` keeps separate memories side by side (the bench runs each method in its own, so that a method
learns only from its own calls). A drafter's rewards are kept by the object holding its weights or corpus
(`hf_metasd.costs.object_key`, shared by the drafter's per-call copies) for as long as that object lives: a brand-new
drafter starts from nothing, even where it reuses a freed one's memory address.

Example:
    >>> import torch
    >>> target = torch.nn.Linear(2, 2)             # any object standing for the target model
    >>> memory = RewardMemory(["d0", "d1"], context=("speed", 3), target=target)
    >>> memory.record(0, 0.25); memory.record(0, 0.5)
    >>> RewardMemory(["d0", "d1"], context=("speed", 3), target=target).means()  # a later call reads it
    [0.375, None]
    >>> clear_reward_memory()
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from collections.abc import Hashable, Iterator, Sequence
from typing import Any

import torch

from .costs import target_cache

__all__ = [
    "IsolatedScope",
    "MAX_OBSERVATIONS",
    "RewardMemory",
    "clear_reward_memory",
    "current_scope",
    "reward_memory_scope",
]

#: Rewards per arm a memory averages over; beyond it, older rewards fade (count and sum scaled down together).
MAX_OBSERVATIONS = 256

#: scope -> target -> {(arm key, context, threads): [rewards counted, their sum]}
_STORES: dict[Hashable, weakref.WeakKeyDictionary[Any, dict[tuple[Hashable, ...], list[float]]]] = {}
_SCOPE: contextvars.ContextVar[Hashable] = contextvars.ContextVar("hf_metasd_reward_memory_scope", default=None)


def clear_reward_memory() -> None:
    """Forget every reward earlier calls recorded, in every scope."""
    _STORES.clear()


@contextlib.contextmanager
def reward_memory_scope(name: Hashable) -> Iterator[None]:
    """Calls inside the ``with`` block read and write the memory named `name`, apart from every other scope's.

    Example:
        >>> import torch
        >>> target = torch.nn.Linear(2, 2)
        >>> with reward_memory_scope("method A"):
        ...     RewardMemory(["d0"], context=(), target=target).record(0, 0.5)
        >>> RewardMemory(["d0"], context=(), target=target).means()  # the default scope saw nothing
        [None]
        >>> clear_reward_memory()
    """
    token = _SCOPE.set(name)
    try:
        yield
    finally:
        _SCOPE.reset(token)


class IsolatedScope:
    """A scope name (`reward_memory_scope`) for calls that read nothing other calls learnt: learners that carry state
    across calls start, in such a scope, from what they were built with (`hf_metasd.reproducible`'s calls)."""


def current_scope() -> Hashable:
    """The name of the `reward_memory_scope` in force (``None``: the default scope). What else a call learns about
    its drafters for later calls (the acceptance counts of `hf_metasd.draft_length`) is kept per scope too."""
    return _SCOPE.get()


class RewardMemory:
    """Counted rewards per arm, shared by every call with the same target, arm key and context (module docstring).

    Args:
        keys: one hashable key per arm, identifying the drafter across calls (the cost model's keys; entries whose
            key holds the `hf_metasd.costs.object_key` of a collected object are swept out, see `target_cache`).
        context: what else a reward depends on (reward name, draft length, decoding mode); the thread count is added.
        target: the target whose memory to read and write; ``None`` (or an object that cannot be weakly referenced):
            a memory of this instance alone.
    """

    def __init__(self, keys: Sequence[Hashable], *, context: Hashable, target: Any) -> None:
        shared = target_cache(_STORES.setdefault(_SCOPE.get(), weakref.WeakKeyDictionary()), target)
        self._cache: dict[tuple[Hashable, ...], list[float]] = {} if shared is None else shared
        threads = torch.get_num_threads()
        self.keys = [(key, context, threads) for key in keys]

    def record(self, arm: int, reward: float) -> None:
        """Count one reward of `arm`."""
        entry = self._cache.setdefault(self.keys[arm], [0.0, 0.0])
        if entry[0] >= MAX_OBSERVATIONS:
            fade = (MAX_OBSERVATIONS - 1) / entry[0]
            entry[0] *= fade
            entry[1] *= fade
        entry[0] += 1.0
        entry[1] += float(reward)

    def means(self) -> list[float | None]:
        """The mean recorded reward of every arm, ``None`` for an arm never rewarded."""
        out: list[float | None] = []
        for key in self.keys:
            entry = self._cache.get(key)
            out.append(entry[1] / entry[0] if entry else None)
        return out
