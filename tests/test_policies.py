"""Policies on tiny hand-written histories with exact expected values (mabwiser's habit), plus contract tests over
the whole registry. Pure Python: no torch."""

from __future__ import annotations

import json
import math
import random

import pytest

from hf_metasd.errors import UnknownPolicyError
from hf_metasd.policies import (
    EXP3,
    POLICY_REGISTRY,
    UCB,
    DiscountedUCB,
    EpsilonGreedy,
    FixedPolicy,
    Hedge,
    Policy,
    RandomPolicy,
    RoundRobin,
    SlidingWindowUCB,
    SuccessiveHalving,
    ThompsonSampling,
    get_policy,
    register_policy,
)

BUILTINS = [
    "discounted_ucb",
    "epsilon_greedy",
    "exp3",
    "fixed",
    "hedge",
    "precedence",
    "random",
    "round_robin",
    "sliding_window_ucb",
    "successive_halving",
    "thompson",
    "throughput",
    "ucb",
    "ucb_scaled",
    "ucb_v",
]
NON_LEARNING = {"fixed", "precedence", "random", "round_robin"}


def feed(policy: Policy, history: list[tuple[int, float]]) -> None:
    for arm, reward in history:
        policy.update(arm, reward)


def play(policy: Policy, reward_of, rounds: int) -> list[int]:
    """Select/update `rounds` times with deterministic rewards `reward_of(arm, step)`; full information when the
    policy wants it."""
    picks = []
    for step in range(rounds):
        arm = policy.select()
        picks.append(arm)
        policy.update(arm, reward_of(arm, step))
        if policy.full_information:
            policy.update_all({a: reward_of(a, step) for a in range(policy.num_arms)})
    return picks


def toy_reward(arm: int, step: int) -> float:
    return ((arm * 7 + step * 3) % 11) / 10.0


# ---------------------------------------------------------------------------------------------------- registry
def test_every_builtin_is_registered():
    assert set(BUILTINS) <= set(POLICY_REGISTRY)
    for name in BUILTINS:
        assert POLICY_REGISTRY[name].name == name


def test_unknown_name_lists_registered_names():
    with pytest.raises(UnknownPolicyError, match=r"must be one of \[.*'exp3'.*'ucb'.*\], but is 'ucbb'"):
        get_policy("ucbb")
    with pytest.raises(ValueError):  # UnknownPolicyError is also a ValueError
        get_policy("ucbb")


def test_instance_passes_through_and_refuses_kwargs():
    policy = UCB(beta=0.3)
    assert get_policy(policy) is policy
    with pytest.raises(ValueError, match=r"`meta_policy_kwargs` must be empty when `meta_policy` is an instance"):
        get_policy(policy, beta=1.0)
    with pytest.raises(TypeError, match=r"`meta_policy` must be a registered name or a `Policy` instance, but is int"):
        get_policy(3)


def test_duplicate_registration_is_refused():
    class OtherUCB(UCB):
        pass

    with pytest.raises(ValueError, match=r"`name` must be unused, but 'ucb' is already registered to UCB"):
        register_policy(OtherUCB, name="ucb")
    assert POLICY_REGISTRY["ucb"] is UCB
    register_policy(UCB)  # re-registering the same class is a no-op


def test_register_refuses_non_policy():
    with pytest.raises(TypeError, match=r"`cls` must be a subclass of `Policy`"):
        register_policy(dict, name="dict")


def test_a_registered_custom_policy_is_served_by_name():
    @register_policy(name="always_zero_test")
    class AlwaysZero(Policy):
        def select(self):
            return 0

    try:
        policy = get_policy("always_zero_test", seed=1)
        assert isinstance(policy, AlwaysZero) and policy.name == "always_zero_test"
    finally:
        del POLICY_REGISTRY["always_zero_test"]


