"""Learned priors (`hf_metasd.reward_memory`): what a call learns becomes the next call's prior, exactly, and only
where it should."""

from __future__ import annotations

import pytest
import torch
from conftest import greedy, metasd_greedy, prompts, tiny_llama

from hf_metasd import MetaSDConfigError, clear_reward_memory, get_policy, reward_memory_scope
from hf_metasd.reward_memory import MAX_OBSERVATIONS, RewardMemory

PROMPTS = prompts(2, seed=11)
GREEDY = {"meta_policy": "epsilon_greedy", "meta_policy_kwargs": {"epsilon": 0.0}}


@pytest.fixture(scope="module")
def pool(target_copy):
    return [tiny_llama(31), target_copy, tiny_llama(32)]


def _rewards_by_arm(stats) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for arm, reward in zip(stats.arms, stats.rewards):
        if reward is not None:
            out.setdefault(stats.drafter_names[arm], []).append(reward)
    return out


def _call(target, pool, prompt=PROMPTS[0], **kwargs):
    kwargs = {"meta_reward": "bd", **GREEDY, **kwargs}
    return metasd_greedy(target, prompt, 12, assistant_models=pool, return_dict_in_generate=True, **kwargs)


# ---------------------------------------------------------------------- the memory itself
def test_means_by_hand_and_the_fade_beyond_the_cap():
    owner = torch.nn.Linear(1, 1)
    memory = RewardMemory(["a", "b"], context=("speed", 3), target=owner)
    for reward in (0.2, 0.4, 0.6):
        memory.record(0, reward)
    assert memory.means() == [pytest.approx(0.4), None]
    for _ in range(MAX_OBSERVATIONS):
        memory.record(1, 1.0)
    assert memory.means()[1] == 1.0
    memory.record(1, 0.0)  # the cap reached: n - 1 of the n rewards' weight stays (sum n - 1), then the new one
    n = MAX_OBSERVATIONS
    assert memory.means()[1] == pytest.approx((n - 1) / n)


def test_shared_by_target_context_and_scope_only():
    owner, other = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    RewardMemory(["a"], context=("speed", 3), target=owner).record(0, 0.5)
    assert RewardMemory(["a"], context=("speed", 3), target=owner).means() == [0.5]
    assert RewardMemory(["a"], context=("speed", 4), target=owner).means() == [None]
    assert RewardMemory(["a"], context=("speed", 3), target=other).means() == [None]
    assert RewardMemory(["a"], context=("speed", 3), target=None).means() == [None]
    with reward_memory_scope("bench method"):
        assert RewardMemory(["a"], context=("speed", 3), target=owner).means() == [None]
        RewardMemory(["a"], context=("speed", 3), target=owner).record(0, 0.1)
    assert RewardMemory(["a"], context=("speed", 3), target=owner).means() == [0.5]
    clear_reward_memory()
    assert RewardMemory(["a"], context=("speed", 3), target=owner).means() == [None]


def test_no_target_means_a_memory_of_its_own():
    memory = RewardMemory(["a"], context=(), target=None)
    memory.record(0, 0.5)
    assert memory.means() == [0.5]
    assert RewardMemory(["a"], context=(), target=None).means() == [None]


# ---------------------------------------------------------------------- through generate
def test_the_next_call_starts_from_the_mean_rewards_of_the_last(target, pool):
    first = _call(target, pool).metasd
    learned = {name: sum(r) / len(r) for name, r in _rewards_by_arm(first).items()}
    assert set(learned) == set(first.drafter_names)  # epsilon 0 still tries every arm once
    second = _call(target, pool, PROMPTS[1]).metasd
    assert second.learned_priors == pytest.approx(learned)
    # greedy on the prior means: no forced first pulls, the best-scoring arm drafts first
    assert second.arms[0] == second.drafter_names.index(max(learned, key=learned.get))
    third = _call(target, pool).metasd
    both = _rewards_by_arm(first)
    for name, rewards in _rewards_by_arm(second).items():
        both[name] = both.get(name, []) + rewards
    assert third.learned_priors == pytest.approx({name: sum(r) / len(r) for name, r in both.items()})


def test_learned_priors_change_no_output(target, pool):
    _call(target, pool)
    for prompt in PROMPTS:
        out = _call(target, pool, prompt)
        assert out.metasd.learned_priors
        assert torch.equal(out.sequences, greedy(target, prompt, 12))


def test_a_prior_from_the_call_wins(target, pool):
    _call(target, pool)
    names = _call(target, pool).metasd.drafter_names
    second = _call(target, pool, meta_priors={names[1]: 0.9}).metasd
    assert set(second.learned_priors) == {names[0], names[2]}
    assert second.arms[0] == 1  # 0.9 beats what the others learnt (< 0.9 for the random drafters)


