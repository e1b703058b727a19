"""The prior mean rewards a call's policy starts from (`Policy.set_prior`), and where each comes from.

Three sources, by arm: the call's ``meta_priors`` (applied as given); a pool's priors (measured when the pool was
built: they apply only when the call uses the pool's reward, since they are means of it, and a fresh policy that
takes priors); and the mean reward the arm earned in earlier calls of this process with the same target
(`hf_metasd.reward_memory`, with ``meta_learned_priors``, for a fresh policy that takes priors). A learned mean fills
an arm without a prior and replaces a pool's prior: the pool's was measured on the builder's machine, and the `speed`
reward is in units of the machine's costs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import MetaSDConfigError, MetaSDTypeError
from .policies import Policy
from .reward_memory import RewardMemory
from .settings import MetaSDSettings

__all__ = ["set_priors"]


def set_priors(
    policy: Policy,
    names: Sequence[str],
    settings: MetaSDSettings,
    *,
    pool_defaults: Mapping[str, Any],
    from_call: bool,
    memory: RewardMemory | None = None,
) -> dict[str, float]:
    """Give `policy` (arms named `names`) the call's priors (see the module docstring); returns the learned ones it
    took, by arm name (telemetry: `MetaSDStats.learned_priors`).

    Args:
        from_call: whether ``settings.meta_priors`` were passed to this call (else they are a pool's or a config's).
        memory: the call's `RewardMemory` (``None``: no learned priors).

    Example:
        >>> from hf_metasd.policies import get_policy
        >>> policy = get_policy("ucb")
        >>> policy.bind(2)
        >>> set_priors(policy, ["d", "no_draft"], MetaSDSettings(meta_priors={"d": 0.5}), pool_defaults={}, from_call=True)
        {}
        >>> policy.prior_means
        [0.5, None]
    """
    priors, from_pool = _chosen(policy, settings, pool_defaults, from_call)
    if priors is not None:
        unknown = sorted(set(priors) - set(names))
        if unknown:
            raise MetaSDConfigError(
                f"`meta_priors` must name arms of this call {list(names)}, but names {unknown}. Fix the names."
            )
        for name, value in priors.items():
            _check_prior(name, value, policy)
    means = [None if priors is None else priors.get(name) for name in names]
    learned: dict[str, float] = {}
    if memory is not None and _fresh_policy_takes_priors(settings, policy):
        for arm, mean in enumerate(memory.means()):
            if mean is not None and (means[arm] is None or from_pool):
                means[arm] = learned[names[arm]] = mean
    if any(mean is not None for mean in means):
        weight = settings.meta_prior_weight
        policy.set_prior(means, **({} if weight is None else {"weight": weight}))
    return learned


def _check_prior(name: str, value: Any, policy: Policy) -> None:
    """Refuse a prior that is not a finite number in the policy's reward range, naming it as the call does (the
    policy's own check names its list index instead)."""
    bound = policy.reward_bound()
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and math.isfinite(value) and (bound is None or 0.0 <= value <= bound):
        return
    valid = (
        "a finite float" if bound is None else f"a float in [0, {bound:g}] (the {policy.name!r} policy's reward range)"
    )
    raise (MetaSDConfigError if number else MetaSDTypeError)(
        f"`meta_priors[{name!r}]` must be {valid}, but is {value!r}. Give the arm's expected reward, e.g. 0.4, or "
        "leave the arm out."
    )


def _chosen(
    policy: Policy, settings: MetaSDSettings, pool_defaults: Mapping[str, Any], from_call: bool
) -> tuple[dict[str, float] | None, bool]:
    """The priors the call applies, and whether they are the pool's: given per call, or else only when the pool's
    reward is the call's reward (a pool's priors are means of its own reward) and the policy is a fresh one that
    takes priors."""
    priors = settings.meta_priors
    if priors is None:
        return None, False
    if not from_call:
        if pool_defaults.get("meta_reward", settings.meta_reward) != settings.meta_reward:
            return None, False
        if not _fresh_policy_takes_priors(settings, policy):
            return None, False
    return priors, not from_call and priors == pool_defaults.get("meta_priors")


def _fresh_policy_takes_priors(settings: MetaSDSettings, policy: Policy) -> bool:
    """Whether the call's policy is a fresh one (given by name) that takes priors: the pool's priors and the learned
    ones apply only to such a policy (a `Policy` instance keeps what it learnt)."""
    return isinstance(settings.meta_policy, str) and policy.supports_prior
