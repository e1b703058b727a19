"""Priors as pseudo-observations (`Policy.set_prior`): hand-computed values, lifetime rules, validation, and the rule
for policies that cannot use one."""

from __future__ import annotations

import json
import math

import pytest

from hf_metasd.policies import (
    POLICY_REGISTRY,
    UCB,
    UCBV,
    DiscountedUCB,
    EpsilonGreedy,
    Policy,
    ScaledUCB,
    SlidingWindowUCB,
    SuccessiveHalving,
    ThompsonSampling,
    get_policy,
)

SUPPORTED = {
    "discounted_ucb",
    "epsilon_greedy",
    "sliding_window_ucb",
    "successive_halving",
    "thompson",
    "ucb",
    "ucb_scaled",
    "ucb_v",
}
UNSUPPORTED = {"exp3", "fixed", "hedge", "random", "round_robin"}


def feed(policy, history):
    for arm, reward in history:
        policy.update(arm, reward)


def flat(values):
    """`posterior()` gives (alpha, beta) pairs; pytest.approx wants a flat list."""
    return [x for v in values for x in (v if isinstance(v, tuple) else (v,))]


def ready(policy, num_arms, means=None, weight=2.0):
    policy.reset(num_arms)
    if means is not None:
        policy.set_prior(means, weight=weight)
    return policy


# ---------------------------------------------------------------------------------------------------- the rule
def test_which_builtins_accept_a_prior():
    builtins = SUPPORTED | UNSUPPORTED
    assert builtins <= set(POLICY_REGISTRY)
    assert {name for name in builtins if POLICY_REGISTRY[name].supports_prior} == SUPPORTED


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_policies_without_means_refuse_a_prior(name):
    policy = get_policy(name)
    policy.reset(2)
    with pytest.raises(
        TypeError,
        match=rf"`set_prior` needs a policy that estimates a mean reward per drafter, but '{name}' \(\w+\) does not\. "
        r"Use one of \['discounted_ucb', 'epsilon_greedy', .*'ucb_v'\], or do not set a prior\.",
    ):
        policy.set_prior([0.5, 0.5])
    assert policy.prior_means is None
    policy.clear_prior()  # harmless


def test_a_custom_policy_opts_in():
    class Plain(Policy):
        def select(self):
            return 0

    with pytest.raises(TypeError, match=r"`set_prior` needs a policy that estimates a mean reward"):
        Plain().set_prior([0.5])

    class WithMeans(Plain):
        supports_prior = True

    policy = WithMeans()
    policy.set_prior([0.5], weight=1.0)
    policy.reset(1)
    assert policy.means() == [0.5]


# ---------------------------------------------------------------------------------------------------- bookkeeping
def test_pseudo_observations_stay_out_of_counts_and_sums():
    policy = ready(UCB(), 3, [0.8, None, 0.2], weight=2.0)
    assert policy.counts == [0, 0, 0] and policy.sums == [0.0, 0.0, 0.0] and policy.t == 0
    assert policy.prior_counts == [2.0, 0.0, 2.0] and policy.prior_sums == pytest.approx([1.6, 0.0, 0.4])
    assert policy.means() == pytest.approx([0.8, 0.0, 0.2])
    policy.update(0, 0.5)
    assert policy.counts == [1, 0, 0] and policy.sums == [0.5, 0.0, 0.0] and policy.t == 1
    assert policy.effective_counts() == [3.0, 0.0, 2.0]
    assert policy.means() == pytest.approx([(1.6 + 0.5) / 3, 0.0, 0.2])


def test_an_arm_with_a_prior_is_not_untried():
    policy = ready(UCB(), 3, [0.8, None, 0.2])
    assert policy.select() == 1  # the only arm with neither pulls nor prior
    assert policy.fallback({1}) == 0  # no untried arm left: best index among 0 and 2
    assert ready(UCB(), 3).select() == 0  # without a prior: pool order


def test_ucb_prior_by_hand():
    policy = ready(UCB(beta=1.0), 2, [0.8, None], weight=2.0)
    assert policy.select() == 1
    policy.update(1, 0.5)
    # t = 1 observed + 2 pseudo = 3; n = (2, 1): 0.8 + sqrt(2 ln 3 / 2) and 0.5 + sqrt(2 ln 3 / 1)
    log3 = math.log(3)
    assert policy.scores() == pytest.approx([0.8 + math.sqrt(log3), 0.5 + math.sqrt(2 * log3)])
    assert policy.scores() == pytest.approx([1.848147, 1.982304], abs=1e-6)
    assert policy.select() == 1


