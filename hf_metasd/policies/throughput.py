r"""Throughput: each round, the arm with the most expected tokens per second *for this round*.

A per-call bandit (UCB and its kin) keeps one mean reward per drafter and so one ranking for a whole call. Where the
drafters differ, the best choice changes from round to round: a copier (prompt lookup, a corpus, token recycling) is
free and long exactly when the text repeats a span, and a model drafter predicts new text at a price. What tells the
rounds apart is known before the round drafts: each model-free arm's proposal for this very position (or its
abstaining) and the class of the match it continues. This policy is told that (`RoundContext`, made by the candidate
generator) and picks

.. math::

    a_t = \arg\max_a \; r_a(t), \qquad r_a(t) = \max_{1 \le n \le N_a(t)}
    \frac{E_{a, c_a(t)}(n)}{n\, \hat d_a + \hat v(n + 1)},

the expected tokens a round of arm :math:`a` adds over the seconds it costs, where :math:`N_a(t)` is the length of
the arm's proposal this round (the cap for a model drafter), :math:`c_a(t)` the class of the match it continues
(model drafters: none), :math:`E_{a,c}(n) = 1 + \sum_{k \le n} \prod_{j \le k} \hat p_{a,c,j}` with the acceptance
rates by drafted position that `hf_metasd.draft_length.DraftLength` learns per arm and match class, :math:`\hat d_a`
the arm's drafting seconds per token and :math:`\hat v(k)` the target's pass over :math:`k` tokens, both measured in
this process; the no-draft arm's rate is :math:`1 / \hat v(1)`. An arm that abstains this round has no rate. A model
drafter's rates are read optimistically, :math:`\min(1, \hat p + b / \sqrt{T + 1})` with `optimism` :math:`b`
and :math:`T` its rounds that reached the position, and until the call has run it, its predicted prompt prefill is
charged as a share of the tokens left (`hf_metasd.round_context`).

**Learning.** Nothing here is a mean reward: the rates are `DraftLength`'s, and every model-free arm learns them
from every round, drafted or not (the candidate generator's replayed rounds give full information for free), so the
policy never spends a round to learn a copier's worth. A model drafter learns from its own rounds; its rates start
at the shrinkage prior (one half, a few pseudo-rounds) and its drafting cost at zero until measured, which is
optimistic: it is tried early, then judged on what it measured. Rates and costs are kept per process and per target
(and per `hf_metasd.reward_memory_scope`), so later calls start from what earlier ones learnt.

Without a context (`select`, e.g. in the simulator or vLLM's proposer), it picks the arm with the highest mean
reward, priors included (`set_prior`: a pool's measured speed of each arm alone), as a greedy policy would;
`fallback` takes the next best rate of the round's context.

Example:
    >>> from hf_metasd.policies import get_policy
    >>> from hf_metasd.policies.context import RoundContext
    >>> policy = get_policy("throughput")
    >>> policy.reset(num_arms=3)
    >>> policy.select_in(RoundContext(rates=(4.0, None, 2.5), lengths=(3, 0, 0)))
    0
    >>> policy.fallback({0})     # arm 1 abstained this round: the no-draft arm (2) is next
    2
"""

from __future__ import annotations

import dataclasses

from .._validation import check_real
from .base import Policy, PolicySettings, setting
from .context import RoundContext
from .registry import register_policy

__all__ = ["Throughput", "ThroughputSettings"]


@dataclasses.dataclass(frozen=True)
class ThroughputSettings(PolicySettings):
    """Settings of `Throughput`."""

    optimism: float = setting(
        0.5,
        "b >= 0: a model drafter's acceptance rates are read as p + b / sqrt(T + 1) (T: its rounds that reached the "
        "position); larger: it is tried more before it is judged",
        check_real,
        low=0.0,
        hint="Use e.g. 0.5.",
    )


@register_policy
class Throughput(Policy):
    r"""The arm with the highest expected tokens per second this round (see the module docstring).

    Args:
        optimism: :math:`b \ge 0`, the optimism the round's context reads a model drafter's acceptance rates with
            (copiers need none: every round scores them). 0: a model drafter starts at the prior rate of one half.
        seed: unused (deterministic); accepted for a uniform interface.
    """

    name = "throughput"
    contextual = True
    learns_side_observations = True
    supports_prior = True  # read by `select`, the choice without a round's context
    settings_class = ThroughputSettings

    def __init__(self, optimism: float = 0.5, *, seed: int | None = None) -> None:
        self._configure(seed, optimism=optimism)
        self._rates: tuple[float | None, ...] = ()

    def reset(self, num_arms: int) -> None:
        super().reset(num_arms)
        self._rates = ()

    def select(self) -> int:
        """Without a round's context: the highest mean reward (ties: the lowest index)."""
        self._check_ready()
        return self._argmax(self.means())

    def select_in(self, context: RoundContext) -> int:
        """The arm with the highest rate of `context` (ties: the lowest index); with no rate at all, `select`."""
        self._check_ready()
        self._rates = tuple(context.rates)
        known = [(rate, arm) for arm, rate in enumerate(self._rates) if rate is not None]
        if not known:
            return self.select()
        return max(known, key=lambda pair: (pair[0], -pair[1]))[1]

    def fallback(self, exclude: set[int]) -> int | None:
        """The next best rate of the round's context among the arms not in `exclude` (``None`` when none has one)."""
        self._check_ready()
        known = [(rate, arm) for arm, rate in enumerate(self._rates) if rate is not None and arm not in exclude]
        if not known:
            return None if self._rates else super().fallback(exclude)
        return max(known, key=lambda pair: (pair[0], -pair[1]))[1]
