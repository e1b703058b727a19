r"""`DraftLength`: each round drafts the number of tokens that this machine verifies fastest per token gained.

How much a verification pass over :math:`k` tokens costs against one over a single token depends on the machine,
not on the model alone: on one 2-core CPU of this project's kind a pass over 3 tokens cost 1.04x a plain step and
one over 4 tokens 1.46x; on another the 4-token pass cost less than a plain step. A fixed draft length tuned on one
machine is therefore wrong on the next. With ``meta_draft_length="measured"`` (the default) the call's
`num_assistant_tokens` :math:`N` is a cap, and every round the arm :math:`a` the policy picked drafts

.. math::

    n^* = \arg\max_{1 \le n \le N} \frac{E_a(n)}{n\, \hat d_a + \hat v(n + 1)}, \qquad
    E_a(n) = 1 + \sum_{k=1}^{n} \prod_{j=1}^{k} \hat p_{a,j}

tokens, where

* :math:`E_a(n)` is the expected number of tokens the round adds (the accepted drafted tokens and the target's own);
* :math:`\hat p_{a,j}` the arm's rate of accepting drafted position :math:`j` once positions :math:`< j` were
  accepted, :math:`(A_{a,j} + w\, m_{a,j}) / (T_{a,j} + w)` from :math:`T_{a,j}` rounds that reached position
  :math:`j` and :math:`A_{a,j}` that accepted it, shrunk towards :math:`m_{a,1} = 1/2` and
  :math:`m_{a,j} = \hat p_{a,j-1}` (a position never reached is assumed as likely as the one before it) with weight
  :math:`w` (`prior_weight`);
* :math:`\hat d_a` the arm's smoothed seconds of drafting per drafted token (kept per process, as verification costs;
  zero until measured; a lookup is microseconds, a model drafter one forward per token);
* :math:`\hat v(k)` the smoothed seconds of the target's verification pass over :math:`k` tokens, **measured from the
  rounds themselves** (no extra pass is ever run): a plain step is :math:`k = 1`, a round that drafted :math:`n` is
  :math:`k = n + 1`. A length measured fewer than `min_observations` times is looked at optimistically (at most
  the dearest shorter length measured, else :math:`k/K` of the shortest longer one :math:`K`), so every length
  that might pay is tried before it is judged, and a first unlucky measurement does not rule it out for good.

**Match classes.** A drafter that scores its matches (`Drafter.scores_matches`: corpus drafters) drafts the cap and
is cut afterwards: its acceptance is also counted per *match class* :math:`c` of the round, the class of the length
:math:`m` of the context suffix its proposal continues, :math:`c = \lceil \log_2 m \rceil` (1, 2, 3-4, 5-8, 9-16,
... tokens: `match_class`), and the round's length maximises the same ratio with the class's rates

.. math:: \hat p_{a,c,j} = \frac{A_{a,c,j} + w\, \hat p_{a,j}}{T_{a,c,j} + w},

shrunk towards the arm's own rates (a class never seen reads the arm's). A weak match is then cut short while a long copy drafts the cap:
on the default target's dev answers (greedy, the embedded pool's corpus_all, 16-token proposals) a one-token match
had 0.96 of them accepted on average and one of 9-16 tokens 5.44 (`recipes/studies/match_classes.py`, docs/concepts.md).

Costs and acceptance counts are kept per process and per target (as `hf_metasd.costs.CostModel` keeps round costs),
so a later call starts from what earlier ones measured. Ties go to the longer draft. ``"fixed"`` drafts
:math:`N` every round (the length budget permitting), as transformers' constant schedule does.

Example:
    >>> lengths = DraftLength(num_arms=1, max_tokens=3)
    >>> lengths.choose(0)                          # nothing measured: the cap
    3
    >>> lengths.observe_verification(1, 0.060)     # a plain step
    >>> lengths.observe_verification(4, 0.090)     # a 3-token draft verified: 1.5 plain steps
    >>> lengths.observe_verification(4, 0.090)
    >>> lengths.choose(0)                          # 3 and 2 tokens not measured yet: optimistic, 2 is tried
    2
    >>> lengths.observe_verification(3, 0.062); lengths.observe_verification(3, 0.062)
    >>> lengths.choose(0)                          # E(2) / v(3) = 1.75 / 0.062 beats 1.875 / 0.090
    2
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from ._validation import check_int, check_real
from .costs import CostModel, target_cache
from .errors import MetaSDConfigError
from .reward_memory import current_scope

__all__ = ["DRAFT_LENGTH_MODES", "DraftLength", "RoundLength", "check_draft_length_mode", "match_class"]

#: The values of ``meta_draft_length``.
DRAFT_LENGTH_MODES = ("measured", "fixed")

#: target -> {("verify", k, threads): (seconds, count), ("accept", scope, arm key): (tried, accepted)}: what earlier
#: calls measured. Verification costs are the machine's and shared; acceptance counts are kept per
#: `hf_metasd.reward_memory_scope`, like the rewards behind learned priors.
_CACHE: weakref.WeakKeyDictionary[Any, dict[Hashable, Any]] = weakref.WeakKeyDictionary()

#: Acceptance counts are halved once an arm's first position has been tried this many times (old rounds fade).
_MAX_COUNT = 512.0


def match_class(match_length: int) -> int:
    """The match class :math:`\\lceil \\log_2 m \\rceil` of a match of `match_length` tokens (0 for ``m <= 1``).

    Example:
        >>> [match_class(m) for m in (1, 2, 3, 4, 5, 8, 9, 16)]
        [0, 1, 2, 2, 3, 3, 4, 4]
    """
    return max(0, int(match_length) - 1).bit_length()


class DraftLength:
    """The per-round draft length of a MetaSD call (see the module docstring).

    Args:
        num_arms: arms of the call (the no-draft arm may be among them: it never asks for a length).
        max_tokens: the cap :math:`N` (the call's `num_assistant_tokens`).
        keys: one hashable key per arm identifying its drafter across calls (``None``: the arm index).
        target: the target whose per-process cache to read and update (``None``: nothing is shared across calls).
        smoothing: the cost estimates' exponential smoothing :math:`\\lambda \\in (0, 1]`.
        prior_weight: :math:`w`, pseudo-rounds behind each acceptance rate's shrinkage target.
        min_observations: measurements of a verification length before its estimate is trusted when it is dear.
    """

    def __init__(
        self,
        num_arms: int,
        max_tokens: int,
        *,
        keys: Sequence[Hashable] | None = None,
        target: Any = None,
        smoothing: float = 0.3,
        prior_weight: float = 2.0,
        min_observations: int = 2,
    ) -> None:
        self.num_arms = check_int("num_arms", num_arms, low=1, hint="Pass the call's number of arms.")
        self.max_tokens = check_int("max_tokens", max_tokens, low=1, hint="Use the call's `num_assistant_tokens`.")
        self.smoothing = check_real("smoothing", smoothing, low=0.0, high=1.0, low_open=True, hint="Use e.g. 0.3.")
        self.prior_weight = check_real("prior_weight", prior_weight, low=0.0, hint="Use e.g. 2.")
        self.min_observations = check_int("min_observations", min_observations, low=1, hint="Use e.g. 2.")
        self.keys = list(range(num_arms)) if keys is None else list(keys)
        if len(self.keys) != num_arms:
            raise ValueError(
                f"`keys` must hold one key per arm ({num_arms}), but holds {len(self.keys)}. Fix the list."
            )
        self._threads = torch.get_num_threads()
        self._cache = target_cache(_CACHE, target)
        cache = self._cache if self._cache is not None else {}  # no target: nothing shared
        # verification pass over k tokens (index k): smoothed seconds and number of measurements
        self._verify: list[tuple[float, int] | None] = [
            cache.get(("verify", k, self._threads)) for k in range(self.max_tokens + 2)
        ]
        self._verify[0] = None
        # per arm and drafted position j (index j - 1): rounds that reached it, rounds that accepted it; the lists
        # are the process cache's own (per scope), so later calls read and extend them
        scope = current_scope()
        self._tried: list[list[float]] = []
        self._accepted: list[list[float]] = []
        for key in self.keys:
            tried, accepted = cache.setdefault(("accept", scope, key), ([], []))
            self._tried.append(tried)
            self._accepted.append(accepted)
        self._scope, self._shared = scope, cache
        # per (arm, match class): the same counts, kept in the same cache (see `observe_acceptance`)
        self._by_class: dict[tuple[int, int], tuple[list[float], list[float]]] = {}
        # seconds of drafting per drafted token, per arm, kept per process and target as the round costs are (under
        # keys of their own): a later call does not start by taking a model drafter for free
        self._draft_step = CostModel(
            [("draft step", key) for key in self.keys], smoothing=self.smoothing, target=target
        )

    # ------------------------------------------------------------------ what the rounds tell
    def observe_verification(self, num_tokens: int, seconds: float) -> None:
        """Fold one measured verification pass over `num_tokens` tokens (drafted + 1) into its estimate."""
        if not 1 <= num_tokens < len(self._verify):
            return
        old = self._verify[num_tokens]
        new = (seconds, 1) if old is None else ((1 - self.smoothing) * old[0] + self.smoothing * seconds, old[1] + 1)
        self._verify[num_tokens] = new
        if self._cache is not None:
            self._cache[("verify", num_tokens, self._threads)] = new

    def observe_draft(self, arm: int, num_drafted: int, seconds: float) -> None:
        """Fold the seconds `arm` spent drafting `num_drafted` tokens into its per-token drafting cost."""
        if num_drafted > 0:
            self._draft_step.observe(arm, seconds / num_drafted)

    def observe_acceptance(
        self, arm: int, num_drafted: int, num_accepted: int, match_class: int | None = None
    ) -> None:
        """Count a round in which `arm` drafted `num_drafted` tokens and `num_accepted` of them were accepted: it
        reached positions ``1 .. min(num_accepted + 1, num_drafted)`` and accepted ``1 .. num_accepted``. With
        `match_class` (a drafter that scores matches), the round is counted for that class too."""
        reached = min(num_accepted + 1, num_drafted)
        counts = [(self._tried[arm], self._accepted[arm])]
        if match_class is not None:
            counts.append(self._class_counts(arm, match_class))
        for tried, accepted in counts:
            while len(tried) < reached:
                tried.append(0.0)
                accepted.append(0.0)
            for j in range(reached):
                tried[j] += 1.0
                accepted[j] += 1.0 if j < num_accepted else 0.0
            if tried and tried[0] > _MAX_COUNT:
                tried[:] = [t / 2 for t in tried]
                accepted[:] = [a / 2 for a in accepted]

    def _class_counts(self, arm: int, match_class: int) -> tuple[list[float], list[float]]:
        """The (tried, accepted) lists of `arm` in `match_class`, from the process cache (made on first use)."""
        found = self._by_class.get((arm, match_class))
        if found is None:
            key = ("accept", self._scope, self.keys[arm], "match class", int(match_class))
            found = self._by_class[(arm, match_class)] = self._shared.setdefault(key, ([], []))
        return found

    # ------------------------------------------------------------------ the choice
    def acceptance(self, arm: int, num_tokens: int, match_class: int | None = None) -> list[float]:
        """:math:`\\hat p_{a,1..n}` for ``n = num_tokens``, or with `match_class` :math:`\\hat p_{a,c,1..n}` (see
        the module docstring).

        Example:
            >>> lengths = DraftLength(num_arms=1, max_tokens=3, prior_weight=2.0)
            >>> lengths.observe_acceptance(0, 2, 2); lengths.observe_acceptance(0, 2, 0)
            >>> lengths.acceptance(0, 3)   # (1 + 2 * 0.5) / 4, (1 + 2 * 0.5) / 3, never reached: as p2
            [0.5, 0.6666666666666666, 0.6666666666666666]
        """
        rates, mean = [], 0.5
        tried, accepted = self._tried[arm], self._accepted[arm]
        for j in range(num_tokens):
            t = tried[j] if j < len(tried) else 0.0
            a = accepted[j] if j < len(accepted) else 0.0
            mean = (a + self.prior_weight * mean) / (t + self.prior_weight) if t + self.prior_weight > 0 else mean
            rates.append(mean)
        if match_class is None:
            return rates
        tried, accepted = self._class_counts(arm, match_class)
        out = []
        for j, prior in enumerate(rates):
            t = tried[j] if j < len(tried) else 0.0
            a = accepted[j] if j < len(accepted) else 0.0
            out.append(
                (a + self.prior_weight * prior) / (t + self.prior_weight) if t + self.prior_weight > 0 else prior
            )
        return out

    def draft_seconds(self, arm: int) -> float:
        """:math:`\\hat d_a`: `arm`'s smoothed seconds of drafting per token (0.0 until measured)."""
        return self._draft_step.estimate(arm) or 0.0

    def verification_seconds(self) -> list[float | None]:
        """:math:`\\hat v(k)` for ``k = 1 .. N + 1`` as the choice reads it, or ``None`` where nothing was measured.

        A length measured at least `min_observations` times reads its smoothed estimate. Any other length reads an
        optimistic guess (a measured one the smaller of its estimate and that guess): the dearest shorter length
        measured (a pass over more tokens is taken to cost no less), else :math:`k / K` of the shortest longer
        length :math:`K` measured (a pass over fewer tokens costs at least that share).
        """
        measured = {k: v for k, v in enumerate(self._verify) if v is not None}

        def guess(k: int) -> float | None:
            shorter = [v[0] for j, v in measured.items() if j < k]
            if shorter:
                return max(shorter)
            longer = [j for j in measured if j > k]
            return measured[min(longer)][0] * k / min(longer) if longer else None

        out: list[float | None] = []
        for k in range(1, len(self._verify)):
            if k not in measured:
                out.append(guess(k))
                continue
            seconds, count = measured[k]
            optimistic = guess(k) if count < self.min_observations else None
            out.append(seconds if optimistic is None else min(seconds, optimistic))
        return out

    def choose(self, arm: int, cap: int | None = None, match_class: int | None = None) -> int:
        """The draft length for a round of `arm`, at most `cap` (default: `max_tokens`); 0 when `cap` is 0. With
        `match_class`, the class's acceptance rates decide (see the module docstring)."""
        cap = self.max_tokens if cap is None else min(cap, self.max_tokens)
        if cap <= 0:
            return 0
        return self.value(arm, cap, match_class)[0]

    def value(
        self,
        arm: int,
        cap: int | None = None,
        match_class: int | None = None,
        extra_seconds: float = 0.0,
        *,
        exact: bool = False,
        bonus: float = 0.0,
        per_token: float = 0.0,
    ) -> tuple[int, float | None]:
        r"""The length `choose` picks and its expected tokens per second, :math:`E_a(n^*) / (n^* \hat d_a + \hat
        v(n^* + 1) + s + u E_a(n^*))` with `extra_seconds` :math:`s` and `per_token` :math:`u` seconds per expected
        token added to the round's cost (with `exact`: at the cap itself, as ``meta_draft_length="fixed"`` drafts),
        and with `bonus` :math:`b` each rate raised to :math:`\min(1, \hat p_{a,j} + b / \sqrt{T_{a,j} + 1})`
        (optimism that fades as the arm's rounds reach position :math:`j`); the rate is ``None`` (and the length the
        cap) while a verification length up to the cap is unmeasured and cannot be guessed.

        Example:
            >>> lengths = DraftLength(num_arms=1, max_tokens=2)
            >>> lengths.observe_verification(1, 0.1); lengths.observe_verification(1, 0.1)
            >>> lengths.value(0)          # nothing else measured: 2 and 3 tokens guessed at 0.1 s; E(2) = 1.75
            (2, 17.5)
        """
        cap = self.max_tokens if cap is None else min(cap, self.max_tokens)
        if cap <= 0:
            return 0, None
        verify = self.verification_seconds()
        if any(v is None for v in verify[1 : cap + 1]):
            return cap, None  # no verification pass measured yet: nothing to compare with
        rates = self.acceptance(arm, cap, match_class)
        if bonus > 0:
            tried = self._tried[arm]
            rates = [
                min(1.0, p + bonus / (1.0 + (tried[j] if j < len(tried) else 0.0)) ** 0.5) for j, p in enumerate(rates)
            ]
        step = self.draft_seconds(arm)
        best, best_value, expected, survive = cap, -1.0, 1.0, 1.0
        for n in range(1, cap + 1):
            survive *= rates[n - 1]
            expected += survive
            value = expected / (n * step + verify[n] + extra_seconds + per_token * expected)
            if value >= best_value and (not exact or n == cap):
                best, best_value = n, value
        return best, best_value

    def observe_prefill(self, arm: int, num_tokens: int, seconds: float) -> None:
        """Fold `arm`'s prompt prefill of `num_tokens` tokens into its seconds per prefilled token (kept per process and
        target, as verification costs: a later call predicts its prefill from it)."""
        if num_tokens > 0 and self._cache is not None:
            key = ("prefill", self.keys[arm], self._threads)
            old, rate = self._cache.get(key), seconds / num_tokens
            self._cache[key] = rate if old is None else (1 - self.smoothing) * old + self.smoothing * rate

    def prefill_seconds(self, arm: int, num_tokens: int) -> float:
        """`arm`'s predicted prompt prefill of `num_tokens` tokens (0.0 until one is measured: optimistic)."""
        rate = None if self._cache is None else self._cache.get(("prefill", self.keys[arm], self._threads))
        return 0.0 if rate is None else rate * num_tokens

    def plain_value(self) -> float | None:
        r"""Tokens per second of a plain step, :math:`1 / \hat v(1)` (``None`` until one is measured)."""
        first = self._verify[1]
        return None if first is None else 1.0 / first[0]

    def summary(self) -> dict[int, float]:
        """Measured seconds of a verification pass by number of tokens (telemetry)."""
        return {k: v[0] for k, v in enumerate(self._verify) if v is not None}


class RoundLength:
    """How many tokens each round of one call drafts: the cap, `num_assistant_tokens` cut by the length budget (the
    last position is the target's own token); under ``"measured"`` the length `lengths` chooses for the arm; an arm
    that scores its matches (`match_arms`: corpus drafters) drafts the cap and is cut afterwards by its match class
    (`cut`; see the module docstring, "Match classes").

    Args:
        lengths: the call's `DraftLength` (its `max_tokens` is the call's `num_assistant_tokens`).
        mode: ``"measured"`` or ``"fixed"``.
        max_length: the call's `max_length` (``None``: no length budget).
        match_arms: the arms that score their matches.
        plain_arm: the no-draft arm (it drafts nothing; its length is the cap), or ``None``.

    Example:
        >>> rounds = RoundLength(DraftLength(num_arms=2, max_tokens=3), "measured", max_length=10, match_arms={1})
        >>> rounds.cap(5), rounds.cap(8), rounds.choose(1, 5)   # 10 - 8 - 1 = 1 token left; arm 1 drafts the cap
        (3, 1, 3)
        >>> tokens, match = rounds.cut(1, torch.tensor([[4, 5, 6]]), match_length=1)
        >>> tokens.tolist(), match   # nothing measured for class 0 yet: the cap
        ([[4, 5, 6]], 0)
    """

    def __init__(
        self,
        lengths: DraftLength,
        mode: str,
        *,
        max_length: int | None = None,
        match_arms: set[int] | frozenset[int] = frozenset(),
        plain_arm: int | None = None,
    ) -> None:
        self.lengths = lengths
        self.mode = check_draft_length_mode(mode)
        self.max_length = max_length
        self.match_arms = frozenset(match_arms)
        self.plain_arm = plain_arm

    def cap(self, sequence_length: int) -> int:
        """`num_assistant_tokens`, capped by the length budget after a sequence of `sequence_length` tokens; 0 after
        an empty one (a prompt passed as ``inputs_embeds`` alone: the target's first pass reads embeddings that no
        drafter sees, and would not read a draft)."""
        if sequence_length == 0:
            return 0
        cap = self.lengths.max_tokens
        if self.max_length is not None:
            cap = max(0, min(cap, self.max_length - sequence_length - 1))
        return cap

    def cut_by_match(self, arm: int) -> bool:
        """Whether `arm` drafts the cap and is cut by its match class."""
        return self.mode == "measured" and arm in self.match_arms

    def choose(self, arm: int, sequence_length: int) -> int:
        """Tokens `arm` drafts after a sequence of `sequence_length` tokens: the cap, and under ``"measured"`` the
        length this machine verifies fastest per expected token (`DraftLength.choose`)."""
        cap = self.cap(sequence_length)
        if self.mode == "fixed" or arm == self.plain_arm or self.cut_by_match(arm):
            return cap
        return self.lengths.choose(arm, cap)

    def cut(self, arm: int, tokens: torch.Tensor, match_length: int) -> tuple[torch.Tensor, int | None]:
        """`tokens` ``(1, n)`` of an arm cut by its match class (its proposal continued a match of `match_length`
        tokens), cut to the length that class reads best, and the class; other arms' tokens as they are."""
        if not self.cut_by_match(arm) or tokens.shape[-1] == 0:
            return tokens, None
        match = match_class(match_length)
        return tokens[:, : self.lengths.choose(arm, tokens.shape[-1], match)], match


def check_draft_length_mode(value: object) -> str:
    """`value` checked as a ``meta_draft_length``; a `MetaSDConfigError` otherwise.

    Example:
        >>> check_draft_length_mode("fixed")
        'fixed'
        >>> check_draft_length_mode("auto")
        Traceback (most recent call last):
        ...
        hf_metasd.errors.MetaSDConfigError: `meta_draft_length` must be one of ['measured', 'fixed'], but is 'auto'. Use "measured" (the length this machine verifies fastest per token, the default) or "fixed" (always `num_assistant_tokens`).
    """
    if value not in DRAFT_LENGTH_MODES:
        raise MetaSDConfigError(
            f'`meta_draft_length` must be one of {list(DRAFT_LENGTH_MODES)}, but is {value!r}. Use "measured" (the '
            'length this machine verifies fastest per token, the default) or "fixed" (always `num_assistant_tokens`).'
        )
    return str(value)
