"""UCB-V on hand-computed histories: exact indices, the knobs, and its edge over UCB on dense low-variance rewards."""

from __future__ import annotations

import json
import math

import pytest

from hf_metasd.policies import POLICY_REGISTRY, UCB, UCBV, UCBVSettings, get_policy


def feed(policy, history):
    for arm, reward in history:
        policy.update(arm, reward)


def fresh(history, num_arms=2, **settings):
    policy = UCBV(**settings)
    policy.reset(num_arms)
    feed(policy, history)
    return policy


def test_registered_with_its_settings():
    assert POLICY_REGISTRY["ucb_v"] is UCBV
    policy = get_policy("ucb_v", zeta=1.2, c=0.5, b=2)
    assert policy.config() == {"zeta": 1.2, "c": 0.5, "b": 2.0, "seed": None}
    assert policy.settings == UCBVSettings(zeta=1.2, c=0.5, b=2.0)
    assert UCBV().config() == {"zeta": 1.0, "c": 1.0, "b": 1.0, "seed": None}


def test_each_arm_once_in_pool_order_then_the_index():
    policy = UCBV()
    policy.reset(3)
    picks = []
    for _ in range(3):
        arm = policy.select()
        picks.append(arm)
        policy.update(arm, 0.5)
    assert picks == [0, 1, 2]
    assert policy.scores() == pytest.approx([0.5 + 3 * math.log(3)] * 3)  # variance 0, n = 1, t = 3
    assert policy.select() == 0  # tie: lowest index


def test_indices_of_a_tiny_history_by_hand():
    policy = fresh([(0, 1.0), (1, 0.25), (0, 0.5)])
    # arm 0: n = 2, mean 0.75, V = ((1 - 0.75)^2 + (0.5 - 0.75)^2) / 2 = 0.0625 (the 1/n variance); arm 1: n = 1, V = 0
    assert policy.means() == [0.75, 0.25]
    assert policy.variances() == [0.0625, 0.0]
    assert policy.sq_sums == [1.25, 0.0625]
    log3 = math.log(3)  # t = 3
    expected = [0.75 + math.sqrt(2 * 0.0625 * log3 / 2) + 3 * log3 / 2, 0.25 + 0.0 + 3 * log3 / 1]
    assert policy.scores() == pytest.approx(expected)
    assert policy.scores() == pytest.approx([2.659955, 3.545837], abs=1e-6)
    assert policy.select() == 1


def test_same_mean_same_pulls_the_noisier_drafter_has_the_larger_index():
    policy = fresh([(0, 1.0), (1, 0.5), (0, 0.0), (1, 0.5)])
    log4 = math.log(4)
    assert policy.variances() == [0.25, 0.0]
    assert policy.scores() == pytest.approx([0.5 + math.sqrt(0.25 * log4) + 1.5 * log4, 0.5 + 1.5 * log4])
    assert policy.select() == 0


def test_knobs_move_exploration_as_documented():
    history = [(0, 1.0), (1, 0.25), (0, 0.5)]
    log3 = math.log(3)
    # zeta = 0: no bonus at all, greedy on the means
    assert fresh(history, zeta=0.0).scores() == [0.75, 0.25]
    # c = 0: only the variance term is left
    assert fresh(history, c=0.0).scores() == pytest.approx([0.75 + math.sqrt(0.0625 * log3), 0.25])
    # zeta = 2 doubles ln t in both terms; b = 2 doubles the range term; c = 0.5 halves it
    assert fresh(history, zeta=2.0).scores() == pytest.approx(
        [0.75 + math.sqrt(2 * 0.0625 * 2 * log3 / 2) + 3 * 2 * log3 / 2, 0.25 + 3 * 2 * log3]
    )
    assert fresh(history, b=2.0).scores() == pytest.approx(
        [0.75 + math.sqrt(0.0625 * log3) + 6 * log3 / 2, 0.25 + 6 * log3]
    )
    assert fresh(history, c=0.5).scores() == pytest.approx(
        [0.75 + math.sqrt(0.0625 * log3) + 1.5 * log3 / 2, 0.25 + 1.5 * log3]
    )
    base = fresh(history).scores()
    for knob in ({"zeta": 1.5}, {"c": 1.5}, {"b": 1.5}):  # larger explores more: every bonus grows
        assert all(x > y for x, y in zip(fresh(history, **knob).scores(), base))


# An exact copy of the target scores 1.0 every round (variance 0); a good drafter scores 0.8 and 0.9 in turn.
COPY_AND_GOOD = [(0, 1.0)] * 600 + [(1, 0.8), (1, 0.9)] * 70


def test_low_variance_rewards_ucb_still_explores_where_ucb_v_has_stopped():
    log_t = math.log(740)  # 600 + 140 rounds
    ucb = UCB(beta=1.0)
    ucb.reset(2)
    feed(ucb, COPY_AND_GOOD)
    # UCB: 1 + sqrt(2 ln 740 / 600) < 0.85 + sqrt(2 ln 740 / 140): one more round for the worse drafter
    assert ucb.scores() == pytest.approx([1 + math.sqrt(2 * log_t / 600), 0.85 + math.sqrt(2 * log_t / 140)])
    assert ucb.scores() == pytest.approx([1.148399, 1.157214], abs=1e-6)
    assert ucb.select() == 1

    ucbv = fresh(COPY_AND_GOOD)
    assert ucbv.variances() == pytest.approx([0.0, 0.0025])
    # UCB-V: 1 + 0 + 3 ln 740 / 600 > 0.85 + sqrt(2 * 0.0025 * ln 740 / 140) + 3 ln 740 / 140: the copy drafts
    expected = [1 + 3 * log_t / 600, 0.85 + math.sqrt(2 * 0.0025 * log_t / 140) + 3 * log_t / 140]
    assert ucbv.scores() == pytest.approx(expected)
    assert ucbv.scores() == pytest.approx([1.033033, 1.006932], abs=1e-6)
    assert ucbv.select() == 0


