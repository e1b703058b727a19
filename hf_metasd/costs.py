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

The per-process caches of this module, of `hf_metasd.draft_length` and of `hf_metasd.reward_memory` are all fetched
through `target_cache`: one map per target (held weakly: it goes with the target), and in it the entries of each arm.
An arm's key names the object holding its drafter's weights or corpus through `object_key`, never through
``id(obj)``: an id is reused once its object is freed, so a brand-new drafter would start from the costs and learned
priors of a collected one. A key of a collected object is never equal to another object's, and its entries are swept
out the next time their map is fetched, so a map holds entries for live drafters only; `MAX_ENTRIES` bounds it
whatever keys callers use.

Example:
    >>> costs = CostModel(["d0", "no_draft"], smoothing=0.5)
    >>> costs.observe(0, 0.10); costs.observe(0, 0.20)
    >>> costs.estimate(0), costs.estimate(1)
    (0.15000000000000002, None)
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from ._validation import check_real

__all__ = ["MAX_ENTRIES", "CostModel", "ObjectKey", "cost_key", "object_key", "target_cache"]

#: target -> {(arm key, threads): smoothed seconds}: what earlier calls measured.
_CACHE: weakref.WeakKeyDictionary[Any, dict[tuple[Hashable, int], float]] = weakref.WeakKeyDictionary()

#: Most entries one target's map in one cache keeps (`target_cache`); beyond it the oldest-written are dropped.
MAX_ENTRIES = 4096


class ObjectKey:
    """The stand-in for one live object in a process cache's keys (`object_key`): equal only to itself.

    Attributes:
        what: the object's type name (for reading keys).
        alive: ``False`` once the object was collected (or when it cannot be weakly referenced, so that nothing
            would say when it is); `target_cache` then sweeps out every entry whose key holds this one.
    """

    __slots__ = ("alive", "what")

    def __init__(self, what: str) -> None:
        self.what = what
        self.alive = True

    def __repr__(self) -> str:
        return f"ObjectKey({self.what}, {'alive' if self.alive else 'collected'})"


#: id(obj) -> the `ObjectKey` of obj, for as long as obj lives (its finalizer removes it before the id is freed)
_KEYS: dict[int, ObjectKey] = {}
_KEYS_LOCK = threading.Lock()
#: objects collected so far (finalizers count them; a map swept at the current count holds no collected key)
_COLLECTED = [0]
_SWEEP_LOCK = threading.Lock()


def object_key(obj: Any) -> ObjectKey:
    """The same `ObjectKey` for `obj` on every call while `obj` lives; never one that another object had.

    A collected object's key stays in the cache entries that hold it, so a new object that reuses its id gets a new
    key: it starts from nothing. An object that cannot be weakly referenced gets a new key, already marked
    collected, on every call: its entries last one call.

    Example:
        >>> import torch
        >>> layer = torch.nn.Linear(1, 1)
        >>> object_key(layer) is object_key(layer), object_key(layer) is object_key(torch.nn.Linear(1, 1))
        (True, False)
    """
    ident = id(obj)
    with _KEYS_LOCK:
        key = _KEYS.get(ident)
        if key is not None:
            return key
        key = ObjectKey(type(obj).__name__)
        try:
            finalizer = weakref.finalize(obj, _collected, ident, key)
        except TypeError:  # not weak-referenceable: nothing would tell when it dies
            key.alive = False
            return key
        finalizer.atexit = False
        _KEYS[ident] = key
        return key


def _collected(ident: int, key: ObjectKey) -> None:
    """`obj`'s finalizer (it runs on whatever thread frees `obj`, so it takes no lock): mark and forget its key."""
    key.alive = False
    if _KEYS.get(ident) is key:
        _KEYS.pop(ident, None)
    _COLLECTED[0] += 1


class _Entries(dict):
    """One target's map in one cache, with the collected count it was last swept at."""

    __slots__ = ("swept",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.swept = -1


def _holds_collected(key: Any) -> bool:
    """Whether `key` (an `ObjectKey`, or a tuple nesting some) names a collected object."""
    if isinstance(key, ObjectKey):
        return not key.alive
    return isinstance(key, tuple) and any(_holds_collected(part) for part in key)


def _sweep(entries: _Entries) -> None:
    """Drop the entries whose key names a collected object, then the oldest-written beyond `MAX_ENTRIES`."""
    collected = _COLLECTED[0]  # read first: an object collected during the sweep leaves the count above it
    if entries.swept == collected and len(entries) <= MAX_ENTRIES:
        return
    with _SWEEP_LOCK:
        for key in [key for key in list(entries) if _holds_collected(key)]:
            entries.pop(key, None)
        excess = len(entries) - MAX_ENTRIES
        for key in list(entries)[: max(excess, 0)]:
            entries.pop(key, None)
        entries.swept = collected


def target_cache(store: weakref.WeakKeyDictionary, target: Any) -> dict | None:
    """``store[target]``, created empty on first use: what earlier calls with `target` kept there, swept of the
    entries of collected objects (`object_key`) and bounded by `MAX_ENTRIES`. ``None`` when `target` is None or
    cannot be weakly referenced (then nothing is shared across calls)."""
    if target is None:
        return None
    try:
        entries = store.setdefault(target, _Entries())
    except TypeError:  # not weak-referenceable
        return None
    if not isinstance(entries, _Entries):  # a plain dict stored by hand (a test's seeded costs)
        entries = store[target] = _Entries(entries)
    _sweep(entries)
    return entries


class CostModel:
    """Smoothed seconds per round, one estimate per arm (see the module docstring).

    Args:
        keys: one hashable key per arm, identifying the drafter across calls (e.g. with its model's `object_key`).
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


def cost_key(drafter: Any) -> tuple[Any, ...]:
    """What identifies a drafter's costs and learned rewards across calls: its kind, name, settings (`config`) and
    the object holding its weights or its corpus (shared by a drafter's `spawn` copies), by its `object_key`: not
    by its id, which a new object reuses once the old one is freed, and the entries of a freed one are swept out
    (`target_cache`). Two drafters of one name that differ in a setting (a corpus drafter with and without
    `context_lookup`) or in their data are two drafters."""
    holder = getattr(drafter, "model", None)
    if holder is None:
        holder = getattr(drafter, "index", None)
    settings = json.dumps(drafter.config(), sort_keys=True, default=repr)
    return (drafter.kind, drafter.name, settings, object_key(holder) if holder is not None else None)
