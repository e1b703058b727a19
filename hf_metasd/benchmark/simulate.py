r"""A bandit simulator for MetaSD policies: simulated drafters with known acceptance rates, no model code.

Why: a policy's cost is the extra rounds it needs to produce *B* tokens compared with always using the best drafter
(the *stopping-time regret* of the MetaSD paper). With simulated drafters the best drafter is known, so the regret
of every policy, the variance of BE against BD, and the behaviour under a change of drafter quality can be measured in
seconds, without a GPU.

Model of one round
------------------
Drafter *i* has a per-token acceptance rate :math:`\alpha_i` (which may change at given token counts, see
`Scenario.switching`). A round with drafter *i* drafts :math:`N` tokens (`Scenario.draft_length`). Position
:math:`j = 1..N` has acceptance probability :math:`a_j`:

* ``concentration=None`` (default): :math:`a_j = \alpha_i` exactly;
* ``concentration=c``: :math:`a_j \sim \mathrm{Beta}(c\,\alpha_i, c\,(1 - \alpha_i))` independently, so
  :math:`\mathbb E[a_j] = \alpha_i` and :math:`\mathrm{Var}[a_j] = \alpha_i (1 - \alpha_i) / (c + 1)` (the
  context-to-context variation of a real drafter's agreement with the target).

Drafted token *j* is accepted with probability :math:`a_j` (a uniform draw :math:`u_j < a_j`), and acceptance stops at
the first rejection, so ``accepted`` is the length of the accepted prefix, :math:`0 \le` ``accepted`` :math:`\le N`.
The round produces ``accepted + 1`` tokens (the accepted ones plus the target's corrected or bonus token). Since the
:math:`a_j` are independent with mean :math:`\alpha_i`, the expected tokens per round are exactly
:math:`1 + \sum_{k=1}^{N} \alpha_i^k` (`Scenario.expected_tokens`).

Rewards (all in ``[0, 1]``):

* ``"be"``: ``accepted / N``, the realised block efficiency;
* ``"bd"``: :math:`\frac1N \sum_{j=1}^{N} a_j`, the mean per-position acceptance probability over all drafted
  positions. In real decoding :math:`1 - \mathrm{TV}(p_j, q_j)` is exactly the acceptance probability of position
  *j*, so this is BD's simulated counterpart; with ``concentration=None`` it is :math:`\alpha_i` itself (no noise);
* ``"cost"``: realised tokens per unit of round time, normalised by its maximum:
  ``(accepted + 1) / ((N c_i + 1) (N + 1))``. A round's simulated wall time is :math:`N c_i + 1` (drafting costs
  :math:`c_i` per token relative to one target forward, verification costs 1), so ``(accepted + 1) / (N c_i + 1)`` is
  at most :math:`N + 1` (all accepted, free drafter) and the division by :math:`N + 1` puts the reward in
  ``[0, 1]``.

The simulation stops at the first round after which at least *B* tokens (``target_tokens``) were produced: the number
of rounds is the stopping time. Randomness uses common random numbers: drafter *i* owns a random stream seeded by
``(seed, i)``, so its *k*-th round has the same outcome whatever policy runs (for a stationary scenario). That makes
the difference "policy minus oracle" at the same seed far less noisy than two independent runs.

Full information: for a policy with ``full_information = True`` (e.g. ``hedge``), each round the simulator also
draws what every other drafter would have earned (from separate streams, same reward kind) and passes all of them,
the drafter that drafted included, to ``policy.update_all({arm: reward, ...})`` after ``policy.update(arm, reward)``,
the order `MetaCandidateGenerator` uses.

Example:
    >>> from hf_metasd.benchmark.simulate import Scenario, simulate, stopping_time_regret
    >>> scenario = Scenario.stationary([1.0, 0.5], draft_length=4)
    >>> simulate("fixed", scenario, target_tokens=100).rounds      # 5 tokens a round: ceil(100 / 5)
    20
    >>> stopping_time_regret("fixed", scenario, target_tokens=100, seeds=[0, 1], policy_kwargs={"arm": 0})
    0.0
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._validation import check_choice, check_int
from ..policies import Policy, get_policy
from .scenario import MEASURES, REWARD_KINDS, Scenario, _draw_round, _reward_of, _Streams

__all__ = [
    "REWARD_KINDS",
    "Scenario",
    "SimulationResult",
    "load_trace",
    "regret_samples",
    "replay",
    "simulate",
    "simulate_oracle",
    "simulate_trace",
    "stopping_time_regret",
]


@dataclass
class SimulationResult:
    """One simulated (or replayed) generation, round by round.

    Attributes:
        arms: drafter of each round.
        rewards: reward the policy received each round.
        tokens: tokens produced each round (``accepted + 1``).
        round_times: simulated wall time of each round (:math:`N c_i + 1`; 1.0 in a replay).
        best_arms: the oracle's drafter for each round, by tokens per round (in a replay: the drafter with the most
            recorded tokens over the whole trace).
        best_arms_time: the same by tokens per unit time.
        reward: the reward kind (``"bd"``, ``"be"``, ``"cost"``, or ``"trace"``).
    """

    arms: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    round_times: list[float] = field(default_factory=list)
    best_arms: list[int] = field(default_factory=list)
    best_arms_time: list[int] = field(default_factory=list)
    reward: str = "bd"

    @property
    def rounds(self) -> int:
        """Number of rounds: the stopping time."""
        return len(self.arms)

    @property
    def total_tokens(self) -> int:
        return int(sum(self.tokens))

    @property
    def wall_time(self) -> float:
        """Simulated wall time, in target forwards."""
        return float(sum(self.round_times))

    @property
    def switches(self) -> int:
        """How many times the drafter changed between consecutive rounds."""
        return sum(a != b for a, b in zip(self.arms, self.arms[1:]))

    def best_arm_ratio(self, start: float = 0.0, end: float = 1.0, measure: str = "rounds") -> float:
        """Fraction of rounds in ``[start, end)`` (as fractions of all rounds) that used the oracle's drafter."""
        check_choice("measure", measure, MEASURES)
        if not 0.0 <= start < end <= 1.0:
            raise ValueError(f"`start`, `end` must satisfy 0 <= start < end <= 1, but are {start}, {end}. Fix them.")
        best = self.best_arms if measure == "rounds" else self.best_arms_time
        lo, hi = int(start * self.rounds), int(math.ceil(end * self.rounds))
        window = range(lo, hi)
        return sum(self.arms[i] == best[i] for i in window) / max(len(window), 1)

    def reward_variance(self) -> dict[int, float]:
        """Sample variance (ddof=1) of the rewards of each drafter that drafted at least twice."""
        out: dict[int, float] = {}
        arms = np.asarray(self.arms)
        rewards = np.asarray(self.rewards, dtype=float)
        for arm in sorted(set(self.arms)):
            r = rewards[arms == arm]
            if r.size >= 2:
                out[arm] = float(r.var(ddof=1))
        return out


