"""The simulator's drafters: a `Scenario` (acceptance rates per segment, draft length, costs, per-position noise)
and how one simulated round is drawn and rewarded (the model in `hf_metasd.benchmark.simulate`'s docstring)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._validation import check_choice
from ..rewards import block_efficiency, speed

__all__ = ["REWARD_KINDS", "Scenario"]

#: Rewards the simulator can hand to a policy.
REWARD_KINDS = ("bd", "be", "cost")
#: What a regret is measured in: rounds (stopping time) or simulated wall time.
MEASURES = ("rounds", "wall_time")


# ---------------------------------------------------------------------------------------------------- scenario
@dataclass(frozen=True)
class Scenario:
    r"""Simulated drafters: acceptance rates (per segment), draft length, costs and per-position noise.

    Args:
        alphas: one tuple of per-drafter acceptance rates :math:`\alpha_i \in [0, 1]` per *segment*; segment 0 holds
            from the first token, segment *k* from token ``switch_at[k - 1]`` on.
        switch_at: increasing positive token counts where the next segment starts (``len(alphas) - 1`` of them). A
            round uses the segment of the tokens produced *before* it.
        draft_length: :math:`N`, tokens drafted per round.
        costs: :math:`c_i \ge 0`, each drafter's cost per drafted token relative to one target forward (default all
            0: only rounds matter).
        concentration: ``None`` for :math:`a_j = \alpha_i`, else the Beta concentration ``c > 0`` of the per-position
            acceptance probabilities (smaller is noisier). See the module docstring.
        name: a label for reports.

    Example:
        >>> s = Scenario.switching([0.8, 0.4], [0.4, 0.8], switch_at=1000)
        >>> s.num_arms, s.segment_at(999), s.segment_at(1000), s.best_arm(1)
        (2, 0, 1, 1)
        >>> round(Scenario.stationary([0.5], draft_length=2).expected_tokens(0), 4)   # 1 + 0.5 + 0.25
        1.75
    """

    alphas: tuple[tuple[float, ...], ...]
    switch_at: tuple[int, ...] = ()
    draft_length: int = 5
    costs: tuple[float, ...] | None = None
    concentration: float | None = None
    name: str = ""

    def __post_init__(self) -> None:
        segments = tuple(tuple(float(a) for a in seg) for seg in self.alphas)
        if not segments or not segments[0]:
            raise ValueError(
                f"`alphas` must hold at least one segment of at least one drafter, but is {self.alphas!r}. "
                "Use e.g. `Scenario.stationary([0.8, 0.5])`."
            )
        k = len(segments[0])
        for s, seg in enumerate(segments):
            if len(seg) != k:
                raise ValueError(
                    f"`alphas[{s}]` must have one rate per drafter ({k}), but has {len(seg)}. Give every segment "
                    "the same drafters."
                )
            bad = [a for a in seg if not (0.0 <= a <= 1.0)]
            if bad:
                raise ValueError(f"`alphas[{s}]` must be acceptance rates in [0, 1], but holds {bad[0]!r}. Fix it.")
        switch_at = tuple(int(x) for x in self.switch_at)
        if (
            len(switch_at) != len(segments) - 1
            or any(x <= 0 for x in switch_at)
            or list(switch_at) != sorted(set(switch_at))
        ):
            raise ValueError(
                f"`switch_at` must be {len(segments) - 1} increasing positive token counts (one per segment after "
                f"the first), but is {self.switch_at!r}. Give one switch point between consecutive segments."
            )
        if not isinstance(self.draft_length, int) or isinstance(self.draft_length, bool) or self.draft_length < 1:
            raise ValueError(
                f"`draft_length` must be an int >= 1, but is {self.draft_length!r}. Use 5 (tokens per round)."
            )
        costs = None
        if self.costs is not None:
            costs = tuple(float(c) for c in self.costs)
            if len(costs) != k or any(not (math.isfinite(c) and c >= 0) for c in costs):
                raise ValueError(
                    f"`costs` must be {k} finite costs >= 0 (one per drafter), but is {self.costs!r}. Give each "
                    "drafter's cost per drafted token relative to one target forward."
                )
        if self.concentration is not None and not (
            isinstance(self.concentration, (int, float))
            and not isinstance(self.concentration, bool)
            and math.isfinite(self.concentration)
            and self.concentration > 0
        ):
            raise ValueError(
                f"`concentration` must be a finite float > 0 or None, but is {self.concentration!r}. Use None for no "
                "per-position noise or e.g. 20."
            )
        object.__setattr__(self, "alphas", segments)
        object.__setattr__(self, "switch_at", switch_at)
        object.__setattr__(self, "costs", costs)

    @classmethod
    def stationary(cls, alphas: Sequence[float], **kwargs: Any) -> Scenario:
        """Drafters whose acceptance rates never change."""
        kwargs.setdefault("name", "stationary")
        return cls(alphas=(tuple(alphas),), **kwargs)

    @classmethod
    def switching(cls, before: Sequence[float], after: Sequence[float], switch_at: int, **kwargs: Any) -> Scenario:
        """Rates `before` until `switch_at` tokens were produced, `after` from then on."""
        kwargs.setdefault("name", "switching")
        return cls(alphas=(tuple(before), tuple(after)), switch_at=(switch_at,), **kwargs)

    @property
    def num_arms(self) -> int:
        return len(self.alphas[0])

    def segment_at(self, tokens: int) -> int:
        """Index of the segment in force once `tokens` tokens were produced."""
        segment = 0
        for boundary in self.switch_at:
            if tokens >= boundary:
                segment += 1
        return segment

    def cost(self, arm: int) -> float:
        return self.costs[arm] if self.costs is not None else 0.0

    def round_time(self, arm: int) -> float:
        """Simulated wall time of one round of `arm`: :math:`N c_i + 1` target forwards."""
        return self.draft_length * self.cost(arm) + 1.0

    def expected_tokens(self, arm: int, segment: int = 0) -> float:
        r""":math:`1 + \sum_{k=1}^{N} \alpha^k`, the expected tokens of one round of `arm`."""
        alpha = self.alphas[segment][arm]
        return 1.0 + sum(alpha**k for k in range(1, self.draft_length + 1))

    def best_arm(self, segment: int = 0, measure: str = "rounds") -> int:
        """The oracle's drafter: most expected tokens per round (``rounds``) or per unit time (``wall_time``)."""
        check_choice("measure", measure, MEASURES)
        k = self.num_arms
        if measure == "rounds":
            values = [self.alphas[segment][i] for i in range(k)]
        else:
            values = [self.expected_tokens(i, segment) / self.round_time(i) for i in range(k)]
        return max(range(k), key=lambda i: (values[i], -i))