# ---------------------------------------------------------------------------------------------------- contract
@pytest.mark.parametrize("name", sorted(POLICY_REGISTRY))
def test_contract_valid_arms_and_reset_reseeds(name):
    policy = get_policy(name, seed=5)
    with pytest.raises(RuntimeError, match=r"has no arms yet\. Call `reset\(num_arms\)` first"):
        policy.select()
    policy.reset(3)
    first = play(policy, toy_reward, 40)
    assert all(0 <= a < 3 for a in first)
    assert sum(policy.counts) == policy.t == 40
    policy.reset(3)
    assert play(policy, toy_reward, 40) == first  # reset forgets and re-seeds
    assert get_policy(name, **policy.config()).config() == policy.config()


@pytest.mark.parametrize("name", sorted(POLICY_REGISTRY))
def test_state_dict_round_trip_continues_identically(name):
    policy = get_policy(name, seed=11)
    policy.reset(3)
    play(policy, toy_reward, 23)
    state = json.loads(json.dumps(policy.state_dict()))  # JSON-serialisable
    restored = get_policy(name, **state["config"])
    restored.load_state_dict(state)
    assert restored.state_dict() == state

    def shifted(arm, step):
        return toy_reward(arm, step + 5)

    assert play(restored, shifted, 30) == play(policy, shifted, 30)
    assert restored.state_dict() == policy.state_dict()


def test_load_state_dict_refuses_another_policy():
    state = UCB().state_dict()
    with pytest.raises(ValueError, match=r"`state\['name'\]` must be 'exp3', but is 'ucb'\. Load it into"):
        EXP3().load_state_dict(state)


@pytest.mark.parametrize("name", sorted(set(BUILTINS) - NON_LEARNING))
def test_learning_policy_finds_the_better_arm(name):
    """Bernoulli rewards p=0.8 vs 0.3: the better arm in >= 80% of 500 pulls (full information for Hedge)."""
    policy = get_policy(name, seed=0)
    policy.reset(2)
    env = random.Random(1234)
    good = 0
    for _ in range(500):
        arm = policy.select()
        rewards = [float(env.random() < 0.8), float(env.random() < 0.3)]
        policy.update(arm, rewards[arm])
        if policy.full_information:
            policy.update_all(dict(enumerate(rewards)))
        good += arm == 0
    assert good / 500 >= 0.8


# ---------------------------------------------------------------------------------------------------- ucb
def test_ucb_indices_by_hand():
    policy = UCB(beta=1.0)
    policy.reset(2)
    feed(policy, [(0, 1.0), (1, 0.0), (0, 0.5)])  # n = (2, 1), means = (0.75, 0), t = 3
    # 0.75 + sqrt(2 ln 3 / 2) and 0 + sqrt(2 ln 3 / 1)
    assert policy.scores() == pytest.approx([0.75 + math.sqrt(math.log(3)), math.sqrt(2 * math.log(3))])
    assert policy.scores() == pytest.approx([1.798147, 1.482304], abs=1e-6)
    assert policy.select() == 0


def test_ucb_bonus_is_per_arm_not_per_total():
    """The counter-example of STYLE.md: the bonus must shrink with the arm's own pulls."""
    policy = UCB(beta=1.0)
    policy.reset(2)
    feed(policy, [(0, 0.6)] * 9 + [(1, 0.5)])  # arm 1 lower mean but far fewer pulls
    assert policy.select() == 1


# ---------------------------------------------------------------------------------------------------- exp3
def test_exp3_probabilities_after_two_updates():
    policy = EXP3(gamma=0.5, seed=0)
    policy.reset(2)
    assert policy.probabilities() == [0.5, 0.5]
    policy.update(0, 1.0)  # p_0 = 0.5: ln w_0 = 0.5 * (1 / 0.5) / 2 = 0.5
    assert policy.log_weights == [0.5, 0.0]
    p1 = 0.5 / (math.exp(0.5) + 1) + 0.25  # 0.438770
    assert policy.probabilities()[1] == pytest.approx(p1)
    policy.update(1, 0.5)  # ln w_1 = 0.5 * (0.5 / p_1) / 2 = 0.284887
    assert policy.log_weights == pytest.approx([0.5, 0.25 * 0.5 / p1])
    assert policy.probabilities() == pytest.approx([0.526786, 0.473214], abs=1e-6)