# ---------------------------------------------------------------------------------------------------- core
def _run(
    scenario: Scenario,
    choose,
    policy: Policy | None,
    reward: str,
    target_tokens: int,
    seed: int,
    full_information: bool,
) -> SimulationResult:
    check_choice("reward", reward, REWARD_KINDS)
    target_tokens = check_int("target_tokens", target_tokens, low=1, hint="Use e.g. 1000.")
    k, n, conc = scenario.num_arms, scenario.draft_length, scenario.concentration
    streams = _Streams(seed, 2 * k).rngs  # k streams for pulls, k for counterfactual rounds
    times = [scenario.round_time(i) for i in range(k)]
    best = [scenario.best_arm(s, "rounds") for s in range(len(scenario.alphas))]
    best_time = [scenario.best_arm(s, "wall_time") for s in range(len(scenario.alphas))]
    result = SimulationResult(reward=reward)
    produced = 0
    while produced < target_tokens:
        segment = scenario.segment_at(produced)
        alphas = scenario.alphas[segment]
        arm = choose(segment)
        if not (isinstance(arm, int) and 0 <= arm < k):
            raise IndexError(f"the policy selected drafter {arm!r}, but the scenario has {k}. Fix the policy.")
        accepted, bd = _draw_round(streams[arm], alphas[arm], n, conc)
        r = _reward_of(reward, accepted, bd, n, times[arm])
        if policy is not None:
            policy.update(arm, r)
            if full_information:
                rewards = {arm: r}
                for other in range(k):
                    if other != arm:
                        acc_o, bd_o = _draw_round(streams[k + other], alphas[other], n, conc)
                        rewards[other] = _reward_of(reward, acc_o, bd_o, n, times[other])
                policy.update_all(rewards)
        produced += accepted + 1
        result.arms.append(arm)
        result.rewards.append(r)
        result.tokens.append(accepted + 1)
        result.round_times.append(times[arm])
        result.best_arms.append(best[segment])
        result.best_arms_time.append(best_time[segment])
    return result


def _make_policy(policy: str | Policy, seed: int, policy_kwargs: Mapping[str, Any] | None) -> Policy:
    if isinstance(policy, Policy):
        if policy_kwargs:
            raise ValueError(
                f"`policy_kwargs` must be empty when `policy` is an instance, but is {dict(policy_kwargs)!r}. "
                "Set the settings when you build the policy."
            )
        return policy
    kwargs = dict(policy_kwargs or {})
    kwargs.setdefault("seed", seed)
    return get_policy(policy, **kwargs)