# ---------------------------------------------------------------------------------------------------- result
class _Streams:
    """Common random numbers: one `random.Random` per (seed, stream), derived with numpy's `SeedSequence`."""

    def __init__(self, seed: int, count: int) -> None:
        states = np.random.SeedSequence(seed).spawn(count)
        self.rngs = [random.Random(int(s.generate_state(1, dtype=np.uint64)[0])) for s in states]


def _draw_round(rng: random.Random, alpha: float, n: int, concentration: float | None) -> tuple[int, float]:
    """``(accepted, bd)`` of one simulated round; always consumes the same number of draws per round."""
    if concentration is None or alpha in (0.0, 1.0):
        probs = [alpha] * n
    else:
        probs = [rng.betavariate(concentration * alpha, concentration * (1.0 - alpha)) for _ in range(n)]
    accepted = n
    for j, p in enumerate(probs):
        if not rng.random() < p:
            accepted = j
            for _ in range(n - j - 1):  # keep the stream aligned: every round uses n uniforms
                rng.random()
            break
    return accepted, sum(probs) / n


def _reward_of(kind: str, accepted: int, bd: float, n: int, round_time: float) -> float:
    """The reward `kind` of a simulated round (the library's own reward functions; `round_time` in target steps)."""
    if kind == "be":
        return block_efficiency(accepted, n)
    if kind == "bd":
        return bd
    return speed(accepted, n, arm_seconds=round_time, plain_seconds=1.0)
