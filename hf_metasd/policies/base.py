"""The `Policy` contract: a multi-armed bandit over the drafters of a pool (its knobs: `hf_metasd.policies.settings`).

A policy knows nothing about models. Each round the candidate generator asks it for an arm (`select`), lets that
drafter draft, and after verification tells it the reward (`update`). Rewards are floats, in ``[0, 1]`` for the
built-in rewards (BE, BD, cost); policies whose maths assumes that range refuse others (see `Policy.reward_bound`).
"""

from __future__ import annotations

import dataclasses
import math
import random
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from .._validation import check_real, check_unit_reward
from .context import RoundContext
from .mapping import POLICY_REGISTRY
from .settings import PolicySettings, setting

__all__ = ["IndexPolicy", "Policy", "PolicySettings", "setting"]

#: Pseudo-observations a prior mean counts as when `set_prior` is not told otherwise.
DEFAULT_PRIOR_WEIGHT = 2.0


_MISSING = object()


class _SettingAttribute(property):
    """The read-only attribute through which a policy reads one of its settings (``UCB(beta=0.5).beta == 0.5``)."""

    def __init__(self, name: str) -> None:
        super().__init__(lambda policy: getattr(policy.settings, name), doc=f"`settings.{name}` (read-only).")


def _log_or_zero(n: float) -> float:
    r""":math:`\ln n` for the UCB bonuses, 0.0 for ``n <= 1`` (no bonus before a second round)."""
    return math.log(n) if n > 1 else 0.0


