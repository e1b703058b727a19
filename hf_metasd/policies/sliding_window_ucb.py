"""Sliding-window UCB: UCB on the last W rounds only, for drafters whose quality changes abruptly."""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Mapping
from typing import Any

from .._validation import check_int, check_real
from .base import PolicySettings, _log_or_zero, setting
from .registry import register_policy
from .ucb import UCB

__all__ = ["SlidingWindowUCB", "SlidingWindowUCBSettings"]


@dataclasses.dataclass(frozen=True)
class SlidingWindowUCBSettings(PolicySettings):
    """Settings of `SlidingWindowUCB`."""

    window: int = setting(
        500,
        "rounds remembered, >= 1; smaller adapts faster but re-explores more",
        check_int,
        low=1,
        hint="Use 500 (rounds remembered).",
    )
    beta: float = setting(
        0.25, "exploration weight beta >= 0; larger explores more, 0 is greedy", check_real, low=0.0, hint="Use 0.25."
    )


@register_policy
class SlidingWindowUCB(UCB):
    r"""Sliding-window UCB (SW-UCB, Garivier & Moulines, 2011), with MetaSD-UCB's bonus.

    Only the last *W* rounds count. With :math:`N_i(W)` the number of those rounds drafted by drafter *i* and
    :math:`S_i(W)` their summed reward, each round picks (after pulling every drafter once, in pool order)

    .. math:: i_t = \arg\max_i \; \frac{S_i(W)}{N_i(W)} + \beta \sqrt{2 \ln \min(t, W) / N_i(W)}

    where *t* is the number of rounds so far. A drafter absent from the window has index ``inf``, so each drafter
    drafts at least once every *W* rounds: a drafter that improved is noticed within about *W* rounds. With
    :math:`W \ge` the run length this is exactly `ucb`. Ties go to the lowest index. Rewards must lie in ``[0, 1]``.

    Prior (`set_prior`): drafter *i*'s prior mean counts as *w* observations made before the first round, so it is
    in the window for the first *W* rounds (:math:`t < W`) only: it adds *w* to :math:`N_i(W)`, :math:`w m_i` to
    :math:`S_i(W)` and all pseudo-observations to :math:`\min(t, W)`, then leaves with the round that fills the
    window.

    Args:
        window: :math:`W \ge 1`, rounds remembered. Smaller adapts faster to a change but re-explores more often and
            has noisier means; larger is steadier.
        beta: exploration weight :math:`\beta \ge 0`. Larger explores more; ``0`` is greedy on the window means.
        seed: unused (deterministic); accepted for a uniform interface.

    Defaults. With :math:`\ln \min(t, W)` capped at :math:`\ln W` the bonus never shrinks the way UCB's does, so
    :math:`\beta = 1` keeps re-exploring: in `hf_metasd.benchmark.simulate` (stationary rates 0.8 / 0.6 / 0.4, 5 drafted tokens,
    noise-free BD reward, 8000 tokens, 5 seeds, W = 500) :math:`\beta = 1` drafted 25% of the rounds with worse
    drafters, :math:`\beta = 0.25` 4%. Hence :math:`\beta = 0.25`; rerun ``recipes/studies/simulate_regret.py`` to compare on
    your own rates.

    Example:
        >>> from hf_metasd.policies import SlidingWindowUCB
        >>> policy = SlidingWindowUCB(window=2, beta=0.0)
        >>> policy.reset(num_arms=2)
        >>> for arm, r in [(0, 0.9), (1, 0.5), (1, 0.4)]:
        ...     policy.update(arm, r)
        >>> policy.window_counts(), policy.select()   # drafter 0 fell out of the window: its index is inf
        ([0, 2], 0)
    """

    name = "sliding_window_ucb"
    learns_side_observations = False  # its discount / window is about pulls
    settings_class = SlidingWindowUCBSettings

    def __init__(self, window: int = 500, beta: float = 0.25, *, seed: int | None = None) -> None:
        self._configure(seed, window=window, beta=beta)
        self.history: deque[tuple[int, float]] = deque(maxlen=self.window)
        self._wcounts: list[int] = []
        self._wsums: list[float] = []

    def reset(self, num_arms: int) -> None:
        super().reset(num_arms)
        self.history = deque(maxlen=self.window)
        self._recount()

    def _observe(self, arm: int, reward: float) -> None:
        super()._observe(arm, reward)
        if len(self.history) == self.window:
            old_arm, old_r = self.history[0]
            self._wcounts[old_arm] -= 1
            self._wsums[old_arm] -= old_r
        self.history.append((arm, reward))
        self._wcounts[arm] += 1
        self._wsums[arm] += reward
        if self._wcounts[arm] == 1:  # restart the running sum: no round-off carried over from evicted rounds
            self._wsums[arm] = reward

    def _recount(self) -> None:
        self._wcounts = [0] * (self.num_arms or 0)
        self._wsums = [0.0] * (self.num_arms or 0)
        for arm, r in self.history:
            self._wcounts[arm] += 1
            self._wsums[arm] += r

    def window_counts(self) -> list[int]:
        """:math:`N_i(W)` for every drafter."""
        self._check_ready()
        return list(self._wcounts)

    def window_sums(self) -> list[float]:
        """:math:`S_i(W)` for every drafter."""
        self._check_ready()
        return list(self._wsums)

    def scores(self) -> list[float]:
        """The SW-UCB index of every drafter (``inf`` for drafters absent from the window, prior included)."""
        counts, sums = self.window_counts(), self.window_sums()
        horizon = min(self.t, self.window)
        if self.prior_means is not None and self.t < self.window:  # the prior has not left the window yet
            counts = [n + p for n, p in zip(counts, self.prior_counts)]
            sums = [s + p for s, p in zip(sums, self.prior_sums)]
            horizon += sum(self.prior_counts)
        log_h = _log_or_zero(horizon)
        return [s / n + self.beta * math.sqrt(2.0 * log_h / n) if n else math.inf for s, n in zip(sums, counts)]

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["history"] = [[arm, r] for arm, r in self.history]
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.history = deque(((int(a), float(r)) for a, r in state["history"]), maxlen=self.window)
        self._recount()
