r"""`CostModel`: smoothed seconds per round of every arm, the unit of the cost-aware `speed` reward.

A wall-clock reward is noisy: one round can take twice as long as the next because the machine did something else.
The `speed` reward therefore does not divide by the round's own time but by a smoothed estimate of what a round of
that arm costs: an exponential moving average over the arm's measured rounds,

.. math:: \hat c_a \leftarrow (1 - \lambda)\, \hat c_a + \lambda\, s_r \quad (\hat c_a = s_r \text{ at the first round}),

with :math:`s_r` the measured seconds of round :math:`r` (selection, catch-up, drafting, verification and update;
a drafter's prompt prefill and the target's prompt prefill are left out, since every method pays them once) and
:math:`\lambda` the `smoothing` (larger follows changes faster and averages less noise away). The no-draft arm's
estimate is :math:`\hat c_{plain}`, the cost of a plain target step.

Estimates persist across calls in a per-process cache keyed by the target, the arm and the thread count, so that a
second call starts with the costs the first one measured (a new target, drafter or thread count starts fresh).

Example:
    >>> costs = CostModel(["d0", "no_draft"], smoothing=0.5)
    >>> costs.observe(0, 0.10); costs.observe(0, 0.20)
    >>> costs.estimate(0), costs.estimate(1)
    (0.15000000000000002, None)
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from ._validation import check_real

__all__ = ["MIN_PREFILLS", "CostModel", "PrefillCosts", "target_cache"]

#: target -> {(arm key, threads): smoothed seconds}: what earlier calls measured.
_CACHE: weakref.WeakKeyDictionary[Any, dict[tuple[Hashable, int], float]] = weakref.WeakKeyDictionary()


def target_cache(store: weakref.WeakKeyDictionary, target: Any) -> dict | None:
    """``store[target]``, created empty on first use: what earlier calls with `target` kept there. ``None`` when
    `target` is None or cannot be weakly referenced (then nothing is shared across calls)."""
    if target is None:
        return None
    try:
        return store.setdefault(target, {})
    except TypeError:  # not weak-referenceable
        return None


class CostModel:
    """Smoothed seconds per round, one estimate per arm (see the module docstring).

    Args:
        keys: one hashable key per arm, identifying the drafter across calls (e.g. its model object's id).
        smoothing: :math:`\\lambda \\in (0, 1]`.
        target: the target model whose process-level cache to read and update (``None``: no cache).
    """

    def __init__(self, keys: Sequence[Hashable], *, smoothing: float = 0.3, target: Any = None) -> None:
        self.smoothing = check_real("smoothing", smoothing, low=0.0, high=1.0, low_open=True, hint="Use e.g. 0.3.")
        self.keys = list(keys)
        self._threads = torch.get_num_threads()
        self._cache: dict[tuple[Hashable, int], float] | None = target_cache(_CACHE, target)
        self._seconds: list[float | None] = [
            None if self._cache is None else self._cache.get((key, self._threads)) for key in self.keys
        ]

    def observe(self, arm: int, seconds: float) -> None:
        """Fold one measured round of `arm` into its estimate."""
        old = self._seconds[arm]
        new = seconds if old is None else (1.0 - self.smoothing) * old + self.smoothing * seconds
        self._seconds[arm] = new
        if self._cache is not None:
            self._cache[(self.keys[arm], self._threads)] = new

    def estimate(self, arm: int) -> float | None:
        """Smoothed seconds of a round of `arm`, or ``None`` before its first measured round."""
        return self._seconds[arm]


#: target -> {(arm key, threads): [fastest measured prefill seconds per prompt token, prefills measured]}
_PREFILL_CACHE: weakref.WeakKeyDictionary[Any, dict[tuple[Hashable, int], list[float]]] = weakref.WeakKeyDictionary()

#: Measured prefills of an arm before `PrefillCosts.estimate` predicts (the first one in a process is cold).
MIN_PREFILLS = 2


class PrefillCosts:
    r"""Seconds per prompt token of each drafter's prompt prefill (its first ingest of a sequence), to predict the
    next one.

    A model drafter has to read the whole context before its first draft of a call; on a long prompt that costs more
    than many rounds (on the 2-core CPU, 4.8 s for the 0.5B Qwen drafter on a summarization prompt, about five plain
    steps of the 1.5B target). The prediction for a prefill of :math:`T` tokens is

    .. math:: \hat P_a(T) = T \cdot \min_j \frac{s_j}{T_j}

    over the arm's measured prefills :math:`(T_j, s_j)` (the caller leaves out the set-up a drafter reports,
    `Drafter.setup_seconds`), once there are `MIN_PREFILLS` of them: the fastest rate, and not the first prefill
    alone, because a drafter's first prefill in a process also pays one-time costs no stopwatch separates (weights
    paged in, lazy kernels) that must not be charged to every later prompt; an underestimate only makes the prefill
    gate skip less. Like `CostModel`, what is measured persists across calls per (target, arm key, thread count).

    Example:
        >>> prefills = PrefillCosts(["d0", "d1"])
        >>> prefills.observe(0, seconds=7.5, tokens=100)   # the first one, cold
        >>> prefills.estimate(0, tokens=1000) is None
        True
        >>> prefills.observe(0, seconds=2.5, tokens=500)   # 5 ms per token
        >>> prefills.estimate(0, tokens=1000), prefills.estimate(1, tokens=1000)
        (5.0, None)
    """

    def __init__(self, keys: Sequence[Hashable], *, target: Any = None) -> None:
        self.keys = list(keys)
        threads = torch.get_num_threads()
        cache = target_cache(_PREFILL_CACHE, target)
        self._state: list[list[float]] = []
        for key in self.keys:
            state = [math.inf, 0] if cache is None else cache.setdefault((key, threads), [math.inf, 0])
            self._state.append(state)  # shared with the cache: updated in place

    def observe(self, arm: int, *, seconds: float, tokens: int) -> None:
        """Fold one measured prefill of `tokens` prompt tokens taking `seconds` into `arm`'s rate."""
        if tokens <= 0 or seconds < 0:
            return
        state = self._state[arm]
        state[0] = min(state[0], seconds / tokens)
        state[1] += 1

    def estimate(self, arm: int, *, tokens: int) -> float | None:
        """Predicted seconds of `arm`'s prefill of `tokens` tokens; ``None`` before `MIN_PREFILLS` measured ones."""
        rate, count = self._state[arm]
        return None if count < MIN_PREFILLS else tokens * rate
