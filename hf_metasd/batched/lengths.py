r"""What a row's round costs in a batch: the shared pass measured by its total width, and each row's share of it.

One pass verifies every row that still decodes: :math:`R` rows of :math:`K` columns each (a row's last token and the
round's longest draft; shorter drafts are padded). Its cost grows with the total width :math:`T = R K`: on a CPU a pass
over a few tokens costs about a plain step (the weights are read once), but eight rows of four tokens are 32 tokens,
and past some width every token costs its compute. So the batch measures its passes by total width
(`PassCosts`: :math:`\hat V(T)`, smoothed, kept per process, target and batch size, interpolated between the
widths measured), and each row is given its **share**

.. math:: \hat v_R(k) = \hat V(R\,k) / R,

the cost per row of a pass in which every one of the :math:`R` rows verifies :math:`k` tokens, as it would be if every
row did as this one does. For passes that cost :math:`a + b\,T` it is :math:`a / R + b\,k`: the pass's fixed part
split between its rows, plus the row's marginal cost, the :math:`b\,k` its own tokens add (the marginal cost alone
cannot rank lengths: where a pass is all fixed cost, every length would cost nothing). The share is the row's

* **draft length** (`RowLengths`): the row's `DraftLength` chooses with :math:`\hat v_R(k)` as its verification
  cost, so a length pays only if its expected tokens beat what :math:`R` such rows cost. When the pass is dominated by
  a fixed cost (:math:`\hat V` flat) that is the single request's choice; when every token costs its compute
  (:math:`\hat V(T) \propto T`) a draft of :math:`n` costs :math:`n + 1` plain shares, which no draft repays (at most
  :math:`n + 1` tokens), and rows draft short;
* **clock** (`hf_metasd.batched.loop.RowClocks`): during a pass of :math:`K` columns that took :math:`S` seconds
  a row that verified :math:`k` tokens is charged :math:`(S / R) \min(1, \hat V(R k) / \hat V(R K))`: its share, scaled
  by how the pass went against its estimate. Its round costs, and so its policy's `speed` rewards, are what its own
  choice costs the batch, and a row's no-draft arm costs :math:`\hat v_R(1)` however far the other rows draft: once
  verifying more tokens costs more than they bring, the policy falls back to no-draft.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Hashable, Sequence
from typing import Any

from ..costs import cost_key
from ..draft_length import DraftLength

__all__ = ["MAX_PLAIN_CALLS", "DraftingGuard", "GuardMemory", "PassCosts", "RowLengths"]


class PassCosts:
    """The batch's passes: smoothed seconds by total width ``T`` (rows x columns), and each row's share.

    A width measured reads its smoothed seconds; one between two measured widths their linear interpolation; one
    below the narrowest measured :math:`T_0` reads :math:`\\hat V(T_0)\\, T / T_0` and one above the widest its
    seconds (a wider pass is taken to cost no less, a narrower one at least its share per token): optimistic at both
    ends, so that a length that might pay is tried before it is judged, as `DraftLength` tries unmeasured lengths.

    Args:
        batch_size: rows of the call (the widest pass has ``batch_size * (max_tokens + 1)`` tokens).
        max_tokens: the call's `num_assistant_tokens`.
        target: the key of the target at this batch size (`hf_metasd.batched.batch_key`): what earlier calls
            measured there is read and extended; ``None``: nothing is shared across calls.
        smoothing: the estimates' exponential smoothing.

    Example:
        >>> passes = PassCosts(batch_size=2, max_tokens=2)
        >>> passes.row_seconds(2)            # nothing measured
        [None, None, None]
        >>> passes.observe(2, 1, 1.0); passes.observe(2, 3, 2.0)  # 2 rows x 1 and x 3 columns
        >>> passes.row_seconds(2)            # V(2)/2, V(4)/2 (between V(2) and V(6)), V(6)/2
        [0.5, 0.75, 1.0]
        >>> passes.seconds(1), passes.seconds(5), passes.seconds(8)  # below, between and above what was measured
        (0.5, 1.75, 2.0)
        >>> passes.weight(2, 1, 3)           # a row of 1 token in a pass of 3 columns: 1/2 * V(2) / V(6)
        0.25
    """

    def __init__(self, batch_size: int, max_tokens: int, *, target: Any = None, smoothing: float = 0.3) -> None:
        self.batch_size, self.max_tokens = batch_size, max_tokens
        # a one-arm `DraftLength` keeps the measurements (smoothed, per process and target): by total width here
        self._table = DraftLength(
            1, batch_size * (max_tokens + 1) - 1, keys=["batch passes"], target=target, smoothing=smoothing
        )
        self._measured: list[tuple[int, float]] | None = None  # (width, seconds), sorted, until the next pass
        #: rows of the coming pass (the loop sets it before the rows draft)
        self.rows = batch_size

    def observe(self, rows: int, columns: int, seconds: float) -> None:
        """Fold in a pass over `rows` rows of `columns` columns that took `seconds`."""
        self._table.observe_verification(rows * columns, seconds)
        self._measured = None

    def seconds(self, width: int) -> float | None:
        """:math:`\\hat V(T)` for ``T = width`` (see the class docstring), or ``None`` while nothing is measured."""
        if self._measured is None:
            self._measured = sorted(self._table.summary().items())
        measured = self._measured
        if not measured:
            return None
        below = [(t, v) for t, v in measured if t <= width]
        above = [(t, v) for t, v in measured if t >= width]
        if not below:
            return above[0][1] * width / above[0][0]
        if not above:
            return below[-1][1]
        (t0, v0), (t1, v1) = below[-1], above[0]
        return v0 if t1 == t0 else v0 + (v1 - v0) * (width - t0) / (t1 - t0)

    def row_seconds(self, rows: int) -> list[float | None]:
        """:math:`\\hat v_R(k) = \\hat V(R k) / R` for ``k = 1 .. max_tokens + 1`` at ``R = rows``."""
        return [None if (v := self.seconds(rows * k)) is None else v / rows for k in range(1, self.max_tokens + 2)]

    def weight(self, rows: int, tokens: int, columns: int) -> float:
        """The share of a pass of `rows` rows and `columns` columns charged to a row that verified `tokens` of them:
        ``min(1, V(rows * tokens) / V(rows * columns)) / rows`` (``tokens / columns / rows`` while nothing is
        measured)."""
        mine, whole = self.seconds(rows * tokens), self.seconds(rows * columns)
        ratio = tokens / columns if mine is None or whole is None or whole <= 0 else mine / whole
        return min(1.0, ratio) / rows

    def summary(self) -> dict[int, float]:
        """Measured seconds of a pass by its total width (telemetry)."""
        return self._table.summary()


class RowLengths(DraftLength):
    """A batch row's `DraftLength`: its arms' acceptance and drafting costs as for one request, its verification
    costs the shares of the batch's passes (`PassCosts.row_seconds` at the coming pass's rows). The loop measures the
    passes; what the row's own clock saw of them is not folded in (`observe_verification` does nothing).

    Args:
        num_arms, max_tokens, **kwargs: as for `DraftLength`.
        passes: the batch's pass costs (a row's candidate generator takes
            ``lengths=functools.partial(RowLengths, passes=passes)``).
    """

    def __init__(self, num_arms: int, max_tokens: int, *, passes: PassCosts, **kwargs: Any) -> None:
        super().__init__(num_arms, max_tokens, **kwargs)
        self.passes = passes

    def observe_verification(self, num_tokens: int, seconds: float) -> None:
        """Nothing: the batch measures its passes (`PassCosts.observe`)."""

    def verification_seconds(self) -> list[float | None]:
        """:math:`\\hat v_R(k)` for ``k = 1 .. N + 1`` (see the module docstring)."""
        return self.passes.row_seconds(self.passes.rows)

    def summary(self) -> dict[int, float]:
        """The row's share :math:`\\hat v_B(k)` of a pass of the whole batch, by tokens per row (telemetry)."""
        return {k: v for k, v in enumerate(self.passes.row_seconds(self.passes.batch_size), 1) if v is not None}