@pytest.mark.parametrize(
    "make",
    [
        lambda: UCB(beta=0.7),
        lambda: UCBV(c=0.5),
        lambda: ScaledUCB(beta=0.7),
        lambda: DiscountedUCB(gamma=1.0, beta=0.7),
        lambda: SlidingWindowUCB(window=1000, beta=0.7),
        lambda: EpsilonGreedy(epsilon=0.0),
        lambda: ThompsonSampling(prior_alpha=2.0, prior_beta=0.5),
    ],
    ids=["ucb", "ucb_v", "ucb_scaled", "discounted_ucb", "sliding_window_ucb", "epsilon_greedy", "thompson"],
)
def test_a_prior_is_exactly_weight_observations_at_its_mean(make):
    """A prior worth 3 observations at 0.5 on drafter 0 and 3 at 0.75 on drafter 2 reads like those 6 rounds."""
    history = [(0, 0.9), (1, 0.3), (2, 0.6), (1, 0.4), (0, 0.2)]
    with_prior = make()
    with_prior.reset(3)
    with_prior.set_prior([0.5, None, 0.75], weight=3.0)
    feed(with_prior, history)
    observed = make()
    observed.reset(3)
    feed(observed, [(0, 0.5)] * 3 + [(2, 0.75)] * 3 + history)
    assert with_prior.means() == pytest.approx(observed.means())
    for view in ("scores", "variances", "posterior"):
        if hasattr(observed, view):
            assert flat(getattr(with_prior, view)()) == pytest.approx(flat(getattr(observed, view)()))


def test_discounted_ucb_prior_fades_like_an_old_observation():
    policy = ready(DiscountedUCB(gamma=0.5, beta=1.0), 2, [1.0, None], weight=2.0)
    feed(policy, [(1, 0.0), (1, 0.5)])
    # after t = 2 rounds the prior weighs 2 * 0.5^2 = 0.5 (sum 0.5); drafter 1: N = 0.5 + 1 = 1.5, S = 0.5; n = 2
    assert policy.discounted_counts == [0.0, 1.5]  # the observed statistics only
    log2 = math.log(2.0)
    assert policy.scores() == pytest.approx([1.0 + math.sqrt(2 * log2 / 0.5), 0.5 / 1.5 + math.sqrt(2 * log2 / 1.5)])


def test_sliding_window_prior_leaves_with_the_round_that_fills_the_window():
    policy = ready(SlidingWindowUCB(window=3, beta=1.0), 2, [0.9, None], weight=1.0)
    feed(policy, [(1, 0.2), (1, 0.4)])
    # t = 2 < W: the prior is in the window; N(W) = (1, 2), S(W) = (0.9, 0.6), horizon min(2, 3) + 1 = 3
    log3 = math.log(3)
    assert policy.scores() == pytest.approx([0.9 + math.sqrt(2 * log3), 0.3 + math.sqrt(log3)])
    policy.update(1, 0.6)  # t = 3 = W: the prior is gone, drafter 0 is absent from the window
    assert policy.scores()[0] == math.inf and policy.select() == 0


def test_thompson_prior_is_beta_pseudo_counts():
    policy = ready(ThompsonSampling(prior_alpha=1.0, prior_beta=1.0), 2, [0.75, None], weight=4.0)
    assert policy.posterior() == [(4.0, 2.0), (1.0, 1.0)]  # (1 + 4 * 0.75, 1 + 4 * 0.25)
    policy.update(0, 0.5)
    assert policy.posterior() == [(4.5, 2.5), (1.0, 1.0)]
    with pytest.raises(ValueError, match=r"`means\[1\]` must be None or a float in \[0, 1\], but is 1\.5\."):
        policy.set_prior([0.5, 1.5])


def test_epsilon_greedy_prior_changes_the_greedy_choice():
    policy = ready(EpsilonGreedy(epsilon=0.0), 2, [None, 0.9], weight=2.0)
    feed(policy, [(0, 0.6), (1, 0.3)])  # drafter 1: (1.8 + 0.3) / 3 = 0.7 > 0.6
    assert policy.means() == pytest.approx([0.6, 0.7]) and policy.select() == 1
    policy.clear_prior()
    assert policy.means() == [0.6, 0.3] and policy.select() == 0


def test_successive_halving_ranks_with_the_prior():
    def survivors(prior):
        policy = ready(SuccessiveHalving(budget=1), 2, prior, weight=2.0)
        picks = [policy.select()]
        policy.update(picks[-1], 0.6)
        picks.append(policy.select())
        policy.update(picks[-1], 0.5)
        assert picks == [0, 1]  # the schedule is unchanged
        return policy.survivors

    assert survivors(None) == [0]
    assert survivors([None, 0.9]) == [1]  # (1.8 + 0.5) / 3 = 0.767 > 0.6


