"""Contextual UCB: one UCB estimate per (match-length bucket, arm), backed off to the arm's overall mean."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from .._validation import check_int, check_real
from .base import _log_or_zero
from .context import RoundContext
from .registry import register_policy
from .settings import PolicySettings, setting
from .ucb import UCB

__all__ = ["ContextualUCB", "ContextualUCBSettings", "match_bucket"]

#: The most buckets: the last then starts above 2**30 tokens, longer than any match.
MAX_BUCKETS = 32


def _check_buckets(name: str, value: object) -> int:
    """An int in ``[2, MAX_BUCKETS]``, else a `ValueError` naming `name`."""
    check_int(name, value, low=2, hint="Use 5 (matches of 0, 1-2, 3-4, 5-8 and 9+ tokens).")
    if value > MAX_BUCKETS:
        raise ValueError(
            f"`{name}` must be at most {MAX_BUCKETS}, but is {value!r}. Use 5 (matches of 0, 1-2, 3-4, 5-8 and 9+ "
            "tokens); more buckets split the rounds thinner."
        )
    return value


def match_bucket(match_length: int, num_buckets: int) -> int:
    """The bucket of a round whose best model-free match is `match_length` tokens long: 0 for no match, 1 for 1-2
    tokens, then one bucket per doubling (3-4, 5-8, 9-16, ...), the last (``num_buckets - 1``) taking every longer
    match.

    Example:
        >>> [match_bucket(m, 5) for m in (0, 1, 2, 3, 4, 5, 8, 9, 100)]
        [0, 1, 1, 2, 2, 3, 3, 4, 4]
        >>> [match_bucket(m, 2) for m in (0, 1, 100)]
        [0, 1, 1]
    """
    if match_length <= 0:
        return 0
    return min(num_buckets - 1, max(1, (match_length - 1).bit_length()))


@dataclasses.dataclass(frozen=True)
class ContextualUCBSettings(PolicySettings):
    """Settings of `ContextualUCB`."""

    beta: float = setting(
        1.0,
        "exploration weight beta >= 0; larger explores more, 0 is greedy on the bucket's means",
        check_real,
        low=0.0,
        hint="Use 1.0 (UCB's default).",
    )
    num_buckets: int = setting(
        5,
        "match-length buckets B in [2, 32]: 0, 1-2, 3-4, 5-8, ... tokens, the last taking every longer match",
        _check_buckets,
    )
    backoff: float = setting(
        2.0,
        "pseudo-pulls w >= 0 at the arm's overall mean in each bucket's estimate; larger leans on the overall mean "
        "longer, 0 learns every bucket on its own",
        check_real,
        low=0.0,
        hint="Use 2.0.",
    )


@register_policy
class ContextualUCB(UCB):
    r"""UCB per context bucket: the round's best model-free match length picks which estimates to compare.

    With a pool of a model drafter (good on novel text), a corpus drafter (good while a long suffix of the answer
    matches its corpus, useless otherwise) and the no-draft arm, the best arm changes *within* an answer, with the
    length of the current match. The candidate generator tells this policy, before each round, each model-free arm's
    match length (`RoundContext`, through `set_context`); the round falls into bucket
    :math:`b = \mathrm{bucket}(m)` of the best one, :math:`m` (`match_bucket`: 0, 1-2, 3-4, 5-8 and 9+ tokens with
    ``num_buckets=5``), and the policy picks

    .. math::

        i_t = \arg\max_i \; \tilde r_{b,i} + \beta \sqrt{\frac{2 \ln \tilde t_b}{\tilde n_{b,i}}},
        \qquad \tilde r_{b,i} = \frac{S_{b,i} + w_i \bar r_i}{\tilde n_{b,i}},
        \qquad \tilde n_{b,i} = n_{b,i} + w_i, \qquad \tilde t_b = t_b + \sum_j w_j,

    where :math:`n_{b,i}` and :math:`S_{b,i}` are arm *i*'s pulls (and side observations) and summed rewards in
    rounds of bucket *b*, :math:`t_b` the rounds (pulls) of bucket *b*, :math:`\bar r_i` arm *i*'s overall mean
    reward (every bucket, prior included) and :math:`w_i = w` (`backoff`) for an arm observed at all, else 0. So
    each bucket is a UCB whose prior is every arm's overall mean, worth *w* pulls: a bucket seen for the first
    time picks the best arm overall, and its own rounds take over as they accumulate. An arm never observed is
    pulled first (in pool order), as in `UCB`; with :math:`w = 0` an arm is also pulled once in each bucket.
    Ties go to the lowest index; rewards must lie in ``[0, 1]``.

    Without a context (before any `set_context`, or after ``set_context(None)``: the simulator drives it so) the
    policy is `UCB` on the overall estimates, and rewards update only those; a pool without model-free arms gets a
    context of match length 0 every round (one bucket). Rewards told after `set_context` count in the context's
    bucket and overall: the candidate generator sets each replayed round's own context before its side
    observation; the prompt's prefill round, whose reward waits for its arm's cost, counts in the bucket of the
    round that tells it.

    Knobs: larger :math:`\beta` explores more; larger *w* trusts the overall mean longer in a bucket (fewer
    exploratory pulls per bucket, slower to specialise); more buckets split the rounds thinner.

    Args:
        beta: exploration weight :math:`\beta \ge 0`.
        num_buckets: :math:`B \in [2, 32]` match-length buckets.
        backoff: :math:`w \ge 0`, the pseudo-pulls at the overall mean in every bucket's estimate.
        seed: unused (deterministic); accepted for a uniform interface.

    Example:
        >>> from hf_metasd.policies import ContextualUCB, RoundContext
        >>> policy = ContextualUCB(beta=0.0, backoff=1.0)
        >>> policy.reset(num_arms=2)                     # arm 0: a model drafter, arm 1: a corpus drafter
        >>> long, none = RoundContext((None, 12)), RoundContext((None, 0))
        >>> for context, rewards in [(long, (0.4, 0.9)), (none, (0.4, 0.0))] * 3:
        ...     policy.set_context(context)
        ...     for arm in (0, 1):
        ...         policy.update(arm, rewards[arm])
        >>> policy.set_context(long); policy.select()    # (2.7 + 0.45) / 4 = 0.79 beats (1.2 + 0.4) / 4 = 0.4
        1
        >>> policy.set_context(none); policy.select()    # (0 + 0.45) / 4 = 0.11 loses to 0.4
        0
        >>> policy.set_context(None); policy.select()    # no context: UCB on the overall means 0.4 and 0.45
        1
    """

    name = "contextual_ucb"
    uses_context = True
    settings_class = ContextualUCBSettings

    def __init__(
        self, beta: float = 1.0, num_buckets: int = 5, backoff: float = 2.0, *, seed: int | None = None
    ) -> None:
        self._configure(seed, beta=beta, num_buckets=num_buckets, backoff=backoff)
        self.context: RoundContext | None = None
        self.bucket_counts: list[list[int]] = []
        self.bucket_sums: list[list[float]] = []
        self.bucket_rounds: list[int] = []

    def reset(self, num_arms: int) -> None:
        """`Policy.reset`, every bucket emptied and the context forgotten."""
        super().reset(num_arms)
        self.context = None
        self.bucket_counts = [[0] * num_arms for _ in range(self.num_buckets)]
        self.bucket_sums = [[0.0] * num_arms for _ in range(self.num_buckets)]
        self.bucket_rounds = [0] * self.num_buckets

    def set_context(self, context: RoundContext | None) -> None:
        """The context of the next `select` and of the rewards told until the next `set_context`."""
        if context is not None and not isinstance(context, RoundContext):
            raise TypeError(
                f"`context` must be a `RoundContext` or None, but is {type(context).__name__}. "
                "Build it with `RoundContext(match_lengths)`."
            )
        self.context = context

    def bucket(self) -> int | None:
        """The bucket of the current context (`match_bucket`), or None without one."""
        return None if self.context is None else match_bucket(self.context.match_length, self.num_buckets)

    def scores(self) -> list[float]:
        """The index of every arm in the current context's bucket (UCB's without a context; ``inf`` for an arm
        with nothing to estimate from)."""
        bucket = self.bucket()
        if bucket is None:
            return super().scores()
        weights = [self.backoff if n else 0.0 for n in self.effective_counts()]
        log_t = _log_or_zero(self.bucket_rounds[bucket] + sum(weights))
        return [
            (s + w * mean) / (n + w) + self.beta * math.sqrt(2.0 * log_t / (n + w)) if n + w else math.inf
            for s, n, w, mean in zip(self.bucket_sums[bucket], self.bucket_counts[bucket], weights, self.means())
        ]

    def observe(self, arm: int, reward: float) -> None:
        """`Policy.observe`: a sample of the context's bucket too, not one of its rounds."""
        super().observe(arm, reward)
        bucket = self.bucket()
        if bucket is not None:
            self.bucket_rounds[bucket] -= 1

    def _observe(self, arm: int, reward: float) -> None:
        super()._observe(arm, reward)
        bucket = self.bucket()
        if bucket is not None:
            self.bucket_counts[bucket][arm] += 1
            self.bucket_sums[bucket][arm] += reward
            self.bucket_rounds[bucket] += 1

    def state_dict(self) -> dict[str, Any]:
        """`Policy.state_dict` plus the buckets' counts, sums and rounds and the current context."""
        state = super().state_dict()
        state["bucket_counts"] = [list(row) for row in self.bucket_counts]
        state["bucket_sums"] = [list(row) for row in self.bucket_sums]
        state["bucket_rounds"] = list(self.bucket_rounds)
        state["context"] = None if self.context is None else list(self.context.match_lengths)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.bucket_counts = [[int(n) for n in row] for row in state["bucket_counts"]]
        self.bucket_sums = [[float(s) for s in row] for row in state["bucket_sums"]]
        self.bucket_rounds = [int(t) for t in state["bucket_rounds"]]
        self.context = None if state["context"] is None else RoundContext(state["context"])
