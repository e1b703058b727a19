"""Small validators shared by the built-in policies (private).

Every message has the shape "`arg` must X, but is V. Do Y." so that a user sees what to change.
"""

from __future__ import annotations

import math

__all__ = ["check_int", "check_real", "check_unit_reward"]

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


def check_int(name: str, value: object, *, low: int, hint: str) -> int:
    """`value` as an int ``>= low`` (bools refused), or a `ValueError` naming `name` and `hint`."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"`{name}` must be an int >= {low}, but is {value!r}. {hint}")
    return value


def check_unit_reward(policy: str, reward: float) -> float:
    """`reward` clipped to ``[0, 1]``; a `ValueError` if it is further than `UNIT_TOLERANCE` outside."""
    r = float(reward)
    if not (-UNIT_TOLERANCE <= r <= 1.0 + UNIT_TOLERANCE):
        raise ValueError(
            f"`reward` must be in [0, 1] for the {policy!r} policy, but is {r!r}. "
            "Use a reward in [0, 1] (BE, BD or the normalised cost reward) or rescale yours."
        )
    return min(1.0, max(0.0, r))