def test_exp3_is_stable_for_huge_weights():
    policy = EXP3(gamma=1e-3)
    policy.reset(2)
    policy.log_weights = [5000.0, 0.0]  # exp(5000) overflows a float; the log-space softmax does not
    assert policy.probabilities() == pytest.approx([1 - 1e-3 / 2, 1e-3 / 2])


def test_exp3_gamma_one_is_uniform_and_sampling_matches_probabilities():
    policy = EXP3(gamma=0.2, seed=3)
    policy.reset(3)
    policy.log_weights = [math.log(6.0), 0.0, 0.0]  # w = (6, 1, 1): p = 0.8 * (6, 1, 1) / 8 + 0.2 / 3
    expected = [0.8 * 6 / 8 + 0.2 / 3, 0.8 / 8 + 0.2 / 3, 0.8 / 8 + 0.2 / 3]
    assert policy.probabilities() == pytest.approx(expected)
    picks = [policy.select() for _ in range(4000)]
    assert picks.count(0) / 4000 == pytest.approx(expected[0], abs=0.03)
    uniform = EXP3(gamma=1.0)
    uniform.reset(4)
    uniform.update(2, 1.0)
    assert uniform.probabilities() == [0.25] * 4


@pytest.mark.parametrize("gamma", [0, 1.5, -0.1, float("nan"), "0.1", True])
def test_exp3_gamma_validation(gamma):
    with pytest.raises(ValueError, match=r"`gamma` must be a float in \(0, 1\], but is .*\. Use 0\.1"):
        EXP3(gamma=gamma)


@pytest.mark.parametrize("cls", [EXP3, ThompsonSampling])
def test_unit_rewards_are_enforced(cls):
    policy = cls()
    policy.reset(2)
    with pytest.raises(ValueError, match=r"`reward` must be in \[0, 1\] for the '\w+' policy, but is 1\.5\. Use a"):
        policy.update(0, 1.5)
    assert policy.counts == [0, 0]  # nothing recorded
    policy.update(0, 1.0 + 1e-9)  # round-off is clipped, not refused
    assert policy.sums == [1.0, 0.0]


# ---------------------------------------------------------------------------------------------------- successive halving
def test_successive_halving_elimination_order():
    policy = SuccessiveHalving(budget=1)
    policy.reset(4)
    means = [0.3, 0.9, 0.6, 0.1]
    picks = play(policy, lambda arm, _: means[arm], 12)
    # phase 0: one round each; keep the best half {1, 2}; phase 1: two rounds each; keep {1}; commit
    assert picks == [0, 1, 2, 3, 1, 1, 2, 2, 1, 1, 1, 1]
    assert policy.survivors == [1] and policy.committed and policy.phase == 2


def test_successive_halving_odd_pool_keeps_the_ceiling_half_and_doubles_the_budget():
    policy = SuccessiveHalving(budget=2)
    policy.reset(5)
    means = [0.5, 0.4, 0.8, 0.7, 0.1]
    picks = play(policy, lambda arm, _: means[arm], 10)  # 2 rounds each
    assert picks == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert policy.survivors == [0, 2, 3] and policy.rounds_per_arm() == 4  # ceil(5 / 2) = 3 kept
    picks = play(policy, lambda arm, _: means[arm], 12)
    assert picks == [0] * 4 + [2] * 4 + [3] * 4
    assert policy.survivors == [2, 3] and policy.rounds_per_arm() == 8
    picks = play(policy, lambda arm, _: means[arm], 17)
    assert picks == [2] * 8 + [3] * 8 + [2]
    assert policy.survivors == [2]


def test_successive_halving_ties_keep_the_lower_index_and_off_schedule_updates_do_not_advance():
    policy = SuccessiveHalving(budget=1)
    policy.reset(2)
    policy.update(1, 1.0)  # not the scheduled drafter (0): recorded, schedule unchanged
    assert policy.select() == 0 and policy.counts == [0, 1]
    policy.update(0, 0.5)
    policy.update(1, 0.0)  # means 0.5, 0.5: tie, drafter 0 survives
    assert policy.survivors == [0]


