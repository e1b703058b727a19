"""`PolicySettings`, a policy's knobs as a small frozen dataclass validated when built, and `setting`, one field of
it (mabwiser's habit): default, help text and check in one place."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

__all__ = ["PolicySettings", "setting"]


def setting(default: Any, help: str, check: Callable[..., Any], **check_kwargs: Any) -> Any:
    """A field of a `PolicySettings` subclass: its default, its ``help`` text and how `PolicySettings` validates it.

    `check` is one of `hf_metasd._validation`'s checks (`check_real`, `check_int`), called as
    ``check(name, value, **check_kwargs)`` when the settings are built; the value it returns (e.g. an int converted
    to a float) is the one stored. The check and its arguments live in the field's metadata (``"check"``), next to
    ``"help"``.

    Example:
        >>> from hf_metasd._validation import check_int
        >>> @dataclasses.dataclass(frozen=True)
        ... class WindowSettings(PolicySettings):
        ...     window: int = setting(500, "rounds remembered, >= 1", check_int, low=1, hint="Use 500.")
        >>> WindowSettings().window, WindowSettings.describe()
        (500, {'window': 'rounds remembered, >= 1'})
        >>> WindowSettings(window=0)
        Traceback (most recent call last):
        ...
        ValueError: `window` must be an int >= 1, but is 0. Use 500.
    """
    return dataclasses.field(
        default=default, metadata={"help": help, "check": functools.partial(check, **check_kwargs)}
    )


@dataclasses.dataclass(frozen=True)
class PolicySettings:
    """The settings of a policy: a small frozen dataclass, validated when built (mabwiser's habit).

    Each built-in policy has one subclass (`UCBSettings`, `EXP3Settings`, ...) whose fields are the policy's
    constructor arguments except `seed`, each declared with `setting` (default, ``help`` text, check); `Policy.config`
    is derived from it, and the policy reads each field as a read-only attribute, so every setting is written once.
    ``__post_init__`` runs every field's check (in field order) and stores the value it returns. This base class has
    no field: the settings of a policy without knobs.

    Example:
        >>> from hf_metasd.policies import UCBSettings
        >>> UCBSettings(beta=0.5).to_dict(), UCBSettings.describe()["beta"][:18]
        ({'beta': 0.5}, 'exploration weight')
    """

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            check = field.metadata.get("check")
            if check is not None:
                self._set(field.name, check(field.name, getattr(self, field.name)))

    def to_dict(self) -> dict[str, Any]:
        """The settings as a plain dict, in field order."""
        return dataclasses.asdict(self)

    @classmethod
    def describe(cls) -> dict[str, str]:
        """Field name -> its ``help`` text."""
        return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}

    def _set(self, name: str, value: Any) -> None:
        """Store a validated (possibly converted, e.g. int -> float) value on the frozen instance."""
        object.__setattr__(self, name, value)
