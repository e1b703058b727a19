r"""How a round spends the verification pass's width: which arms draft into the tree, and how many tokens each.

A round of one arm :math:`a` drafting :math:`n` tokens gains :math:`E_a(n) = 1 + \sum_{k \le n} \prod_{j \le k}
p_{a,j}` tokens in expectation (`hf_metasd.draft_length`) for :math:`n\,\hat d_a + \hat v(n + 1)` seconds. A tree of
several arms' chains :math:`S = \{(a, n_a)\}` keeps the longest accepted path, so it gains

.. math::

    E(S) = 1 + \sum_{k \ge 1} \Bigl(1 - \prod_{(a, n_a) \in S} \bigl(1 - [k \le n_a] \textstyle\prod_{j \le k}
    p_{a,j}\bigr)\Bigr)

tokens if the arms' acceptances are independent (arms that agree share nodes, so the tree is then narrower and
cheaper than its bound below; the model is optimistic about arms that would agree), and costs at most

.. math:: c(S) = \sum_{(a, n_a) \in S} n_a\, \hat d_a + \hat v\bigl(1 + \textstyle\sum n_a\bigr)

seconds, with :math:`\hat v(k)` the measured pass cost over :math:`k` tokens on this machine and dtype. The round's
plan (`choose_tree`) starts from the policy's arm and its length (what a chain round drafts) and adds, one at a time,
the arm and length that raise :math:`E(S) / c(S)` the most, while one raises it. Where the pass's width is dear
(:math:`\hat v` grows with :math:`k` about as fast as tokens are gained) nothing is added and the round is today's
chain; where it is cheap (a GPU's pass over a few tokens costs about one token's), arms are mixed.

**Widths not measured yet** (`extrapolate`): a pass wider than any measured one is priced on the line through the
narrowest and the widest measured passes, :math:`\hat v(k) = \hat v(K) + (k - K)\,\max(0, (\hat v(K) -
\hat v(k_0)) / (K - k_0))`, and not at all before two widths are measured (the round is then a chain). A machine
whose chain passes grow dear with their tokens is so never asked to try wide trees, and one whose passes cost the
same at every length tries them at once; once measured, a width reads its own cost.

**Optimism for arms seen little** (`optimistic_rates`): an arm's rates are raised by
:math:`c / \sqrt{1 + T_{a,j}}` (at most 1), with :math:`T_{a,j}` the rounds that reached its position :math:`j`:
an arm rarely verified looks better than its estimate, so it joins trees where width is cheap, and every arm in a
tree is verified, which lowers its bonus. :math:`c` (`exploration`) larger explores more; 0 trusts the estimates.

Example:
    >>> expected_tokens([[0.5, 0.5]])              # 1 + 0.5 + 0.25
    1.75
    >>> expected_tokens([[0.5], [0.5]])            # either of two independent arms: 1 + 0.75
    1.75
    >>> flat = [1.0] * 9                           # a pass costs the same at every width: mix
    >>> choose_tree((0, 2), {0: [0.5, 0.5], 1: [0.6, 0.6]}, {}, flat, cap=2)
    [(0, 2), (1, 2)]
    >>> linear = [float(k) for k in range(1, 10)]  # a pass costs its width: the chain
    >>> choose_tree((0, 2), {0: [0.5, 0.5], 1: [0.6, 0.6]}, {}, linear, cap=2)
    [(0, 2)]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = ["MAX_TREE_ARMS", "choose_tree", "expected_tokens", "extrapolate", "optimistic_rates", "plan_seconds"]

#: The most arms one tree holds.
MAX_TREE_ARMS = 4


def expected_tokens(chains: Sequence[Sequence[float]]) -> float:
    """:math:`E(S)`: the expected tokens of a round whose tree holds chains with these acceptance rates (one list
    per arm, one rate per drafted position), the arms taken as independent."""
    survive = [1.0] * len(chains)
    total = 1.0
    for k in range(max((len(c) for c in chains), default=0)):
        miss = 1.0
        for i, rates in enumerate(chains):
            survive[i] = survive[i] * rates[k] if k < len(rates) else 0.0
            miss *= 1.0 - survive[i]
        total += 1.0 - miss
    return total


def plan_seconds(
    plan: Sequence[tuple[int, int]], draft_seconds: Mapping[int, float], verify: Sequence[float | None]
) -> float | None:
    """:math:`c(S)`: drafting plus the pass over the plan's width bound (`verify[k - 1]` is :math:`\\hat v(k)`);
    ``None`` when that width's cost is unknown or beyond `verify`."""
    width = 1 + sum(n for _, n in plan)
    if width > len(verify) or verify[width - 1] is None:
        return None
    return sum(n * draft_seconds.get(arm, 0.0) for arm, n in plan) + float(verify[width - 1])