def test_successive_halving_budget_validation():
    with pytest.raises(ValueError, match=r"`budget` must be an int >= 1, but is 0\. Use 10"):
        SuccessiveHalving(budget=0)
    with pytest.raises(ValueError, match=r"`budget` must be an int >= 1, but is 2\.5\."):
        SuccessiveHalving(budget=2.5)


# ---------------------------------------------------------------------------------------------------- thompson
def test_thompson_posterior_with_fractional_rewards():
    policy = ThompsonSampling(prior_alpha=2.0, prior_beta=0.5)
    policy.reset(2)
    feed(policy, [(0, 0.25), (0, 1.0), (1, 0.0)])
    assert policy.posterior() == [(2.0 + 1.25, 0.5 + 0.75), (2.0, 1.5)]


def test_thompson_selection_frequency_matches_the_posterior():
    """Beta(2, 1) vs Beta(1, 2): P(theta_0 > theta_1) = int_0^1 2x (2x - x^2) dx = 4/3 - 1/2 = 5/6."""
    policy = ThompsonSampling(seed=0)
    policy.reset(2)
    feed(policy, [(0, 1.0), (1, 0.0)])
    picks = [policy.select() for _ in range(3000)]
    assert picks.count(0) / 3000 == pytest.approx(5 / 6, abs=0.03)


@pytest.mark.parametrize("arg", ["prior_alpha", "prior_beta"])
def test_thompson_prior_validation(arg):
    with pytest.raises(ValueError, match=rf"`{arg}` must be a float in \(0, inf\), but is 0\. Use 1\.0"):
        ThompsonSampling(**{arg: 0})


# ---------------------------------------------------------------------------------------------------- epsilon greedy
def test_epsilon_greedy_tries_each_arm_then_exploits():
    policy = EpsilonGreedy(epsilon=0.0)
    policy.reset(3)
    assert play(policy, lambda arm, _: [0.2, 0.6, 0.4][arm], 6) == [0, 1, 2, 1, 1, 1]


def test_epsilon_greedy_frequency():
    """With epsilon = 0.3 and K = 3 the greedy arm is picked with probability 0.7 + 0.3 / 3 = 0.8."""
    policy = EpsilonGreedy(epsilon=0.3, seed=1)
    policy.reset(3)
    feed(policy, [(0, 0.1), (1, 0.9), (2, 0.5)])
    picks = [policy.select() for _ in range(4000)]
    assert picks.count(1) / 4000 == pytest.approx(0.8, abs=0.03)


def test_epsilon_greedy_validation():
    with pytest.raises(ValueError, match=r"`epsilon` must be a float in \[0, 1\], but is 1\.2\. Use 0\.1\."):
        EpsilonGreedy(epsilon=1.2)


# ---------------------------------------------------------------------------------------------------- baselines
def test_random_is_uniform_and_seeded():
    a, b = RandomPolicy(seed=7), RandomPolicy(seed=7)
    a.reset(4)
    b.reset(4)
    picks = [a.select() for _ in range(4000)]
    assert picks == [b.select() for _ in range(4000)]
    assert all(picks.count(arm) / 4000 == pytest.approx(0.25, abs=0.03) for arm in range(4))