# ---------------------------------------------------------------------------------------------------- lifetime
def test_reset_and_bind_keep_the_prior_and_clear_prior_removes_it():
    policy = ready(UCB(), 2, [0.8, None])
    feed(policy, [(1, 0.5)])
    policy.reset(2)
    assert policy.prior_means == [0.8, None] and policy.counts == [0, 0]
    assert policy.select() == 1
    policy.bind(2)  # same pool size: nothing changes
    assert policy.prior_means == [0.8, None]
    policy.clear_prior()
    assert policy.prior_means is None and policy.prior_weight is None and policy.prior_counts == [0.0, 0.0]
    assert policy.select() == 0


def test_a_prior_set_before_reset_fixes_the_pool_size():
    policy = UCB()
    policy.set_prior([0.8, None, 0.4], weight=1.0)
    assert policy.prior_counts == [1.0, 0.0, 1.0]
    with pytest.raises(
        ValueError,
        match=r"`num_arms` must match the prior set with `set_prior` \(3 drafters\), but is 2\. Call `clear_prior\(\)`",
    ):
        policy.bind(2)
    assert policy.num_arms is None  # not left half-ready
    policy.bind(3)  # a fresh policy binds with its prior
    assert policy.prior_means == [0.8, None, 0.4] and policy.select() == 1
    policy.clear_prior()
    policy.reset(2)  # the fix
    assert policy.num_arms == 2


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_reset_replays_identically_with_the_prior(name):
    policy = get_policy(name, seed=3)
    policy.set_prior([0.7, None, 0.2], weight=2.0)
    policy.reset(3)

    def play():
        picks = []
        for step in range(30):
            arm = policy.select()
            picks.append(arm)
            policy.update(arm, ((arm * 7 + step * 3) % 11) / 10)
        return picks

    first = play()
    policy.reset(3)
    assert play() == first


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_state_dict_carries_the_prior(name):
    policy = get_policy(name, seed=1)
    policy.reset(2)
    policy.set_prior([None, 0.25], weight=1.5)
    feed(policy, [(0, 0.5), (1, 1.0)])
    state = json.loads(json.dumps(policy.state_dict()))
    assert state["prior"] == {"means": [None, 0.25], "weight": 1.5}
    restored = get_policy(name, **state["config"])
    restored.load_state_dict(state)
    assert restored.prior_means == [None, 0.25] and restored.prior_weight == 1.5
    assert restored.state_dict() == state
    assert restored.means() == policy.means()
    old = dict(state, prior=None)
    del old["prior"]  # a state saved before priors existed: no prior
    restored.load_state_dict(old)
    assert restored.prior_means is None


# ---------------------------------------------------------------------------------------------------- validation
def test_set_prior_validation():
    policy = ready(UCB(), 2)
    with pytest.raises(
        TypeError, match=r"`means` must be a list with one prior mean \(or None\) per drafter, but is str"
    ):
        policy.set_prior("0.5, 0.5")
    with pytest.raises(TypeError, match=r"`means` must be a list .* but is dict"):
        policy.set_prior({0: 0.5})
    with pytest.raises(ValueError, match=r"`means` must have one entry per drafter \(2\), but has 3\. Give a mean"):
        policy.set_prior([0.5, 0.5, 0.5])
    with pytest.raises(
        ValueError, match=r"`means\[0\]` must be None or a float in \[0, 1\], but is -0\.1\. Give drafter"
    ):
        policy.set_prior([-0.1, None])
    with pytest.raises(ValueError, match=r"`means\[1\]` must be None or a float in \[0, 1\], but is nan\."):
        policy.set_prior([0.5, float("nan")])
    with pytest.raises(ValueError, match=r"`means\[1\]` must be None or a float in \[0, 1\], but is True\."):
        policy.set_prior([0.5, True])
    with pytest.raises(ValueError, match=r"`weight` must be a float in \(0, inf\), but is 0\. Use 2\.0"):
        policy.set_prior([0.5, None], weight=0)
    with pytest.raises(ValueError, match=r"`means` must have one entry per drafter, but is empty\."):
        UCB().set_prior([])
    assert policy.prior_means is None  # nothing half-set
    policy.set_prior((0.5, None))  # any sequence; the fix
    assert policy.prior_means == [0.5, None] and policy.prior_weight == 2.0


def test_policies_without_a_reward_range_take_any_finite_prior():
    policy = ready(EpsilonGreedy(epsilon=0.0), 2, [5.0, None])
    assert policy.means() == [5.0, 0.0]
    with pytest.raises(ValueError, match=r"`means\[0\]` must be None or a finite float, but is inf\."):
        policy.set_prior([math.inf, None])
