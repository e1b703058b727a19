"""Registry of policies: built-ins register themselves on import, users plug in with `register_policy`."""

from __future__ import annotations

from typing import Any

from ..errors import UnknownPolicyError
from .base import Policy

__all__ = ["POLICY_REGISTRY", "get_policy", "register_policy"]

#: name -> Policy subclass. Starts empty; each policy module registers itself.
POLICY_REGISTRY: dict[str, type[Policy]] = {}


def register_policy(cls: type[Policy] | None = None, *, name: str | None = None):
    """Register a `Policy` subclass under `name` (default: `cls.name`). Usable as a decorator.

    Example:
        >>> from hf_metasd.policies import Policy, register_policy, get_policy
        >>> @register_policy(name="always_last")
        ... class AlwaysLast(Policy):
        ...     def select(self):
        ...         return self.num_arms - 1
        >>> policy = get_policy("always_last"); policy.reset(3); policy.select()
        2
        >>> del POLICY_REGISTRY["always_last"]
    """

    def _register(policy_cls: type[Policy]) -> type[Policy]:
        if not (isinstance(policy_cls, type) and issubclass(policy_cls, Policy)):
            raise TypeError(f"`cls` must be a subclass of `Policy`, but is {policy_cls!r}. Subclass `Policy`.")
        key = name or policy_cls.name
        if not key:
            raise ValueError(
                f"`name` must be a non-empty string, but is {key!r}. Pass `name=` or set `{policy_cls.__name__}.name`."
            )
        existing = POLICY_REGISTRY.get(key)
        if existing is not None and existing is not policy_cls:
            raise ValueError(
                f"`name` must be unused, but {key!r} is already registered to {existing.__name__}. Choose another name."
            )
        if not policy_cls.name:
            policy_cls.name = key
        POLICY_REGISTRY[key] = policy_cls
        return policy_cls

    return _register(cls) if cls is not None else _register


def get_policy(policy: str | Policy, **kwargs: Any) -> Policy:
    """A `Policy` from a registered name (a fresh instance built with `kwargs`) or an instance (returned as is)."""
    if isinstance(policy, Policy):
        if kwargs:
            raise ValueError(
                f"`meta_policy_kwargs` must be empty when `meta_policy` is an instance, but is {kwargs!r}. "
                "Set the settings when you build the policy."
            )
        return policy
    if not isinstance(policy, str):
        raise TypeError(
            f"`meta_policy` must be a registered name or a `Policy` instance, but is {type(policy).__name__}. "
            f"Use one of {sorted(POLICY_REGISTRY)} or subclass `hf_metasd.policies.Policy`."
        )
    if policy not in POLICY_REGISTRY:
        raise UnknownPolicyError(
            f"`meta_policy` must be one of {sorted(POLICY_REGISTRY)}, but is {policy!r}. "
            "Pick a registered name or register yours with `hf_metasd.register_policy`."
        )
    return POLICY_REGISTRY[policy](**kwargs)