def simulate(
    policy: str | Policy,
    scenario: Scenario,
    *,
    reward: str = "bd",
    target_tokens: int = 1000,
    seed: int = 0,
    policy_kwargs: Mapping[str, Any] | None = None,
    full_information: bool | None = None,
) -> SimulationResult:
    """Run `policy` on `scenario` until `target_tokens` tokens are produced.

    Args:
        policy: a registered name (built with ``seed=seed`` and `policy_kwargs`) or a `Policy` instance (used as
            is; its own seed drives its randomness). It is `reset` to the scenario's drafters first.
        scenario: the simulated drafters.
        reward: ``"bd"``, ``"be"`` or ``"cost"`` (see the module docstring).
        target_tokens: :math:`B`, tokens to produce.
        seed: seed of the drafters' random streams (and of a policy built by name).
        policy_kwargs: settings for a policy given by name.
        full_information: pass every drafter's counterfactual reward to `update_all` each round; default: the
            policy's `full_information` attribute.
    """
    instance = _make_policy(policy, seed, policy_kwargs)
    instance.reset(scenario.num_arms)
    full = instance.full_information if full_information is None else bool(full_information)
    return _run(scenario, lambda _segment: instance.select(), instance, reward, target_tokens, seed, full)


def simulate_oracle(
    scenario: Scenario, *, target_tokens: int = 1000, seed: int = 0, measure: str = "rounds"
) -> SimulationResult:
    """The oracle: always the best drafter of the current segment (by tokens per round, or per unit time)."""
    check_choice("measure", measure, MEASURES)
    best = [scenario.best_arm(s, measure) for s in range(len(scenario.alphas))]
    return _run(scenario, lambda segment: best[segment], None, "bd", target_tokens, seed, False)


def regret_samples(
    policy: str | Policy,
    scenario: Scenario,
    reward: str = "bd",
    target_tokens: int = 1000,
    seeds: Iterable[int] = range(10),
    *,
    policy_kwargs: Mapping[str, Any] | None = None,
    measure: str = "rounds",
    full_information: bool | None = None,
) -> list[float]:
    """Per seed: the policy's rounds (or wall time) minus the oracle's at the same seed (common random numbers)."""
    check_choice("measure", measure, MEASURES)
    out = []
    for seed in seeds:
        run = simulate(
            policy,
            scenario,
            reward=reward,
            target_tokens=target_tokens,
            seed=seed,
            policy_kwargs=policy_kwargs,
            full_information=full_information,
        )
        oracle = simulate_oracle(scenario, target_tokens=target_tokens, seed=seed, measure=measure)
        out.append(run.rounds - oracle.rounds if measure == "rounds" else run.wall_time - oracle.wall_time)
    if not out:
        raise ValueError("`seeds` must hold at least one seed, but is empty. Use e.g. `range(10)`.")
    return out


def stopping_time_regret(policy: str | Policy, scenario: Scenario, *args: Any, **kwargs: Any) -> float:
    r"""Stopping-time regret: :math:`\mathbb E[\tau_{policy}] - \mathbb E[\tau_{oracle}]`, averaged over `seeds`.

    :math:`\tau` is the number of rounds to produce `target_tokens` tokens (``measure="wall_time"``: the simulated
    wall time instead). The oracle always uses the best drafter of the current segment (`Scenario.best_arm`), so for
    a switching scenario it switches exactly when the drafters do. The arguments after `scenario` (`reward`,
    `target_tokens`, `seeds`, then the keyword-only ones) are `regret_samples`'s, with its defaults: this is the mean
    of its samples.
    """
    return float(np.mean(regret_samples(policy, scenario, *args, **kwargs)))


# ---------------------------------------------------------------------------------------------------- traces
def simulate_trace(scenario: Scenario, num_rounds: int, *, reward: str = "bd", seed: int = 0) -> list[dict]:
    """A full-information trace drawn from `scenario` (every drafter's reward and accepted count each round), in
    the format `replay` reads. The segment follows the tokens of the best drafter (as the oracle would produce)."""
    check_choice("reward", reward, REWARD_KINDS)
    k, n, conc = scenario.num_arms, scenario.draft_length, scenario.concentration
    streams = _Streams(seed, k).rngs
    trace, produced = [], 0
    for _ in range(num_rounds):
        segment = scenario.segment_at(produced)
        rewards, accepted = {}, {}
        for arm in range(k):
            acc, bd = _draw_round(streams[arm], scenario.alphas[segment][arm], n, conc)
            rewards[arm] = _reward_of(reward, acc, bd, n, scenario.round_time(arm))
            accepted[arm] = acc
        produced += accepted[scenario.best_arm(segment)] + 1
        trace.append({"arm_rewards": rewards, "arm_accepted": accepted})
    return trace