def test_round_robin_cycles_and_advances_on_select():
    policy = RoundRobin()
    policy.reset(3)
    assert [policy.select() for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    feed(policy, [(2, 1.0)] * 5)  # updates do not move the turn
    assert policy.select() == 1


def test_fixed_always_the_same_arm():
    policy = FixedPolicy(arm=2)
    policy.reset(3)
    assert play(policy, toy_reward, 5) == [2] * 5
    assert policy.config() == {"arm": 2, "seed": None}


def test_fixed_arm_outside_the_pool_fails_at_reset_and_the_fix_works():
    policy = FixedPolicy(arm=2)
    with pytest.raises(ValueError, match=r"`arm` must be < the number of drafters \(2\), but is 2\. Pick a drafter"):
        policy.reset(2)
    with pytest.raises(RuntimeError, match="Call `reset"):  # not left half-ready
        policy.select()
    policy.reset(3)  # the fix: a pool that has drafter 2
    assert policy.select() == 2
    with pytest.raises(ValueError, match=r"`arm` must be an int >= 0, but is -1\."):
        FixedPolicy(arm=-1)


# ---------------------------------------------------------------------------------------------------- non-stationary
def test_discounted_ucb_by_hand():
    policy = DiscountedUCB(gamma=0.5, beta=1.0)
    policy.reset(2)
    feed(policy, [(0, 1.0), (1, 0.0), (1, 0.5)])
    # N = (0.25, 0.5 + 1), S = (0.25, 0 + 0.5), n = 1.75
    assert policy.discounted_counts == [0.25, 1.5]
    assert policy.discounted_sums == [0.25, 0.5]
    n = 1.75
    expected = [1.0 + math.sqrt(2 * math.log(n) / 0.25), 0.5 / 1.5 + math.sqrt(2 * math.log(n) / 1.5)]
    assert policy.scores() == pytest.approx(expected)
    assert policy.select() == 0  # the forgotten drafter is tried again


def test_discounted_ucb_with_gamma_one_is_ucb():
    a, b = DiscountedUCB(gamma=1.0, beta=0.7), UCB(beta=0.7)
    a.reset(3)
    b.reset(3)
    assert play(a, toy_reward, 60) == play(b, toy_reward, 60)
    assert a.scores() == pytest.approx(b.scores())


def test_sliding_window_ucb_by_hand():
    policy = SlidingWindowUCB(window=3, beta=1.0)
    policy.reset(2)
    feed(policy, [(0, 1.0), (1, 0.2), (1, 0.4), (0, 0.6)])  # window: (1, 0.2), (1, 0.4), (0, 0.6)
    assert policy.window_counts() == [1, 2]
    assert policy.window_sums() == pytest.approx([0.6, 0.6])
    log_h = math.log(3)  # min(t = 4, W = 3)
    assert policy.scores() == pytest.approx([0.6 + math.sqrt(2 * log_h), 0.3 + math.sqrt(log_h)])
    feed(policy, [(1, 0.0)] * 3)  # drafter 0 leaves the window: its index is inf
    assert policy.window_counts() == [0, 3] and policy.select() == 0


def test_sliding_window_ucb_with_a_long_window_is_ucb():
    a, b = SlidingWindowUCB(window=1000, beta=0.7), UCB(beta=0.7)
    a.reset(3)
    b.reset(3)
    assert play(a, toy_reward, 60) == play(b, toy_reward, 60)


def test_non_stationary_validation():
    with pytest.raises(ValueError, match=r"`gamma` must be a float in \(0, 1\], but is 0\.0\. Use 0\.998"):
        DiscountedUCB(gamma=0.0)
    with pytest.raises(ValueError, match=r"`beta` must be a float in \[0, inf\), but is -1\. Use 0\.25"):
        DiscountedUCB(beta=-1)
    with pytest.raises(ValueError, match=r"`window` must be an int >= 1, but is 0\. Use 500"):
        SlidingWindowUCB(window=0)


# ---------------------------------------------------------------------------------------------------- hedge
def test_hedge_probabilities_from_counterfactual_rewards():
    policy = Hedge(eta=2.0)
    policy.reset(3)
    policy.update_all({0: 0.5, 1: 0.25, 2: 0.0})
    policy.update_all({0: 0.5, 1: 0.5, 2: 0.0})
    assert policy.cumulative_rewards() == [1.0, 0.75, 0.0]
    z = math.exp(2.0) + math.exp(1.5) + 1.0
    assert policy.probabilities() == pytest.approx([math.exp(2.0) / z, math.exp(1.5) / z, 1.0 / z])
    assert Hedge.full_information and not UCB.full_information


def test_hedge_counts_an_arm_reported_by_update_and_update_all_once():
    policy = Hedge()
    policy.reset(2)
    arm = policy.select()
    policy.update(arm, 0.8)  # the partial observation...
    policy.update_all({0: 0.8, 1: 0.3})  # ...superseded by the full report of the same round
    policy.select()
    assert policy.observed_counts == [1, 1] and policy.observed_sums == [0.8, 0.3]
    assert policy.counts == [1, 0]  # pulls are still counted by `update`


def test_hedge_partial_observations_scale_the_mean_by_the_rounds():
    policy = Hedge(eta=1.0)
    policy.reset(2)
    policy.update_all({0: 1.0, 1: 0.0})
    policy.select()
    policy.update(0, 0.5)  # bandit-only round: G_0 = 1.5, m_0 = 2; G_1 = 0, m_1 = 1; T = 2
    policy.select()
    assert policy.observed_counts == [2, 1]
    assert policy.cumulative_rewards() == [1.5, 0.0]


def test_hedge_tries_unobserved_arms_first_and_samples():
    policy = Hedge(eta=1.0, seed=0)
    policy.reset(2)
    assert policy.select() == 0
    policy.update_all({0: 1.0})
    assert policy.select() == 1  # never observed
    policy.update_all({1: 0.0})  # G = (1, 0): p_0 = 1 / (1 + e^-1) = 0.731
    picks = [policy.select() for _ in range(3000)]
    assert picks.count(0) / 3000 == pytest.approx(1 / (1 + math.exp(-1)), abs=0.03)


def test_hedge_validation():
    policy = Hedge()
    policy.reset(2)
    with pytest.raises(IndexError, match=r"`rewards` keys must be arms in \[0, 2\), but has 5\."):
        policy.update_all({5: 0.1})
    with pytest.raises(ValueError, match=r"`rewards\[0\]` must be a number, but is nan\."):
        policy.update_all({0: float("nan")})
    with pytest.raises(ValueError, match=r"`eta` must be a float in \(0, inf\), but is 0\. Use 0\.5"):
        Hedge(eta=0)


def test_bandit_policies_ignore_update_all():
    policy = UCB()
    policy.reset(2)
    policy.update_all({0: 1.0, 1: 0.0})
    assert policy.counts == [0, 0] and policy.t == 0


def test_seed_validation():
    with pytest.raises(TypeError, match=r"`seed` must be an int or None, but is 1\.5\. Pass an integer seed\."):
        EXP3(seed=1.5)


# ---------------------------------------------------------------------- fallback after an abstention
def _history(policy, rewards):
    policy.reset(num_arms=len(rewards))
    for arm, arm_rewards in enumerate(rewards):
        for r in arm_rewards:
            policy.update(arm, r)
    return policy


def test_fallback_takes_an_untried_arm_first_in_pool_order():
    policy = _history(get_policy("ucb"), [[0.9], [], [0.1], []])
    assert policy.fallback({0}) == 1
    assert policy.fallback({0, 1}) == 3


def test_ucb_fallback_is_the_best_index_among_the_rest():
    # t = 4; arm 1: 0.5 + sqrt(2 ln 4 / 1) = 2.165; arm 2: 0.7 + sqrt(2 ln 4 / 2) = 1.877 -> arm 1, not the better mean
    policy = _history(get_policy("ucb", beta=1.0), [[0.9], [0.5], [0.7, 0.7]])
    assert policy.fallback({0}) == 1
    assert _history(get_policy("ucb", beta=0.0), [[0.9], [0.5], [0.7, 0.7]]).fallback({0}) == 2


def test_fallback_of_policies_without_an_index_is_the_best_mean():
    policy = _history(get_policy("exp3"), [[0.9], [0.2, 0.4], [0.5]])
    assert policy.fallback({0}) == 2 and policy.fallback({0, 2}) == 1


def test_fallback_is_none_when_every_arm_abstained_or_the_policy_is_fixed():
    assert _history(get_policy("ucb"), [[0.9], [0.5]]).fallback({0, 1}) is None
    assert _history(get_policy("fixed", arm=1), [[0.9], [0.5]]).fallback({1}) is None


def test_fallback_does_not_change_what_was_learnt():
    policy = _history(get_policy("ucb"), [[0.9], [0.5]])
    before = policy.state_dict()
    policy.fallback({0})
    assert policy.state_dict() == before
