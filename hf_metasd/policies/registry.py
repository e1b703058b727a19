"""Registry of policies: built-ins register themselves on import, users plug in with `register_policy`."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping
from typing import Any

from ..errors import MetaSDConfigError, MetaSDTypeError, UnknownPolicyError, UnknownPolicySettingError
from .base import Policy
from .mapping import POLICY_REGISTRY

__all__ = ["POLICY_REGISTRY", "get_policy", "register_policy"]


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


def get_policy(policy: str | Policy, settings: Mapping[str, Any] | None = None, /, **kwargs: Any) -> Policy:
    """A `Policy` from a registered name (a fresh instance built with the settings) or an instance (returned as is).

    Settings come as keyword arguments (``get_policy("ucb", beta=0.5)``), as a mapping in second place
    (``get_policy("ucb", {"beta": 0.5})``, what a caller holding ``meta_policy_kwargs`` passes), or both. Unknown
    setting names raise `UnknownPolicySettingError` listing the policy's settings; a mapping that is not one (e.g.
    the string ``"beta=1"``) raises a `TypeError`.

    Example:
        >>> from hf_metasd.policies import get_policy
        >>> get_policy("ucb", {"beta": 0.5})
        UCB(beta=0.5, seed=None)
        >>> get_policy("ucb", betta=1)
        Traceback (most recent call last):
        ...
        hf_metasd.errors.UnknownPolicySettingError: `meta_policy_kwargs` for 'ucb' must use the settings ['beta', 'seed'], but has unknown 'betta'. Did you mean 'beta'? See `help(UCB)` for what each setting does.
    """
    merged = _merge_settings(settings, kwargs)
    if isinstance(policy, Policy):
        if merged:
            raise MetaSDConfigError(
                f"`meta_policy_kwargs` must be empty when `meta_policy` is an instance, but is {merged!r}. "
                "Set the settings when you build the policy."
            )
        return policy
    if not isinstance(policy, str):
        raise MetaSDTypeError(
            f"`meta_policy` must be a registered name or a `Policy` instance, but is {type(policy).__name__} "
            f"{policy!r}. "
            f"Use one of {sorted(POLICY_REGISTRY)} or subclass `hf_metasd.policies.Policy`."
        )
    if policy not in POLICY_REGISTRY:
        raise UnknownPolicyError(
            f"`meta_policy` must be one of {sorted(POLICY_REGISTRY)}, but is {policy!r}. "
            "Pick a registered name or register yours with `hf_metasd.register_policy`."
        )
    cls = POLICY_REGISTRY[policy]
    _check_setting_names(policy, cls, merged)
    return cls(**merged)


def _merge_settings(settings: object, kwargs: dict[str, Any]) -> dict[str, Any]:
    """One dict of settings from the optional mapping and the keyword arguments."""
    if settings is None:
        return dict(kwargs)
    if not isinstance(settings, Mapping):
        raise MetaSDTypeError(
            f"`meta_policy_kwargs` must be a dict of settings, but is {type(settings).__name__} {settings!r}. "
            "Pass a dict, e.g. `meta_policy_kwargs={'beta': 1.0}`."
        )
    bad = [key for key in settings if not isinstance(key, str)]
    if bad:
        raise MetaSDTypeError(
            f"`meta_policy_kwargs` must have setting names (str) as keys, but has {bad[0]!r}. "
            "Use the names of the policy's settings, e.g. {'beta': 1.0}."
        )
    twice = sorted(set(settings) & set(kwargs))
    if twice:
        raise MetaSDTypeError(
            f"`get_policy` settings must be given once, but {twice[0]!r} is both in the mapping and a keyword. "
            "Pass it in one place."
        )
    return {**settings, **kwargs}


def _setting_names(cls: type[Policy]) -> list[str] | None:
    """The keyword arguments `cls` accepts (its settings and `seed`), or None when it takes ``**kwargs``."""
    names = []
    for param in inspect.signature(cls).parameters.values():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            return None
        if param.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            names.append(param.name)
    return names


def _check_setting_names(policy: str, cls: type[Policy], settings: Mapping[str, Any]) -> None:
    valid = _setting_names(cls)
    if valid is None:
        return
    unknown = [key for key in settings if key not in valid]
    if not unknown:
        return
    guesses = [match for key in unknown for match in difflib.get_close_matches(key, valid, n=1)]
    guess = f"Did you mean {', '.join(repr(g) for g in guesses)}? " if guesses else ""
    raise UnknownPolicySettingError(
        f"`meta_policy_kwargs` for {policy!r} must use the settings {sorted(valid)}, but has unknown "
        f"{', '.join(repr(k) for k in unknown)}. {guess}See `help({cls.__name__})` for what each setting does."
    )