def _parse_trace(trace: Sequence[Mapping[str, Any]]) -> tuple[int, list[tuple[dict[int, float], dict[int, int]]]]:
    if isinstance(trace, Mapping) or not isinstance(trace, Sequence) or not trace:
        raise ValueError(
            f"`trace` must be a non-empty list of per-round dicts, but is {type(trace).__name__}"
            f"{'' if trace else ' (empty)'}. See `hf_metasd.benchmark.simulate.replay` for the format."
        )
    rounds, arms = [], None
    for t, entry in enumerate(trace):
        if not isinstance(entry, Mapping) or "arm_rewards" not in entry or "arm_accepted" not in entry:
            raise ValueError(
                f"`trace[{t}]` must be a dict with 'arm_rewards' and 'arm_accepted', but is {entry!r}. "
                "See `hf_metasd.benchmark.simulate.replay` for the format."
            )
        rewards = {int(a): float(r) for a, r in entry["arm_rewards"].items()}
        accepted = {int(a): int(x) for a, x in entry["arm_accepted"].items()}
        if arms is None:
            arms = sorted(rewards)
            if arms != list(range(len(arms))):
                raise ValueError(
                    f"`trace[0]['arm_rewards']` must have keys 0..K-1, but has {arms}. Record every drafter."
                )
        for name, values in (("arm_rewards", rewards), ("arm_accepted", accepted)):
            missing = sorted(set(arms) - set(values))
            if missing:
                raise ValueError(
                    f"`trace[{t}]['{name}']` must have an entry for every drafter (a full-information trace), but "
                    f"lacks drafter {missing[0]}. Record traces with `meta_policy='hedge'`."
                )
        rounds.append((rewards, accepted))
    return len(arms), rounds


def replay(
    policy: str | Policy,
    trace: Sequence[Mapping[str, Any]],
    *,
    seed: int = 0,
    policy_kwargs: Mapping[str, Any] | None = None,
    full_information: bool | None = None,
) -> SimulationResult:
    """Replay a recorded full-information trace: the policy picks, the trace says what its pick earned.

    Trace format (JSON; `load_trace` reads a file): a list with one object per round,

    .. code-block:: json

        [
          {"arm_rewards": {"0": 0.81, "1": 0.62}, "arm_accepted": {"0": 4, "1": 2}},
          {"arm_rewards": {"0": 0.77, "1": 0.70}, "arm_accepted": {"0": 3, "1": 3}}
        ]

    ``arm_rewards[i]`` is the reward drafter *i* earned, or would have earned, that round (e.g. its BD against the
    target on the verified positions) and ``arm_accepted[i]`` its accepted drafted tokens (``0..N``). Keys are
    drafter indices (strings in JSON, ints in Python), and every round must cover every drafter ``0..K-1``.

    Each round the policy selects a drafter, gets that drafter's recorded reward through `update`, and a
    full-information policy also gets every drafter's reward through `update_all`. The result's ``tokens`` are the
    selected drafter's ``accepted + 1``; ``best_arms`` is the drafter with the most recorded tokens over the trace
    (the best fixed drafter in hindsight); round times are 1.0 (traces carry no costs).
    """
    num_arms, rounds = _parse_trace(trace)
    instance = _make_policy(policy, seed, policy_kwargs)
    instance.reset(num_arms)
    full = instance.full_information if full_information is None else bool(full_information)
    totals = [sum(acc[a] for _, acc in rounds) for a in range(num_arms)]
    hindsight = max(range(num_arms), key=lambda a: (totals[a], -a))
    result = SimulationResult(reward="trace")
    for rewards, accepted in rounds:
        arm = instance.select()
        if not (isinstance(arm, int) and 0 <= arm < num_arms):
            raise IndexError(f"the policy selected drafter {arm!r}, but the trace has {num_arms}. Fix the policy.")
        instance.update(arm, rewards[arm])
        if full:
            instance.update_all(rewards)
        result.arms.append(arm)
        result.rewards.append(rewards[arm])
        result.tokens.append(accepted[arm] + 1)
        result.round_times.append(1.0)
        result.best_arms.append(hindsight)
        result.best_arms_time.append(hindsight)
    return result


def load_trace(path: str | os.PathLike) -> list[dict]:
    """Read a trace JSON file (see `replay`), with drafter keys turned into ints."""
    with open(path, encoding="utf-8") as f:
        raw = json.load(f)
    _parse_trace(raw)  # validate early, with the round number in the message
    return [
        {
            "arm_rewards": {int(a): float(r) for a, r in entry["arm_rewards"].items()},
            "arm_accepted": {int(a): int(x) for a, x in entry["arm_accepted"].items()},
        }
        for entry in raw
    ]