def test_a_learned_mean_replaces_the_pool_prior_measured_elsewhere(target, pool):
    from hf_metasd import DrafterPool

    names = _call(target, pool).metasd.drafter_names  # learns every arm (the pool's first arm among them)
    clear_reward_memory()
    built_with_priors = DrafterPool(
        pool,
        target=target,
        reward="bd",
        policy="epsilon_greedy",
        policy_kwargs={"epsilon": 0.0},
        priors={names[0]: 0.99, names[1]: 0.01, names[2]: 0.01},  # from another machine: arm 0 looks best
    )
    first = metasd_greedy(target, PROMPTS[0], 12, assistant_models=built_with_priors, return_dict_in_generate=True)
    assert first.metasd.learned_priors == {} and first.metasd.arms[0] == 0  # nothing learnt yet: the pool's prior
    learned = {name: sum(r) / len(r) for name, r in _rewards_by_arm(first.metasd).items()}
    second = metasd_greedy(target, PROMPTS[1], 12, assistant_models=built_with_priors, return_dict_in_generate=True)
    assert second.metasd.learned_priors == pytest.approx(learned)  # arm 0's learned mean replaced the 0.99
    assert second.metasd.arms[0] == names.index(max(learned, key=learned.get))
    # a prior given with the call still wins over the learned mean
    third = metasd_greedy(
        target,
        PROMPTS[1],
        12,
        assistant_models=built_with_priors,
        meta_priors={names[0]: 1.0, names[1]: 0.0, names[2]: 0.0},
        return_dict_in_generate=True,
    )
    assert third.metasd.learned_priors == {} and third.metasd.arms[0] == 0


def test_off_and_where_it_does_not_apply(target, pool):
    _call(target, pool)
    assert _call(target, pool, meta_learned_priors=False).metasd.learned_priors == {}
    assert _call(target, pool, meta_policy=get_policy("ucb"), meta_policy_kwargs=None).metasd.learned_priors == {}
    # another reward's values mean something else: nothing learnt under "bd" applies to "be"
    assert _call(target, pool, meta_reward="be").metasd.learned_priors == {}
    assert _call(target, pool, num_assistant_tokens=2).metasd.learned_priors == {}
    # a policy without means takes no prior
    assert _call(target, pool, meta_policy="exp3", meta_policy_kwargs=None).metasd.learned_priors == {}


def test_a_callable_reward_is_not_remembered(target, pool):
    def half(feedback):
        return 0.5

    _call(target, pool, meta_reward=half)
    assert _call(target, pool, meta_reward=half).metasd.learned_priors == {}


def test_a_policy_instance_teaches_later_calls_by_name(target, pool):
    """What a carried policy learns is a measurement like any other: a later call by name starts from it."""
    stats = _call(target, pool, meta_policy=get_policy("ucb"), meta_policy_kwargs=None).metasd
    learned = {name: sum(r) / len(r) for name, r in _rewards_by_arm(stats).items()}
    assert _call(target, pool).metasd.learned_priors == pytest.approx(learned)


def test_speed_remembers_side_observations_and_the_no_draft_arm(target, pool):
    from hf_metasd import PromptLookupDrafter

    arms = [PromptLookupDrafter(), *pool[:1]]
    first = _call(target, arms, meta_reward="speed", meta_policy="ucb_scaled", meta_policy_kwargs=None).metasd
    seen = _rewards_by_arm(first)
    for observed in first.replay_rewards:
        for arm, reward in observed:
            seen.setdefault(first.drafter_names[arm], []).append(reward)
    second = _call(target, arms, meta_reward="speed", meta_policy="ucb_scaled", meta_policy_kwargs=None).metasd
    assert "no_draft" in second.learned_priors
    assert second.learned_priors == pytest.approx({name: sum(r) / len(r) for name, r in seen.items()})


def test_a_drafter_of_the_same_name_with_other_settings_or_data_learns_from_nothing(target, pool):
    from hf_metasd import CorpusDrafter

    answers = [greedy(target, p, 12)[0, p.shape[1] :].tolist() for p in PROMPTS]
    corpus = CorpusDrafter.from_sequences(answers, name="c")
    kwargs = {"meta_reward": "speed", "meta_policy": "ucb_scaled", "meta_policy_kwargs": None}
    _call(target, [corpus, *pool[:1]], **kwargs)
    again = _call(target, [corpus.spawn(target), *pool[:1]], **kwargs).metasd  # a copy: the same drafter
    assert "c" in again.learned_priors
    for other in (
        CorpusDrafter(corpus.index, name="c", context_lookup=True),  # another setting
        CorpusDrafter.from_sequences(answers[:1], name="c"),  # another corpus
    ):
        fresh = _call(target, [other, *pool[:1]], **kwargs).metasd
        assert "c" not in fresh.learned_priors


def test_the_setting_must_be_a_bool(target, pool):
    with pytest.raises(
        MetaSDConfigError, match=r"`meta_learned_priors` must be True or False, but is 'yes'\. Pass a bool\."
    ):
        _call(target, pool, meta_learned_priors="yes")
