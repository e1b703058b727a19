"""`RoundRewards`: when a round's reward is known, and what the policy is told (hand-written rounds, no models)."""

from __future__ import annotations

import pytest
import torch

from hf_metasd.costs import CostModel
from hf_metasd.feedback import RoundRewards
from hf_metasd.policies import get_policy
from hf_metasd.reward_memory import RewardMemory
from hf_metasd.rewards import RoundFeedback
from hf_metasd.stats import MetaSDStats

N = 3  # the draft length cap: a plain step is worth 1 / (N + 1) under `speed`


def _rewards(policy: str = "ucb", **kwargs) -> RoundRewards:
    policy_ = get_policy(policy, **kwargs)
    policy_.bind(2)
    stats = MetaSDStats(["d", "no_draft"], policy, "speed", N, clock=lambda: 0.0)
    return RoundRewards(
        policy_, "speed", costs=CostModel(["d", "no_draft"]), no_draft_arm=1, num_assistant_tokens=N, stats=stats
    )


def _round(arm: int, accepted: int, *, arm_seconds=None, plain_seconds=None) -> RoundFeedback:
    tokens = torch.tensor([1, 2, 3])
    return RoundFeedback(
        arm=arm,
        draft_tokens=tokens,
        target_logits=torch.zeros(3, 0),
        target_tokens=torch.tensor([1, 2, 3][:accepted] + [0] * (3 - accepted)),
        draft_logits=None,
        num_accepted=accepted,
        num_assistant_tokens=N,
        arm_seconds=arm_seconds,
        plain_seconds=plain_seconds,
    )


def test_the_prefill_rounds_reward_waits_for_its_costs_and_then_counts_as_round_zero():
    rewards = _rewards()
    first = _round(0, 3)  # the prompt's prefill round: its arm's cost and a plain step's are not measured yet
    assert rewards.learn(first, first=True) is None and rewards.policy.counts == [0, 0]
    rewards.stats.rewards.append(None)  # the round's telemetry, as the generator records it
    rewards.costs.observe(0, 0.2)
    rewards.costs.observe(1, 0.1)  # a plain step: the cost unit
    # the next round: 3 of 3 accepted at twice a plain step's cost, (3 + 1) / (N + 1) * 0.1 / 0.2 = 0.5
    assert rewards.learn(_round(0, 3, arm_seconds=0.2, plain_seconds=0.1), first=False) == pytest.approx(0.5)
    assert rewards.stats.rewards == [pytest.approx(0.5)]  # the prefill round's reward, known now
    assert rewards.policy.counts == [2, 0] and rewards.policy.sums == [pytest.approx(1.0), 0.0]


def test_a_later_rounds_reward_without_costs_is_not_deferred():
    rewards = _rewards()
    assert rewards.learn(_round(0, 1), first=False) is None
    rewards.costs.observe(0, 0.2)
    rewards.costs.observe(1, 0.1)
    rewards.learn(_round(0, 0, arm_seconds=0.2, plain_seconds=0.1), first=False)
    assert rewards.policy.counts == [1, 0]  # only the round whose costs were known


def test_the_calibration_round_comes_once_after_the_prefill_round_before_any_plain_step():
    rewards = _rewards()
    assert not rewards.calibrating(first=True)
    assert not rewards.calibrating(first=False)  # no round recorded yet
    rewards.stats.arms.append(0)
    assert rewards.calibrating(first=False)  # the plain step's cost is unknown: measure it
    rewards.stats.arms.append(1)
    assert not rewards.calibrating(first=False)  # a plain step ran (its cost is measured when it is verified)
    fixed = _rewards("fixed", arm=0)
    fixed.stats.arms.append(0)
    assert not fixed.calibrating(first=False)  # a policy that ignores rewards needs no cost unit


def test_told_rewards_reach_the_policy_as_pulls_or_side_observations_and_the_memory():
    rewards = _rewards()
    rewards.memory = RewardMemory(["d", "no_draft"], context=("speed", N), target=None)
    rewards.tell(0, 0.5)
    rewards.tell(1, rewards.plain_value(0.1, vocab_size=8), side=True)
    assert rewards.policy.counts == [1, 1] and rewards.policy.t == 1  # a side observation is a sample, not a round
    assert rewards.memory.means() == [0.5, pytest.approx(1 / (N + 1))]
