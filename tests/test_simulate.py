"""The bandit simulator: exact small cases, then the properties the MetaSD analysis predicts (fast: seconds)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hf_metasd.benchmark.simulate import (
    Scenario,
    load_trace,
    regret_samples,
    replay,
    simulate,
    simulate_oracle,
    simulate_trace,
    stopping_time_regret,
)
from hf_metasd.policies import Policy, register_policy
from hf_metasd.policies.registry import POLICY_REGISTRY

THREE = Scenario.stationary([0.8, 0.5, 0.3], draft_length=5)
NOISY = Scenario.stationary([0.8, 0.5, 0.3], draft_length=5, concentration=20)
# drafter 0 degrades, the close second improves: the hard case for a UCB with a long memory
SWITCH = Scenario.switching([0.8, 0.6, 0.4], [0.55, 0.75, 0.4], switch_at=4000, draft_length=5, concentration=20)


def after_switch_ratio(result) -> float:
    start = next(i for i, best in enumerate(result.best_arms) if best != result.best_arms[0])
    arms, best = result.arms[start:], result.best_arms[start:]
    return sum(a == b for a, b in zip(arms, best)) / len(arms)


# ---------------------------------------------------------------------------------------------------- exact cases
@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.parametrize("target", [1, 5, 6, 7, 100, 101])
def test_perfect_drafter_needs_ceil_b_over_n_plus_1_rounds(n, target):
    result = simulate("fixed", Scenario.stationary([1.0], draft_length=n), target_tokens=target, reward="be")
    assert result.rounds == math.ceil(target / (n + 1))
    assert set(result.tokens) == {n + 1} and set(result.rewards) == {1.0}


def test_useless_drafter_produces_one_token_a_round():
    result = simulate("fixed", Scenario.stationary([0.0], draft_length=3), target_tokens=50, reward="bd")
    assert result.rounds == 50 and set(result.tokens) == {1} and set(result.rewards) == {0.0}


@pytest.mark.parametrize("concentration", [None, 20.0])
def test_mean_tokens_per_round_is_one_plus_sum_of_alpha_powers(concentration):
    scenario = Scenario.stationary([0.6], draft_length=4, concentration=concentration)
    expected = 1 + 0.6 + 0.6**2 + 0.6**3 + 0.6**4  # 2.3056
    assert scenario.expected_tokens(0) == pytest.approx(expected)
    result = simulate("fixed", scenario, target_tokens=15000, seed=3)
    assert np.mean(result.tokens) == pytest.approx(expected, abs=0.05)
    bd = np.mean(result.rewards)
    assert bd == pytest.approx(0.6, abs=0.01 if concentration else 1e-12)


def test_cost_reward_and_wall_time_by_hand():
    scenario = Scenario.stationary([1.0, 1.0], draft_length=4, costs=[0.1, 0.0])
    result = simulate("fixed", scenario, reward="cost", target_tokens=50)  # drafter 0: N c + 1 = 1.4
    assert result.rounds == 10 and result.wall_time == pytest.approx(14.0)
    assert result.rewards[0] == pytest.approx(5 / (1.4 * 5))  # tokens / time / (N + 1)
    free = simulate("fixed", scenario, reward="cost", target_tokens=50, policy_kwargs={"arm": 1})
    assert free.rewards[0] == 1.0 and free.wall_time == 10.0


def test_common_random_numbers_give_each_drafter_the_same_rounds_under_any_policy():
    alone = simulate("fixed", THREE, target_tokens=300, seed=4)
    mixed = simulate("round_robin", THREE, target_tokens=900, seed=4)
    arm0_tokens = [t for a, t in zip(mixed.arms, mixed.tokens) if a == 0]
    n = min(len(arm0_tokens), alone.rounds)
    assert n > 50 and arm0_tokens[:n] == alone.tokens[:n]


def test_oracle_has_zero_regret_and_switches_with_the_segment():
    assert stopping_time_regret("fixed", THREE, "bd", 2000, range(3), policy_kwargs={"arm": 0}) == 0.0
    assert stopping_time_regret("fixed", THREE, "bd", 2000, range(3), policy_kwargs={"arm": 2}) > 0
    oracle = simulate_oracle(SWITCH, target_tokens=8000, seed=0)
    produced = np.cumsum([0] + oracle.tokens[:-1])
    assert oracle.arms == [0 if p < 4000 else 1 for p in produced]


def test_full_information_policies_get_every_drafters_reward_each_round():
    calls = []

    @register_policy(name="spy_full_info_test")
    class Spy(Policy):
        full_information = True

        def select(self):
            return 0

        def update_all(self, rewards):
            calls.append(dict(rewards))

    try:
        result = simulate("spy_full_info_test", NOISY, target_tokens=200)
        assert len(calls) == result.rounds
        assert all(sorted(c) == [0, 1, 2] for c in calls)
        assert [c[0] for c in calls] == result.rewards  # the drafter that drafted: its own reward
        assert np.mean([c[1] for c in calls]) == pytest.approx(0.5, abs=0.05)  # counterfactual BD ~ alpha
        calls.clear()
        simulate("spy_full_info_test", NOISY, target_tokens=200, full_information=False)
        assert calls == []
    finally:
        del POLICY_REGISTRY["spy_full_info_test"]


# ---------------------------------------------------------------------------------------------------- properties
def test_ucb_bd_regret_grows_sublinearly():
    """Linear regret (random) grows ~8x from B=500 to B=4000. UCB-BD (beta=1) grows 2.7x there, still in the
    pre-asymptotic regime, then < 2x for the next factor 8 (log-like)."""
    seeds = range(10)
    r500, r4000, r32000 = (stopping_time_regret("ucb", THREE, "bd", b, seeds) for b in (500, 4000, 32000))
    assert 0 < r500 < r4000 < 4 * r500
    assert r32000 < 2 * r4000
    rand500, rand4000 = (stopping_time_regret("random", THREE, "bd", b, seeds) for b in (500, 4000))
    assert rand4000 > 6 * rand500


def test_bd_reward_has_lower_variance_than_be_on_the_same_drafters():
    bd = simulate("round_robin", NOISY, reward="bd", target_tokens=3000, seed=1).reward_variance()
    be = simulate("round_robin", NOISY, reward="be", target_tokens=3000, seed=1).reward_variance()
    assert sorted(bd) == sorted(be) == [0, 1, 2]
    assert all(bd[arm] < 0.25 * be[arm] for arm in bd)  # about 0.1x here: 0.21 / 105 vs ~0.02 for alpha = 0.3


def test_ucb_bd_settles_on_the_clearly_best_drafter():
    for seed in range(3):
        result = simulate("ucb", NOISY, reward="bd", target_tokens=4000, seed=seed)
        assert result.best_arm_ratio(start=0.5) >= 0.9


def test_hedge_with_full_information_beats_bandit_ucb():
    hedge = stopping_time_regret("hedge", NOISY, "bd", 2000, range(5))
    ucb = stopping_time_regret("ucb", NOISY, "bd", 2000, range(5))
    bandit_hedge = stopping_time_regret("hedge", NOISY, "bd", 2000, range(5), full_information=False)
    assert hedge < ucb
    assert math.isfinite(bandit_hedge)


def test_discounted_and_sliding_ucb_adapt_to_a_switch_better_than_ucb():
    def ratio(name, **kwargs):
        runs = [simulate(name, SWITCH, target_tokens=8000, seed=s, policy_kwargs=kwargs) for s in range(3)]
        return np.mean([after_switch_ratio(r) for r in runs])

    plain = max(ratio("ucb", beta=0.25), ratio("ucb"))  # same beta as their defaults, and UCB's own default
    assert ratio("discounted_ucb") > plain + 0.05
    assert ratio("sliding_window_ucb") > plain + 0.05


def test_cost_aware_reward_saves_wall_time_when_drafters_differ_in_cost():
    # drafter 0 accepts more but costs 0.3 per token: 4.15 tokens / 2.5 = 1.66 per unit time; drafter 1: 2.94 / 1.1
    scenario = Scenario.stationary([0.85, 0.7], draft_length=5, costs=[0.3, 0.02], concentration=20)
    assert scenario.best_arm(measure="rounds") == 0 and scenario.best_arm(measure="wall_time") == 1
    bd = regret_samples("ucb", scenario, "bd", 2000, range(3), measure="wall_time")
    cost = regret_samples("ucb", scenario, "cost", 2000, range(3), measure="wall_time")
    assert np.mean(cost) < 0.5 * np.mean(bd)
    cheap = [
        simulate("ucb", scenario, reward=r, target_tokens=2000).best_arm_ratio(0.5, measure="wall_time")
        for r in ("cost", "bd")
    ]
    assert cheap[0] >= 0.8 and cheap[1] <= 0.2  # cost-aware UCB mostly drafts with the cheap drafter, BD-UCB does not


# ---------------------------------------------------------------------------------------------------- replay
def test_replay_a_trace_through_json(tmp_path):
    trace = simulate_trace(NOISY, 300, seed=2)
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))  # int keys become strings, as in a recorded file
    loaded = load_trace(path)
    assert loaded == trace
    fixed = replay("fixed", loaded, policy_kwargs={"arm": 1})
    assert fixed.rounds == 300 and fixed.tokens == [r["arm_accepted"][1] + 1 for r in trace]
    assert fixed.rewards == [r["arm_rewards"][1] for r in trace]
    assert set(fixed.best_arms) == {0} and fixed.best_arm_ratio() == 0.0
    hedge = replay("hedge", json.loads(path.read_text()))
    assert hedge.best_arm_ratio(0.5) >= 0.9 and hedge.total_tokens > fixed.total_tokens


def test_replay_refuses_a_trace_without_every_drafter():
    trace = [{"arm_rewards": {0: 0.5, 1: 0.4}, "arm_accepted": {0: 2, 1: 1}}, {"arm_rewards": {0: 0.5}}]
    with pytest.raises(ValueError, match=r"`trace\[1\]` must be a dict with 'arm_rewards' and 'arm_accepted'"):
        replay("ucb", trace)
    trace[1]["arm_accepted"] = {0: 2, 1: 0}
    with pytest.raises(
        ValueError, match=r"`trace\[1\]\['arm_rewards'\]` must have an entry for every drafter .* lacks"
    ):
        replay("ucb", trace)
    with pytest.raises(ValueError, match=r"`trace` must be a non-empty list of per-round dicts"):
        replay("ucb", [])


# ---------------------------------------------------------------------------------------------------- validation
def test_scenario_validation():
    with pytest.raises(ValueError, match=r"`alphas\[0\]` must be acceptance rates in \[0, 1\], but holds 1\.2"):
        Scenario.stationary([0.5, 1.2])
    with pytest.raises(ValueError, match=r"`alphas\[1\]` must have one rate per drafter \(2\), but has 3"):
        Scenario.switching([0.5, 0.4], [0.1, 0.2, 0.3], switch_at=10)
    with pytest.raises(ValueError, match=r"`switch_at` must be 1 increasing positive token counts"):
        Scenario(alphas=((0.5,), (0.4,)), switch_at=())
    with pytest.raises(ValueError, match=r"`draft_length` must be an int >= 1, but is 0"):
        Scenario.stationary([0.5], draft_length=0)
    with pytest.raises(ValueError, match=r"`costs` must be 2 finite costs >= 0"):
        Scenario.stationary([0.5, 0.4], costs=[0.1])
    with pytest.raises(ValueError, match=r"`concentration` must be a finite float > 0 or None, but is 0"):
        Scenario.stationary([0.5], concentration=0)


def test_simulate_validation():
    with pytest.raises(ValueError, match=r"`reward` must be one of \['bd', 'be', 'cost'\], but is 'tv'"):
        simulate("ucb", THREE, reward="tv")
    with pytest.raises(ValueError, match=r"`target_tokens` must be an int >= 1, but is 0"):
        simulate("ucb", THREE, target_tokens=0)
    with pytest.raises(ValueError, match=r"`measure` must be one of \['rounds', 'wall_time'\]"):
        stopping_time_regret("ucb", THREE, measure="time")
    with pytest.raises(ValueError, match=r"`arm` must be < the number of drafters \(3\), but is 5"):
        simulate("fixed", THREE, policy_kwargs={"arm": 5})


def test_ucb_bd_regret_at_4000_is_under_twice_regret_at_500_with_a_tuned_beta():
    """The issue's property verbatim, on a fixed scenario and seed set: regret(B=4000) < 2 x regret(B=500).

    It holds for UCB-BD with beta=0.25 (measured 1.85x); with the paper's beta=1 this scenario is still in its
    exploration phase at B=4000 (2.7x), see `test_ucb_bd_regret_grows_sublinearly`.
    """
    seeds = range(10)
    kwargs = {"policy_kwargs": {"beta": 0.25}}
    r500, r4000 = (stopping_time_regret("ucb", THREE, "bd", b, seeds, **kwargs) for b in (500, 4000))
    assert 0 < r500 < r4000 < 2 * r500
