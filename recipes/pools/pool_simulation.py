"""Replay MetaSD calls on recorded dev-prompt tables: choose a pool's arms and defaults fast, on this machine's costs.

`recipes/pools/acceptance_matrix.py` records, for every candidate drafter, dev prompt and position ``t`` of the target's
greedy answer, what the drafter proposes there (its length, and how much of it the target accepts: for greedy
decoding, the common prefix with the answer) and what drafting cost. A MetaSD call with any policy and any subset of
those drafters is then replayed round by round without running the target: the round's arm comes from the real
`Policy` (with the call's calibration round, fallbacks on abstention and the deferred prefill reward, as in
`MetaCandidateGenerator`), its reward from the real reward functions, and its cost from measured numbers (the
drafter's median drafting seconds, one drafting step more after a switch for model drafters, the target's measured
verification seconds for the number of tokens it verifies). The replay gives each method's simulated wall time;
speedups are against plain decoding of the same answers (one verification of one token per token).

This is a model of the real call (no timing noise, no Python overhead beyond a constant per round), used to *rank*
choices on dev prompts. Every figure the docs quote comes from real runs (`hf-metasd bench`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hf_metasd.policies import get_policy
from hf_metasd.rewards import speed

NO_DRAFT = "no_draft"


@dataclass
class Costs:
    """Seconds: `verify[k]` a target forward over k tokens; `draft[name]` a drafter's median drafting call (catch-up
    of the last round's tokens + `n` steps); `model[name]` whether the drafter runs a model (pays a catch-up step
    after others drafted); `overhead` per round."""

    verify: dict[int, float]
    draft: dict[str, float]
    model: dict[str, bool]
    n: int
    overhead: float = 0.001


def _rows(table, name, task, i):
    return table[name][task][i]


def replay_call(
    table: dict,
    names: Sequence[str],
    task: str,
    index: int,
    costs: Costs,
    *,
    policy: str = "ucb",
    policy_kwargs: dict | None = None,
    num_assistant_tokens: int = 3,
    no_draft: bool = True,
    priors: dict[str, float] | None = None,
    prior_weight: float = 2.0,
    smoothing: float = 0.3,
    cost_cache: dict | None = None,
    fixed_arm: int | None = None,
    replay: bool | None = None,
) -> tuple[float, int, list[int]]:
    """Simulated seconds, tokens and arms of one call over the drafters `names` on dev prompt (`task`, `index`).

    With `replay` (``None``: when the policy `learns_side_observations`, as `generate` decides), every round also gives the policy a side observation (`Policy.observe`) of each model-free
    drafter that did not draft it (what it would have accepted at the round's position, with its drafting cost and
    this round's verification) and of the no-draft arm, as `MetaCandidateGenerator` does with ``meta_replay``.
    """
    n = num_assistant_tokens
    rows = [_rows(table, name, task, index) for name in names]
    length = len(rows[0])
    arm_names = list(names) + ([NO_DRAFT] if no_draft else [])
    k = len(arm_names)
    pol = get_policy("fixed", arm=fixed_arm) if fixed_arm is not None else get_policy(policy, **(policy_kwargs or {}))
    pol.reset(k)
    if replay is None:
        replay = pol.learns_side_observations
    if priors and pol.supports_prior:
        pol.set_prior([priors.get(name) for name in arm_names], weight=prior_weight)
    cache = cost_cache if cost_cache is not None else {}
    est: dict[str, float | None] = {name: cache.get(name) for name in arm_names}
    plain_arm = len(names) if no_draft else None
    t, total, first, last, seen, arms = 0, 0.0, True, None, set(), []
    deferred = None
    while t < length:
        round_seconds = costs.overhead
        if not first and no_draft and est[NO_DRAFT] is None and pol.uses_rewards and plain_arm not in arms:
            arm = plain_arm
        else:
            arm = pol.select()
        abstained = []
        drafted = accepted = 0
        prefill = 0.0
        while arm != plain_arm and arm is not None:
            name = names[arm]
            d, a, _ = rows[arm][t]
            budget = min(n, length - t - 1)
            d, a = min(d, budget), min(a, budget)
            step = costs.draft[name] * (d / costs.n if costs.model[name] else 1.0)
            if costs.model[name] and last != arm:
                if arm in seen:
                    step += costs.draft[name] / costs.n  # catch-up after a switch
                else:
                    prefill += costs.draft[name] / costs.n  # its prompt prefill: paid, not part of its round cost
            seen.add(arm)
            last = arm
            round_seconds += step + prefill
            if d > 0:
                drafted, accepted = d, a
                break
            abstained.append(arm)
            arm = pol.fallback(set(abstained))
        plain = arm is None or arm == plain_arm
        round_seconds += costs.verify[1 if plain else drafted + 1]
        total += round_seconds
        label = NO_DRAFT if plain else names[arm]
        arms.append(plain_arm if plain and no_draft else (arm if arm is not None else -1))
        if not first and (not plain or no_draft):
            key = NO_DRAFT if plain else label
            old = est.get(key)
            measured = round_seconds - prefill
            est[key] = measured if old is None else (1 - smoothing) * old + smoothing * measured
        # reward (speed), or deferred for the prefill round until its arm's cost is known
        chosen = plain_arm if plain else arm
        if arm is not None and not (plain and not no_draft):
            pending = [(chosen, accepted, first)]
            if deferred is not None:
                pending.insert(0, deferred)
                deferred = None
            for which, acc, was_first in pending:
                key = NO_DRAFT if which == plain_arm else names[which]
                if est.get(key) is None or est.get(NO_DRAFT) is None:
                    if was_first:
                        deferred = (which, acc, True)
                    continue
                pol.update(which, speed(float(acc), n, est[key], est[NO_DRAFT]))
        if replay and not first and est.get(NO_DRAFT) is not None:
            _replay_round(pol, rows, names, costs, est, t, length, n, chosen, plain_arm, drafted, smoothing)
        t += accepted + 1
        first = False
    if cost_cache is not None:
        cost_cache.update({key: value for key, value in est.items() if value is not None})
    return total, length, arms


def _replay_round(pol, rows, names, costs, est, t, length, n, chosen, plain_arm, drafted, smoothing) -> None:
    """The side observations of one round at position `t` (see `replay_call`)."""
    for arm, name in enumerate(names):
        if arm == chosen or costs.model[name]:
            continue
        d, a, _ = rows[arm][t]
        budget = min(n, length - t - 1)
        d, a = min(d, budget), min(a, budget)
        if d == 0:
            continue
        if drafted:  # a counterfactual cost: its drafting, this round's verification
            measured = costs.overhead + costs.draft[name] + costs.verify[drafted + 1]
            old = est.get(name)
            est[name] = measured if old is None else (1 - smoothing) * old + smoothing * measured
        if est.get(name) is not None:
            pol.observe(arm, speed(float(a), n, est[name], est[NO_DRAFT]))
    if plain_arm is not None and chosen != plain_arm:
        pol.observe(plain_arm, 1.0 / (n + 1))


def plain_seconds(table, names, task, index, costs: Costs) -> float:
    """Plain decoding of the same answer: one verification of one token per token."""
    return len(_rows(table, names[0], task, index)) * (costs.verify[1] + costs.overhead)


def evaluate(table, names, tasks, costs, **kwargs) -> dict[str, float]:
    """Simulated speedup per task and overall (sum of plain seconds / sum of simulated seconds) over the dev prompts."""
    out, plain_all, sim_all = {}, 0.0, 0.0
    for task in tasks:
        plain_t = sim_t = 0.0
        for i in range(len(table[names[0]][task])):
            plain_t += plain_seconds(table, names, task, i, costs)
            sim_t += replay_call(table, names, task, i, costs, **kwargs)[0]
        out[task] = plain_t / sim_t
        plain_all += plain_t
        sim_all += sim_t
    out["overall"] = plain_all / sim_all
    return out


def measured_priors(table, names, tasks, costs, n: int) -> dict[str, float]:
    """Each arm's mean `speed` reward when it drafts alone over the dev prompts (the no-draft arm: 1 / (n + 1))."""
    priors = {NO_DRAFT: 1.0 / (n + 1)}
    plain = costs.verify[1] + costs.overhead
    for name in names:
        rewards = []
        for task in tasks:
            for rows in table[name][task]:
                t = 0
                while t < len(rows):
                    d, a, _ = rows[t]
                    budget = min(n, len(rows) - t - 1)
                    d, a = min(d, budget), min(a, budget)
                    if d == 0:
                        t += 1
                        continue
                    seconds = costs.overhead + costs.draft[name] * (d / costs.n if costs.model[name] else 1.0)
                    seconds += costs.verify[d + 1]
                    rewards.append(speed(float(a), n, seconds, plain))
                    t += a + 1
        priors[name] = sum(rewards) / len(rewards) if rewards else 0.0
    return priors