class DraftingGuard:
    r"""Whether the batch drafts at all: drafting stops for the rest of the call once it measures slower than plain.

    A row's policy weighs its own arms; nothing in it sees the batch's whole round, whose pass is as wide as the
    longest draft and which ends only when the slowest row has its tokens. So the batch measures both ways itself:

    1. the first round after the prefill is a **plain round** (no row drafts: every row verifies its next token, as
       plain `generate` does): its wall seconds :math:`S_0` over its :math:`R_0` rows give plain's cost per row-token
       at that batch, :math:`p = S_0 / R_0`;
    2. then rounds draft, and while :math:`R_0` rows still decode the guard sums their wall seconds :math:`\sum S`
       (drafting, the pass and acceptance) and the tokens they gave the rows, :math:`\sum n`. After `min_rounds`
       such rounds, and after each one from then on, drafting stops for good once :math:`\sum S / \sum n > p`: the
       batch then runs plain rounds only. Once rows have finished, the batch is not the one :math:`p` was measured
       on, and the decision stands.

    A plain round is plain decoding (one token per row, verified by the target): output is unchanged either way.

    Args:
        min_rounds: drafting rounds measured before the guard may stop drafting.

    Example:
        >>> guard = DraftingGuard(min_rounds=2)
        >>> guard.drafting(first=False)       # the plain round that measures p
        False
        >>> guard.observe(drafted=False, seconds=0.4, tokens=4, rows=4)   # p = 0.1 s per row-token
        >>> guard.drafting(first=False); guard.observe(drafted=True, seconds=0.5, tokens=6, rows=4)
        True
        >>> guard.drafting(first=False); guard.observe(drafted=True, seconds=0.7, tokens=4, rows=4)
        True
        >>> guard.drafting(first=False)       # 1.2 s for 10 tokens: slower than plain's 0.1 s per token
        False
    """

    def __init__(self, min_rounds: int = 4) -> None:
        self.min_rounds = min_rounds
        self.plain_seconds: float | None = None  # p, seconds per row-token of the plain round
        self.plain_rows = 0  # R_0
        self.seconds, self.tokens, self.rounds = 0.0, 0, 0
        self.drafted_rounds = 0  # measured drafting rounds in which some row drafted at least one token
        self.stopped_after: int | None = None  # drafting rounds before the guard stopped drafting (telemetry)

    def drafting(self, first: bool) -> bool:
        """Whether the coming round drafts (the prefill round drafts, as the single-request loop's first round)."""
        if first:
            return True
        return self.plain_seconds is not None and self.stopped_after is None

    def observe(self, *, drafted: bool, seconds: float, tokens: int, rows: int, drafted_tokens: int = 1) -> None:
        """Fold in a round (not the prefill) over `rows` rows that took `seconds` and gave them `tokens` in all
        (`drafted_tokens`: the candidates its rows drafted)."""
        if not drafted:
            if self.plain_seconds is None and tokens > 0:
                self.plain_seconds, self.plain_rows = seconds / tokens, rows
            return
        if rows != self.plain_rows:  # rows have finished: not the batch p was measured on
            return
        self.seconds, self.tokens, self.rounds = self.seconds + seconds, self.tokens + tokens, self.rounds + 1
        self.drafted_rounds += drafted_tokens > 0
        if self.rounds >= self.min_rounds and self.seconds > self.plain_seconds * self.tokens:
            self.stopped_after = self.rounds


