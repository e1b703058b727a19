"""Reproducible seeded sampling: ``meta_reproducible=True``.

By default a MetaSD call chooses its drafter and draft length from what this machine measures (seconds of each
round, of each verification length, of each drafter's prefill) and from what earlier calls in the process learnt
(rewards behind learned priors, acceptance rates, the per-pass kernel, token recycling's table, a corpus's online
store). Under sampling that choice decides how many random numbers each round draws (speculative sampling draws one
per drafted token, and a model drafter samples its own), so ``torch.manual_seed(s)`` followed by the same call twice
can give two outputs. Each still follows the target's distribution exactly; they are just not the same sample.

With ``meta_reproducible=True`` every choice of the call depends only on the prompt, the seed and the tokens:

* **time is counted in target passes** (`PassClock`): a round costs one verification pass whatever it verified, and
  drafting costs nothing, so the `speed` reward, the round costs and the draft lengths are functions of the tokens;
* **nothing is read from or kept for other calls**: the call's costs, rewards and acceptance rates live under a key of
  its own (`CallKey`), it runs in an isolated `hf_metasd.reward_memory_scope` of its own (token recycling drafts from
  a copy of its table as the pool stored it, and the call drops what it learnt), learned priors are off and no drafter's `on_generation_end` runs (a corpus's online
  store does not grow);
* **the verification kernel is the stock one** (no per-pass timing picks another summation order);
* **the policy is seeded** from ``torch.initial_seed()`` when its settings give no seed.

Refused with it, before any compute: ``meta_skinny_gemm=True`` and ``meta_learned_priors=True`` given explicitly,
and a `Policy` object as ``meta_policy`` (it carries what earlier calls taught it). A pool's stored priors, corpora
and tables are read as shipped. The price is speed: choices no longer follow this machine's costs.

Example:
    >>> import torch
    >>> clock = PassClock(torch.nn.Linear(2, 2))
    >>> with clock:
    ...     _ = clock.model(torch.zeros(1, 2)); _ = clock.model(torch.zeros(1, 2))
    >>> clock()
    2.0
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from .errors import MetaSDConfigError
from .policies import Policy
from .reward_memory import IsolatedScope, reward_memory_scope
from .settings import MetaSDSettings

__all__ = ["CallKey", "PassClock", "reproducible_call", "reproducible_settings"]


class PassClock:
    """A clock that reads the number of forward passes `model` ran in the thread that entered it (one unit each)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.now = 0.0
        self._thread = threading.get_ident()
        self._handle: Any = None

    def __call__(self) -> float:
        return self.now

    def _count(self, module: torch.nn.Module, args: Any) -> None:
        if threading.get_ident() == self._thread:  # another thread's call on the same model is not this call's
            self.now += 1.0

    def __enter__(self) -> PassClock:
        self._thread = threading.get_ident()
        self._handle = self.model.register_forward_pre_hook(self._count)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._handle.remove()  # the user's model leaves the call as it came


class CallKey(IsolatedScope):
    """A key standing for the target in the per-process caches of one call only, and the name of its
    `reward_memory_scope` (an isolated one): nothing other calls measured or taught is read, and what this call
    measures goes with the key."""

    def __repr__(self) -> str:
        return "CallKey(one reproducible call)"


def reproducible_settings(settings: MetaSDSettings, given: Mapping[str, Any]) -> MetaSDSettings:
    """`settings` for a reproducible call (module docstring): the stock kernel, no learned priors, a seeded policy;
    a `MetaSDConfigError` for what cannot be reproducible (`given` are the call's own arguments).

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(7)
        >>> out = reproducible_settings(MetaSDSettings(meta_reproducible=True), {})
        >>> out.meta_skinny_gemm, out.meta_learned_priors, out.meta_policy_kwargs
        (False, False, {'seed': 7})
    """
    for name, refused in (("meta_skinny_gemm", True), ("meta_learned_priors", True)):
        if given.get(name) is refused:
            raise MetaSDConfigError(
                f"`{name}` must not be {refused} with `meta_reproducible=True` (it makes choices depend on timings "
                f"or on earlier calls), but is. Drop `{name}`, or `meta_reproducible`."
            )
    if isinstance(settings.meta_policy, Policy):
        raise MetaSDConfigError(
            "`meta_policy` must be a policy name with `meta_reproducible=True` (a policy object carries what earlier "
            f"calls taught it), but is a `{type(settings.meta_policy).__name__}` object. Pass its name, and its "
            "settings as `meta_policy_kwargs`."
        )
    kwargs = dict(settings.meta_policy_kwargs or {})
    kwargs.setdefault("seed", torch.initial_seed() % (1 << 63))
    return dataclasses.replace(settings, meta_skinny_gemm=False, meta_learned_priors=False, meta_policy_kwargs=kwargs)


@contextmanager
def reproducible_call(model: torch.nn.Module) -> Iterator[tuple[PassClock, CallKey]]:
    """The ``with`` block of one reproducible call: its `PassClock` over `model` and its `CallKey`, in a
    `reward_memory_scope` of its own."""
    key = CallKey()
    with PassClock(model) as clock, reward_memory_scope(key):
        yield clock, key
