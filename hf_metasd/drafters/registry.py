"""The registry of drafter kinds: kind name -> `Drafter` subclass, filled by one call per kind.

A pool's `config.json` names each entry's kind; loading it looks the kind up here (`DRAFTER_KINDS`). Every built-in
kind registers itself once, when its module is imported (``@register_drafter_kind``); a kind of your own registers the
same way before a pool that uses it is saved or loaded. A name names one kind: registering another class under a name
already taken is refused (as peft's ``register_peft_method`` refuses a second method of the same name), so that a
pool never loads with a class other than the one it was saved with.
"""

from __future__ import annotations

from typing import TypeVar

from ..errors import DuplicateDrafterKindError
from .base import Drafter

__all__ = ["DRAFTER_KINDS", "register_drafter_kind"]

#: kind name -> Drafter subclass (used by pool configs). Each kind module registers itself.
DRAFTER_KINDS: dict[str, type[Drafter]] = {}

D = TypeVar("D", bound=type[Drafter])


def register_drafter_kind(cls: D) -> D:
    """Register a `Drafter` subclass under its `kind` (a class decorator); returns the class.

    Registering the class that already holds the name again changes nothing; another class under a taken name is
    refused with `DuplicateDrafterKindError` (a `ValueError`).

    Example:
        >>> from hf_metasd.drafters import PromptLookupDrafter
        >>> class MyLookup(PromptLookupDrafter):
        ...     kind = "prompt_lookup"
        >>> register_drafter_kind(MyLookup)
        Traceback (most recent call last):
        ...
        hf_metasd.errors.DuplicateDrafterKindError: `kind` must be a name not yet registered, but 'prompt_lookup' is registered by hf_metasd.drafters.prompt_lookup.PromptLookupDrafter. Give `MyLookup.kind` another name.
    """
    if not (isinstance(cls, type) and issubclass(cls, Drafter)):
        raise TypeError(
            f"`cls` must be a subclass of `Drafter`, but is {cls!r}. Subclass `hf_metasd.drafters.Drafter`."
        )
    kind = cls.kind
    if not isinstance(kind, str):
        raise TypeError(f"`{cls.__name__}.kind` must be a string, but is {kind!r}. Set `kind` to a name.")
    if not kind:
        raise ValueError(f"`{cls.__name__}.kind` must be a non-empty string, but is {kind!r}. Set `kind`.")
    existing = DRAFTER_KINDS.get(kind)
    if existing is not None and existing is not cls:
        raise DuplicateDrafterKindError(
            f"`kind` must be a name not yet registered, but {kind!r} is registered by "
            f"{existing.__module__}.{existing.__qualname__}. Give `{cls.__name__}.kind` another name."
        )
    DRAFTER_KINDS[kind] = cls
    return cls