#: Most calls in a row that run plain rounds only on an earlier guard's word before drafting is measured again.
MAX_PLAIN_CALLS = 16

#: batch key -> {the pool's drafter keys: [calls left to run plain, the current run of plain calls]}
_VERDICTS: weakref.WeakKeyDictionary[Any, dict[tuple[Hashable, ...], list[int]]] = weakref.WeakKeyDictionary()
_VERDICTS_LOCK = threading.Lock()


class GuardMemory:
    """What the drafting guards of earlier calls found at one batch size with one pool, kept per process.

    A call whose guard stopped drafting measured drafting slower than plain rounds for this target, batch size and
    pool; the next calls then run **plain rounds only**, through plain batched `generate`'s own loop (so at its
    speed), and drafting is measured again after them: after 1 such call, then 2, 4, ... up to `MAX_PLAIN_CALLS`
    while it keeps measuring slower, and from every call again once a call drafts to its end (drafting paid). A
    batch key that is not kept across calls (a reproducible call's) remembers nothing.

    Args:
        key: the batch's key in the per-target caches (`hf_metasd.batched.batch_key`).
        drafters: the call's pool.

    Example:
        >>> import torch
        >>> from hf_metasd.drafters import PromptLookupDrafter
        >>> key, pool = torch.nn.Linear(1, 1), [PromptLookupDrafter()]
        >>> memory = GuardMemory(key, pool)
        >>> memory.plain(), memory.record(stopped=True, rounds=4)
        (False, None)
        >>> GuardMemory(key, pool).plain(), GuardMemory(key, pool).plain()   # 1 plain call, then a check
        (True, False)
        >>> GuardMemory(key, pool).record(stopped=True, rounds=4)          # slower again: 2 plain calls next
        >>> [GuardMemory(key, pool).plain() for _ in range(3)]
        [True, True, False]
    """

    def __init__(self, key: Any, drafters: Sequence[Any]) -> None:
        self.entry: list[int] | None = None
        try:
            with _VERDICTS_LOCK:
                store = _VERDICTS.setdefault(key, {})
                self.entry = store.setdefault(tuple(cost_key(d) for d in drafters), [0, 0])
        except TypeError:  # a key that cannot be weakly referenced: nothing is kept across calls
            self.entry = None

    def plain(self) -> bool:
        """Whether this call runs plain rounds only (an earlier guard's word); counts the call if so."""
        with _VERDICTS_LOCK:
            if self.entry is None or self.entry[0] <= 0:
                return False
            self.entry[0] -= 1
            return True

    @property
    def next_check(self) -> int:
        """Calls that will run plain before drafting is measured again."""
        return 0 if self.entry is None else self.entry[0]

    def record(self, *, stopped: bool, rounds: int, drafted_rounds: int | None = None, min_rounds: int = 4) -> None:
        """A call drafted: its guard `stopped` drafting (slower than plain), or measured `rounds` drafting rounds
        without stopping (at least `min_rounds`: drafting paid; fewer: the call says nothing). A call whose rows
        drafted nothing in any of those rounds (`drafted_rounds` of 0: their draft lengths found that drafting does
        not pay) counts as stopped."""
        stopped = stopped or (drafted_rounds == 0 and rounds >= min_rounds)
        if self.entry is None or (not stopped and rounds < min_rounds):
            return
        with _VERDICTS_LOCK:
            run = min(MAX_PLAIN_CALLS, max(1, 2 * self.entry[1])) if stopped else 0
            self.entry[0] = self.entry[1] = run