class Policy(ABC):
    """Base class of every policy.

    Subclasses set `name` (the registry key), implement `select` and, when they keep more than pull counts and reward
    sums, extend `_observe`: per-drafter lists named in `arm_state` are created, zeroed by `reset` and saved by
    `state_dict` here; anything else, extend `reset` / `state_dict` / `load_state_dict`. Settings are keyword
    arguments of `__init__`, stored as a frozen `PolicySettings` subclass in `settings` (named by `settings_class`),
    read as read-only attributes of the same names (added to the class for every field of `settings_class`) and
    returned, with `seed`, by `config()` so that a pool can save them.

    Priors. `set_prior` gives some drafters a prior mean reward, counted as `weight` pseudo-observations: `means()`
    and the index policies use ``counts + prior_counts`` and ``sums + prior_sums``, while `counts` and `sums` keep
    only what was observed (telemetry reads them). A drafter with a prior is not "untried": no forced first pull.
    The prior belongs to the pool, not to what was learnt: `reset` (hence `bind`) keeps it, `clear_prior` removes it,
    `state_dict` saves it. Only policies that estimate a mean reward per drafter accept one (`supports_prior`).

    Attributes:
        num_arms: number of drafters, set by `reset` (``None`` until then).
        counts: pulls per arm, ``counts[i] = n_i`` (observed rounds only, never pseudo-observations).
        sums: summed observed rewards per arm; ``sums[i] / counts[i]`` is the empirical mean.
        t: total number of updates since the last `reset`.
        settings: the policy's `PolicySettings`.
        prior_means: the prior set with `set_prior` (one mean or ``None`` per arm), or ``None``.
        prior_weight: pseudo-observations each prior mean counts as (``None`` without a prior).
        full_information: class attribute; ``True`` for policies that learn from every drafter's (counterfactual)
            reward each round through `update_all` (``hedge``). The candidate generator and the simulator then score
            every drafter after each round; for the other policies `update_all` is a no-op.

    Example:
        >>> from hf_metasd.policies import get_policy
        >>> policy = get_policy("ucb", beta=0.5)
        >>> policy.reset(num_arms=2)
        >>> arm = policy.select(); policy.update(arm, 0.75)
        >>> policy.counts, policy.means()
        ([1, 0], [0.75, 0.0])
    """

    name: ClassVar[str] = ""
    #: True for policies that learn from every drafter's (counterfactual) reward each round, see `update_all`.
    #: False for policies whose choices ignore rewards (fixed, random, round robin): nothing is measured for them.
    uses_rewards: ClassVar[bool] = True
    full_information: ClassVar[bool] = False
    #: True for policies that choose from what is known about each arm before the round drafts (`select_in` reads a
    #: `~hf_metasd.policies.context.RoundContext`: ``throughput``); the candidate generator then computes it.
    contextual: ClassVar[bool] = False
    #: True for policies whose estimates are per-drafter sample statistics (means, variances, posteriors): a reward
    #: known without pulling the drafter is one more sample, and `observe` records it like `update`.
    learns_side_observations: ClassVar[bool] = False
    #: The dataclass of this policy's settings (its constructor arguments but `seed`).
    settings_class: ClassVar[type[PolicySettings]] = PolicySettings
    #: True for policies that use `set_prior` (they estimate a mean reward per drafter).
    supports_prior: ClassVar[bool] = False
    #: Per-drafter lists the policy learns besides `counts` and `sums`, name -> element type (`float` or `int`):
    #: ``[]`` until `reset`, which sets them to ``[type()] * num_arms``; `state_dict` saves them under their names.
    #: A subclass extends its parent's: ``arm_state = {**Parent.arm_state, "extra": float}``.
    arm_state: ClassVar[Mapping[str, type]] = {}
    #: *h* for policies whose maths assumes rewards in ``[0, h]`` (what `reward_bound` returns); ``None``: any reward.
    max_reward: ClassVar[float | None] = None
    #: The settings of this instance; a policy without knobs keeps this empty default.
    settings: PolicySettings = PolicySettings()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Give the class a read-only attribute for each field of its `settings_class` (``policy.beta``)."""
        super().__init_subclass__(**kwargs)
        for field in dataclasses.fields(cls.settings_class):
            current = getattr(cls, field.name, _MISSING)
            if isinstance(current, _SettingAttribute):
                continue
            if current is not _MISSING:
                raise TypeError(
                    f"`{cls.settings_class.__name__}.{field.name}` must not reuse a name of `{cls.__name__}`, but "
                    f"`{cls.__name__}.{field.name}` is {current!r}. Rename the setting."
                )
            setattr(cls, field.name, _SettingAttribute(field.name))

    def __init__(self, *, seed: int | None = None) -> None:
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise TypeError(f"`seed` must be an int or None, but is {seed!r}. Pass an integer seed.")
        self.seed = seed
        self.num_arms: int | None = None
        self.counts: list[int] = []
        self.sums: list[float] = []
        self.t = 0
        self._rng = random.Random(seed)
        self.prior_means: list[float | None] | None = None
        self.prior_weight: float | None = None
        for name in self.arm_state:
            setattr(self, name, [])

    def _configure(self, seed: int | None, **settings: Any) -> None:
        """`Policy.__init__` with `seed`, then ``settings = settings_class(**settings)`` (validated there): the whole
        constructor of a policy that keeps nothing but its settings, called by its ``__init__`` with its arguments."""
        Policy.__init__(self, seed=seed)
        self.settings = self.settings_class(**settings)

    @classmethod
    def from_settings(cls, settings: PolicySettings, *, seed: int | None = None) -> Policy:
        """A fresh policy built from a settings object, e.g. ``UCB.from_settings(UCBSettings(beta=0.5))``."""
        if not isinstance(settings, cls.settings_class):
            raise TypeError(
                f"`settings` must be a {cls.settings_class.__name__}, but is {type(settings).__name__}. "
                f"Build it with `{cls.settings_class.__name__}(...)`."
            )
        return cls(**settings.to_dict(), seed=seed)

    # ------------------------------------------------------------------ contract
    def reset(self, num_arms: int) -> None:
        """Forget everything learnt and prepare for `num_arms` drafters (re-seeds the random generator).

        A prior (`set_prior`) is kept: it describes the pool, not what was learnt. Its length must be `num_arms`.
        """
        if not isinstance(num_arms, int) or isinstance(num_arms, bool) or num_arms < 1:
            raise ValueError(f"`num_arms` must be a positive int, but is {num_arms!r}. Give the pool size.")
        if self.prior_means is not None and len(self.prior_means) != num_arms:
            raise ValueError(
                f"`num_arms` must match the prior set with `set_prior` ({len(self.prior_means)} drafters), but is "
                f"{num_arms}. Call `clear_prior()`, or `set_prior` with {num_arms} means, first."
            )
        self.num_arms = num_arms
        self.counts = [0] * num_arms
        self.sums = [0.0] * num_arms
        self.t = 0
        self._rng = random.Random(self.seed)
        for name, kind in self.arm_state.items():
            setattr(self, name, [kind()] * num_arms)

    @abstractmethod
    def select(self) -> int:
        """Return the index of the drafter that drafts the next round."""

    def select_in(self, context: RoundContext) -> int:
        """The arm of a round whose `context` is known (a contextual policy's choice); default: `select`."""
        return self.select()

    def fallback(self, exclude: set[int]) -> int | None:
        """The arm that drafts a round whose chosen drafter(s) in `exclude` abstained (had nothing to propose).

        An abstention is not a pull: it says nothing about how good the drafter's drafts are, so it is not
        recorded, and the policy's own choice stays first in later rounds (a prompt-lookup drafter is asked first
        every round and, when it finds no match, the round goes to the fallback). Default: the lowest-index arm
        not yet pulled (and without a prior), else the best of `scores()` (index policies such as UCB) or of the
        means, among the arms not in `exclude`; ``None`` when every arm is excluded (the round is a plain target
        step).

        Example:
            >>> from hf_metasd.policies import get_policy
            >>> policy = get_policy("epsilon_greedy", epsilon=0.0)
            >>> policy.reset(num_arms=3)
            >>> for arm, reward in [(0, 0.9), (1, 0.2), (2, 0.5)]:
            ...     policy.update(arm, reward)
            >>> policy.fallback({0}), policy.fallback({0, 2}), policy.fallback({0, 1, 2})
            (2, 1, None)
        """
        self._check_ready()
        allowed = [arm for arm in range(self.num_arms) if arm not in exclude]
        if not allowed:
            return None
        effective = self.effective_counts()
        untried = [arm for arm in allowed if effective[arm] == 0]
        if untried:
            return untried[0]
        scores = getattr(self, "scores", None)
        values = scores() if callable(scores) else self.means()
        return allowed[self._argmax([values[arm] for arm in allowed])]

    def update(self, arm: int, reward: float) -> None:
        """Record `reward` for `arm` (the drafter chosen by the last `select`).

        Refuses an arm outside the pool, a NaN reward and, for policies with a `reward_bound`, a reward outside
        ``[0, bound]`` (round-off within 1e-6 is clipped); nothing is recorded then. Subclasses that learn more than
        counts and sums extend `_observe`, which sees the validated reward.
        """
        self._check_ready()
        self._check_arm(arm)
        self._observe(arm, self._check_reward(reward))

    def observe(self, arm: int, reward: float) -> None:
        r"""A side observation: the reward `arm` would have earned in a round it did not draft, known in hindsight.

        `MetaCandidateGenerator` makes them under greedy decoding (its *replayed rounds*): what a model-free drafter
        would have proposed at the round's position is scored once the target's tokens there are known, and the
        no-draft arm's reward is known without a pull. For a policy with `learns_side_observations` (UCB, UCB-V,
        `ucb_scaled`, Thompson sampling, epsilon-greedy) a side observation is one more sample of the arm's reward
        and is recorded like `update`, except that it does not count as a round: it adds to the arm's
        :math:`n_i` and reward sums, not to *t* (the rounds, whose :math:`\ln t` sizes the index policies' bonus; a
        side observation every round would otherwise grow every bonus with the number of observations, not with
        time). The others ignore it: EXP3's
        importance weights and the schedules of successive halving and of the discounted and sliding-window UCBs
        are about pulls, not samples.

        Example:
            >>> from hf_metasd.policies import get_policy
            >>> ucb, exp3 = get_policy("ucb"), get_policy("exp3")
            >>> for policy in (ucb, exp3):
            ...     policy.reset(num_arms=2); policy.observe(1, 0.5)
            >>> ucb.counts, ucb.t, exp3.counts
            ([0, 1], 0, [0, 0])
        """
        if self.learns_side_observations:
            self.update(arm, reward)
            self.t -= 1  # a sample, not a round

    def update_all(self, rewards: Mapping[int, float]) -> None:
        """Full-information update: `rewards` maps arms to (counterfactual) rewards observed this round.

        Bandit policies learn only from the arm they pulled, so the default ignores it; full-information policies
        (`full_information = True`) override it.
        """

    def bind(self, num_arms: int) -> None:
        """`reset` a fresh policy; keep a policy that already learnt on a pool of the same size.

        This is what lets a policy *instance* learn across `generate` calls. A prior survives either way.
        """
        if self.num_arms is None:
            self.reset(num_arms)
        elif self.num_arms != num_arms:
            raise ValueError(
                f"`meta_policy` was bound to {self.num_arms} drafters, but the pool has {num_arms}. "
                "Call `policy.reset(num_arms)` or pass the policy by name to start fresh."
            )

    def reward_bound(self) -> float | None:
        """*h* when the policy's maths assumes rewards in ``[0, h]`` (`update` refuses others), else ``None``.

        The class's `max_reward`; a policy whose bound is a setting (UCB-V's `b`) overrides this.
        """
        return self.max_reward

    # ------------------------------------------------------------------ priors
    def set_prior(self, means: Sequence[float | None], weight: float = DEFAULT_PRIOR_WEIGHT) -> None:
        """Give drafters a prior mean reward, each worth `weight` observed rounds at that mean.

        Args:
            means: one entry per drafter: its prior mean reward (in ``[0, reward_bound()]`` when the policy has a
                bound), or ``None`` for no prior on that drafter. Before `reset` it fixes the pool size that
                `reset` / `bind` must then be given.
            weight: :math:`w > 0`, how many pseudo-observations each prior mean counts as. Larger trusts the prior
                longer: it takes about *w* real rounds for the data to weigh as much. Default 2.0.

        Replaces any earlier prior and takes effect at once. `counts`, `sums` and `t` are untouched; `means()` and
        the index policies read ``counts + prior_counts`` and ``sums + prior_sums``.

        Example:
            >>> from hf_metasd.policies import get_policy
            >>> policy = get_policy("epsilon_greedy", epsilon=0.0)
            >>> policy.set_prior([0.8, None], weight=3.0)
            >>> policy.reset(num_arms=2)
            >>> policy.select()                  # drafter 0 has a prior: drafter 1 is the one untried
            1
            >>> policy.update(0, 0.4)            # (3 * 0.8 + 0.4) / (3 + 1)
            >>> policy.counts, [round(m, 4) for m in policy.means()]
            ([1, 0], [0.7, 0.0])
        """
        if not self.supports_prior:
            accepting = sorted(name for name, cls in POLICY_REGISTRY.items() if cls.supports_prior)
            raise TypeError(
                f"`set_prior` needs a policy that estimates a mean reward per drafter, but {self.name!r} "
                f"({type(self).__name__}) does not. Use one of {accepting}, or do not set a prior."
            )
        if isinstance(means, (str, bytes, Mapping)) or not isinstance(means, Sequence):
            raise TypeError(
                f"`means` must be a list with one prior mean (or None) per drafter, but is {type(means).__name__} "
                f"{means!r}. Pass e.g. [0.9, None, 0.6]."
            )
        expected = self.num_arms
        if expected is not None and len(means) != expected:
            raise ValueError(
                f"`means` must have one entry per drafter ({expected}), but has {len(means)}. "
                "Give a mean, or None, for every drafter."
            )
        if not means:
            raise ValueError("`means` must have one entry per drafter, but is empty. Give a mean or None per drafter.")
        bound = self.reward_bound()
        clean: list[float | None] = []
        for arm, mean in enumerate(means):
            if mean is None:
                clean.append(None)
                continue
            what = "a finite float" if bound is None else f"a float in [0, {bound:g}]"
            hint = f"Give drafter {arm}'s expected reward, or None for no prior on it."
            ok = isinstance(mean, (int, float)) and not isinstance(mean, bool) and math.isfinite(mean)
            if not ok or (bound is not None and not 0.0 <= mean <= bound):
                raise ValueError(f"`means[{arm}]` must be None or {what}, but is {mean!r}. {hint}")
            clean.append(float(mean))
        weight = check_real(
            "weight", weight, low=0.0, low_open=True, hint="Use 2.0 (each prior mean counts as two observed rounds)."
        )
        self.prior_means = clean
        self.prior_weight = weight

    def clear_prior(self) -> None:
        """Remove the prior set with `set_prior` (a no-op without one); what was learnt stays."""
        self.prior_means = None
        self.prior_weight = None

    @property
    def prior_counts(self) -> list[float]:
        """Pseudo-observations per arm: `prior_weight` where a prior mean is set, else 0.0."""
        if self.prior_means is None:
            return [0.0] * (self.num_arms or 0)
        return [0.0 if m is None else self.prior_weight for m in self.prior_means]

    @property
    def prior_sums(self) -> list[float]:
        """Pseudo-reward per arm: ``prior_weight * mean`` where a prior mean is set, else 0.0."""
        if self.prior_means is None:
            return [0.0] * (self.num_arms or 0)
        return [0.0 if m is None else self.prior_weight * m for m in self.prior_means]

    @property
    def prior_sq_sums(self) -> list[float]:
        """``prior_weight * mean ** 2`` where a prior mean is set, else 0.0: the prior's share of a sum of squared
        rewards (for policies that track reward variances)."""
        if self.prior_means is None:
            return [0.0] * (self.num_arms or 0)
        return [0.0 if m is None else self.prior_weight * m * m for m in self.prior_means]

    def effective_counts(self) -> list[float]:
        """``counts[i] + prior_counts[i]``: the observations behind each arm's mean."""
        return [n + p for n, p in zip(self.counts, self.prior_counts)]

    # ------------------------------------------------------------------ helpers
    def means(self) -> list[float]:
        """Mean reward per arm, prior included: ``(sums + prior_sums) / (counts + prior_counts)`` (0.0 if both 0)."""
        return [
            (s + ps) / (n + pn) if n + pn else 0.0
            for s, n, ps, pn in zip(self.sums, self.counts, self.prior_sums, self.prior_counts)
        ]

    def config(self) -> dict[str, Any]:
        """Settings that rebuild this policy with `get_policy(name, **config())`: `settings` and `seed`."""
        return {**self.settings.to_dict(), "seed": self.seed}

    def state_dict(self) -> dict[str, Any]:
        """Everything learnt (and the prior), as JSON-serialisable Python values."""
        version, internal, gauss = self._rng.getstate()
        prior = None if self.prior_means is None else {"means": list(self.prior_means), "weight": self.prior_weight}
        return {
            "name": self.name,
            "config": self.config(),
            "num_arms": self.num_arms,
            "counts": list(self.counts),
            "sums": list(self.sums),
            "t": self.t,
            "rng_state": [version, list(internal), gauss],
            "prior": prior,
            **{name: list(getattr(self, name)) for name in self.arm_state},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` returned (a state without ``"prior"``, from before priors, has none)."""
        if state.get("name") != self.name:
            raise ValueError(
                f"`state['name']` must be {self.name!r}, but is {state.get('name')!r}. "
                f"Load it into `get_policy({state.get('name')!r})` instead."
            )
        self.num_arms = state["num_arms"]
        self.counts = list(state["counts"])
        self.sums = [float(s) for s in state["sums"]]
        self.t = int(state["t"])
        version, internal, gauss = state["rng_state"]
        self._rng.setstate((version, tuple(internal), gauss))
        for name, kind in self.arm_state.items():
            setattr(self, name, [kind(x) for x in state[name]])
        prior = state.get("prior")
        if prior is None:
            self.clear_prior()
        else:
            self.set_prior(prior["means"], weight=prior["weight"])

    def _observe(self, arm: int, reward: float) -> None:
        """Learn from a validated `reward` for a validated `arm`; subclasses extend it (calling super first)."""
        self.counts[arm] += 1
        self.sums[arm] += reward
        self.t += 1

    def _check_ready(self) -> None:
        if self.num_arms is None:
            raise RuntimeError(f"{type(self).__name__} has no arms yet. Call `reset(num_arms)` first.")

    def _check_arm(self, arm: int) -> None:
        if not 0 <= arm < self.num_arms:
            raise IndexError(
                f"`arm` must be in [0, {self.num_arms}), but is {arm}. Update with the arm `select` gave."
            )

    def _check_reward(self, reward: float, name: str = "reward") -> float:
        """`reward` as a float: NaN refused, and clipped to ``[0, reward_bound()]`` (refused further out)."""
        r = float(reward)
        if math.isnan(r):
            raise ValueError(f"`{name}` must be a number, but is {r}. Check the reward function.")
        bound = self.reward_bound()
        if bound is not None:
            r = check_unit_reward(self.name, r, name=name, high=bound)
        return r

    def _first_untried(self) -> int | None:
        """Lowest-index arm never pulled and without a prior, or None."""
        for arm, n in enumerate(self.effective_counts()):
            if n == 0:
                return arm
        return None

    def _sample(self, probs: list[float]) -> int:
        """An arm drawn from `probs` with one draw of the policy's random generator."""
        u = self._rng.random()
        acc = 0.0
        for arm, p in enumerate(probs):
            acc += p
            if u < acc:
                return arm
        return len(probs) - 1  # u landed in the round-off gap above sum(probs)

    @staticmethod
    def _argmax(values: list[float]) -> int:
        """Index of the largest value; ties go to the lowest index (deterministic, testable)."""
        best = 0
        for i, v in enumerate(values):
            if v > values[best]:
                best = i
        return best

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({settings})"


class IndexPolicy(Policy):
    """A policy that pulls every drafter once (in pool order), then the one with the highest index in `scores`.

    Subclasses implement `scores` (``inf`` for a drafter with no observation); `select` and `fallback` use it, ties
    going to the lowest index. `ucb`, its discounted and sliding-window variants and `ucb_v` are index policies.
    """

    @abstractmethod
    def scores(self) -> list[float]:
        """The index of every drafter; the largest drafts the next round."""

    def select(self) -> int:
        self._check_ready()
        untried = self._first_untried()
        if untried is not None:
            return untried
        return self._argmax(self.scores())

    def _log_rounds(self) -> float:
        r""":math:`\ln t` with *t* the rounds so far plus every pseudo-observation of the prior (0.0 while t <= 1)."""
        return _log_or_zero(self.t + sum(self.prior_counts))