def _rounds_of_the_worse_drafter(policy, rounds):
    policy.reset(2)
    for _ in range(rounds):
        arm = policy.select()
        policy.update(arm, 1.0 if arm == 0 else [0.8, 0.9][policy.counts[1] % 2])
    return policy.counts[1]


def test_ucb_v_gives_the_worse_drafter_far_fewer_rounds_in_the_long_run_but_not_at_first():
    """The numbers quoted in the UCBV docstring (deterministic rewards, so exact)."""
    assert _rounds_of_the_worse_drafter(UCB(), 300) == 80
    assert _rounds_of_the_worse_drafter(UCBV(), 300) == 82  # the 3 ln t / n term dominates early
    assert _rounds_of_the_worse_drafter(UCB(), 3000) == 311
    assert _rounds_of_the_worse_drafter(UCBV(), 3000) == 168
    assert _rounds_of_the_worse_drafter(UCBV(c=0.3), 300) < 80  # a smaller c shortens the early phase


def test_rewards_must_lie_in_zero_b():
    policy = fresh([])
    with pytest.raises(ValueError, match=r"`reward` must be in \[0, 1\] for the 'ucb_v' policy, but is 2\.0\. Use a"):
        policy.update(0, 2.0)
    assert policy.counts == [0, 0] and policy.sq_sums == [0.0, 0.0]
    half = fresh([], b=0.5)
    with pytest.raises(
        ValueError, match=r"`reward` must be in \[0, 0\.5\] for the 'ucb_v' policy, but is 0\.8\. Use a reward in \[0"
    ):
        half.update(0, 0.8)
    half.update(0, 0.5)  # inside the declared range
    assert fresh([(0, 1.5)], b=2.0).means() == [1.5, 0.0]  # the fix: declare the range of your reward


def test_state_dict_keeps_the_sums_of_squares():
    policy = fresh([(0, 1.0), (1, 0.25), (0, 0.5)])
    state = json.loads(json.dumps(policy.state_dict()))
    assert state["sq_sums"] == [1.25, 0.0625]
    restored = UCBV(**state["config"])
    restored.load_state_dict(state)
    assert restored.variances() == policy.variances() and restored.scores() == policy.scores()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"zeta": -1}, r"`zeta` must be a float in \[0, inf\), but is -1\. Use 1\.0\."),
        ({"c": -0.5}, r"`c` must be a float in \[0, inf\), but is -0\.5\. Use 1\.0\."),
        ({"b": 0}, r"`b` must be a float in \(0, inf\), but is 0\. Use 1\.0 \(the range of the built-in rewards\)\."),
        ({"b": "1"}, r"`b` must be a float in \(0, inf\), but is '1'\."),
    ],
)
def test_settings_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        UCBV(**kwargs)
    with pytest.raises(ValueError, match=match):
        UCBVSettings(**kwargs)


def test_prior_is_zero_variance_pseudo_observations():
    policy = UCBV()
    policy.reset(2)
    policy.set_prior([0.9, None], weight=2.0)
    assert policy.select() == 1  # drafter 0 has a prior: not untried
    feed(policy, [(1, 0.5), (1, 0.7)])
    # drafter 0: n = 2 (prior), mean 0.9, V = 0; drafter 1: n = 2, mean 0.6, V = (0.25 + 0.49) / 2 - 0.36 = 0.01
    # t = 2 observed + 2 pseudo-observations
    log4 = math.log(4)
    assert policy.variances() == pytest.approx([0.0, 0.01])
    assert policy.scores() == pytest.approx([0.9 + 3 * log4 / 2, 0.6 + math.sqrt(2 * 0.01 * log4 / 2) + 3 * log4 / 2])
    assert policy.scores() == pytest.approx([2.979442, 2.797183], abs=1e-6)
    assert policy.select() == 0
    policy.update(0, 0.6)
    # drafter 0 pools prior and data: n = 3, mean (1.8 + 0.6) / 3 = 0.8, V = (1.62 + 0.36) / 3 - 0.64 = 0.02; t = 5
    log5 = math.log(5)
    assert policy.means() == pytest.approx([0.8, 0.6]) and policy.variances() == pytest.approx([0.02, 0.01])
    assert policy.scores() == pytest.approx(
        [0.8 + math.sqrt(2 * 0.02 * log5 / 3) + 3 * log5 / 3, 0.6 + math.sqrt(2 * 0.01 * log5 / 2) + 3 * log5 / 2]
    )
    assert policy.counts == [1, 2] and policy.sq_sums == pytest.approx([0.36, 0.74])  # pulls and data only
    with pytest.raises(ValueError, match=r"`means\[0\]` must be None or a float in \[0, 0\.5\], but is 0\.9\."):
        UCBV(b=0.5).set_prior([0.9, None])