def _value(plan, rates, draft_seconds, verify) -> float | None:
    seconds = plan_seconds(plan, draft_seconds, verify)
    if seconds is None or seconds <= 0.0:
        return None
    return expected_tokens([rates[arm][:n] for arm, n in plan]) / seconds


def choose_tree(
    primary: tuple[int, int],
    rates: Mapping[int, Sequence[float]],
    draft_seconds: Mapping[int, float],
    verify: Sequence[float | None],
    *,
    cap: int,
    max_arms: int = MAX_TREE_ARMS,
) -> list[tuple[int, int]]:
    """The round's plan ``[(arm, length), ...]``, the `primary` ``(arm, length)`` first (see the module docstring).

    Args:
        primary: the policy's arm and the length chosen for it.
        rates: per eligible arm (the primary among them), its (optimistic) acceptance rates at positions
            ``1 .. cap``.
        draft_seconds: per arm, seconds of drafting per token (missing: 0).
        verify: :math:`\\hat v(k)` for ``k = 1 ..`` (``None``: unknown); a plan wider than it is not considered.
        cap: the most tokens one arm drafts.
        max_arms: the most arms in the tree.
    """
    plan = [primary]
    value = _value(plan, rates, draft_seconds, verify)
    if value is None:
        return plan
    while len(plan) < max_arms:
        best, best_value = None, value
        used = {arm for arm, _ in plan}
        for arm in rates:
            if arm in used:
                continue
            for n in range(1, min(cap, len(rates[arm])) + 1):
                candidate = _value([*plan, (arm, n)], rates, draft_seconds, verify)
                if candidate is not None and candidate > best_value:
                    best, best_value = (arm, n), candidate
        if best is None:
            return plan
        plan.append(best)
        value = best_value
    return plan


def optimistic_rates(rates: Sequence[float], tried: Sequence[float], exploration: float) -> list[float]:
    """`rates` raised by ``exploration / sqrt(1 + tried[j])`` (at most 1); `tried[j]` missing counts 0.

    Example:
        >>> optimistic_rates([0.5, 0.5], [3.0], 0.2)
        [0.6, 0.7]
    """
    return [
        min(1.0, p + exploration / math.sqrt(1.0 + (tried[j] if j < len(tried) else 0.0))) for j, p in enumerate(rates)
    ]


def extrapolate(verify: Sequence[float | None], measured: Mapping[int, float]) -> list[float | None]:
    """`verify` (:math:`\\hat v(k)` for ``k = 1 ..``, as `DraftLength.verification_seconds` reads it) with every
    width beyond the widest `measured` one (width -> smoothed seconds) priced on the line through the narrowest and
    the widest measured ones, or unknown (``None``) while fewer than two widths are measured (module docstring).

    Example:
        >>> extrapolate([1.0, 2.0, 2.0, 2.0], {1: 1.0, 2: 2.0})   # the guesses past width 2 were 2.0
        [1.0, 2.0, 3.0, 4.0]
        >>> extrapolate([1.0, 1.0, 1.0], {1: 1.0, 2: 0.9})        # no slope: the widest's cost
        [1.0, 1.0, 0.9]
        >>> extrapolate([1.0, 1.0, 1.0], {2: 1.0})                # one width measured: no line yet
        [1.0, 1.0, None]
    """
    narrowest, widest = min(measured, default=0), max(measured, default=0)
    if narrowest == widest:
        return [v if k <= widest else None for k, v in enumerate(verify, start=1)]
    slope = max(0.0, (measured[widest] - measured[narrowest]) / (widest - narrowest))
    return [v if k <= widest else measured[widest] + (k - widest) * slope for k, v in enumerate(verify, start=1)]
