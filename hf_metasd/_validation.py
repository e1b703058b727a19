"""The argument checks every hf_metasd module uses (private).

Every message has the shape "`arg` must X, but is V. Do Y." so that a user sees what to change. Each check returns
the value it accepted (converted where it says so), so that a caller validates and assigns in one line.

Example:
    >>> from hf_metasd._validation import check_choice, check_int, check_real
    >>> check_real("beta", 1, low=0.0, hint="Use 1.0.")
    1.0
    >>> check_int("window", 0, low=1, hint="Use 500.")
    Traceback (most recent call last):
    ...
    ValueError: `window` must be an int >= 1, but is 0. Use 500.
    >>> check_choice("reward", "tv", ("bd", "be"))
    Traceback (most recent call last):
    ...
    ValueError: `reward` must be one of ['bd', 'be'], but is 'tv'. Pick one of those.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["UNIT_TOLERANCE", "check_bool", "check_choice", "check_int", "check_real", "check_unit_reward"]

#: Rewards a hair outside [0, 1] (float round-off in a reward computed in half precision) are clipped, not refused.
UNIT_TOLERANCE = 1e-6


def check_real(
    name: str,
    value: object,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    hint: str,
) -> float:
    """`value` as a finite float within the given bounds, or a `ValueError` naming `name` and `hint`."""
    lo = "-inf" if low is None else f"{low:g}"
    hi = "inf" if high is None else f"{high:g}"
    interval = f"{'(' if low_open or low is None else '['}{lo}, {hi}{')' if high_open or high is None else ']'}"
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        v = float(value)
        if low is not None and (v < low or (low_open and v == low)):
            ok = False
        if high is not None and (v > high or (high_open and v == high)):
            ok = False
    if not ok:
        raise ValueError(f"`{name}` must be a float in {interval}, but is {value!r}. {hint}")
    return float(value)


def check_int(name: str, value: object, *, low: int, hint: str, error: type[Exception] = ValueError) -> int:
    """`value` as an int ``>= low`` (bools refused), or a `ValueError` naming `name` and `hint`."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise error(f"`{name}` must be an int >= {low}, but is {value!r}. {hint}")
    return value


def check_bool(name: str, value: object, *, hint: str) -> bool:
    """`value` if it is a bool (``0`` / ``1`` and strings refused), else a `TypeError` naming `name` and `hint`.

    Example:
        >>> check_bool("flag", "yes", hint="Pass True or False.")
        Traceback (most recent call last):
        ...
        TypeError: `flag` must be a bool, but is 'yes'. Pass True or False.
    """
    if not isinstance(value, bool):
        raise TypeError(f"`{name}` must be a bool, but is {value!r}. {hint}")
    return value


def check_choice(name: str, value: object, choices: Iterable[object], *, hint: str = "Pick one of those.") -> object:
    """`value` if it is one of `choices`, else a `ValueError` listing them (in the order given)."""
    options = list(choices)
    if value not in options:
        raise ValueError(f"`{name}` must be one of {options}, but is {value!r}. {hint}")
    return value


def check_unit_reward(policy: str, reward: float, *, name: str = "reward", high: float = 1.0) -> float:
    """`reward` clipped to ``[0, high]``; a `ValueError` if it is further than `UNIT_TOLERANCE` outside.

    `high` is 1 for every built-in policy but UCB-V, whose reward range `b` is a setting; `name` is the argument as
    the caller sees it (``rewards[2]`` for a full-information report).

    Example:
        >>> check_unit_reward("ucb", 1.0 + 1e-9)
        1.0
        >>> check_unit_reward("ucb", 2.0)
        Traceback (most recent call last):
        ...
        ValueError: `reward` must be in [0, 1] for the 'ucb' policy, but is 2.0. Use a reward in [0, 1] (BE, BD or the normalised cost reward) or rescale yours.
    """
    r = float(reward)
    if not (-UNIT_TOLERANCE <= r <= high + UNIT_TOLERANCE):
        if high == 1.0:
            fix = "Use a reward in [0, 1] (BE, BD or the normalised cost reward) or rescale yours."
        else:
            fix = f"Use a reward in [0, {high:g}], or set the policy's reward range to cover yours."
        raise ValueError(f"`{name}` must be in [0, {high:g}] for the {policy!r} policy, but is {r!r}. {fix}")
    return min(high, max(0.0, r))
