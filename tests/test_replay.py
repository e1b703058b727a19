"""Replayed rounds: model-free drafters that did not draft a round are scored on it in hindsight, exactly, and the
policy learns from those side observations (`Policy.observe`)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import VOCAB, greedy, metasd_greedy, prompts, sharpen, tiny_llama
from transformers import LogitsProcessor, LogitsProcessorList

import hf_metasd
import hf_metasd.costs
import hf_metasd.stats
from hf_metasd import MetaSDConfigError
from hf_metasd.candidate_generator import MetaCandidateGenerator
from hf_metasd.drafters import CorpusDrafter, PromptLookupDrafter
from hf_metasd.feedback import ReplayedRound, replayed_accepted, replayed_feedback
from hf_metasd.policies import POLICY_REGISTRY, get_policy
from hf_metasd.rewards import REPLAYABLE_REWARDS, get_reward, is_replayable
from hf_metasd.settings import MetaSDSettings

N = 3


@pytest.fixture(scope="module")
def model():
    return sharpen(tiny_llama(0))


@pytest.fixture(scope="module")
def case(model):
    """A repetitive prompt, the target's greedy answer, and a corpus drafter holding part of that answer."""
    prompt = prompts(1, seed=5)[0].repeat(1, 3)
    reference = greedy(model, prompt, 40)
    corpus = CorpusDrafter.from_sequences([reference[0, prompt.shape[1] :].tolist()[:20]], name="corpus")
    return prompt, reference, corpus


class UnitClock:
    """Time moves one unit per target forward pass and nowhere else: every round costs 1, drafting is free."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def unit_clock(monkeypatch, model):
    clock = UnitClock()
    monkeypatch.setattr(hf_metasd.stats, "CLOCK", clock)
    monkeypatch.setattr(hf_metasd.costs, "_CACHE", type(hf_metasd.costs._CACHE)())
    handle = model.register_forward_pre_hook(lambda *_: setattr(clock, "now", clock.now + 1.0))
    yield clock
    handle.remove()


# ---------------------------------------------------------------------- hindsight scoring, by hand
def test_replayed_accepted_is_decided_by_a_mismatch_or_the_whole_proposal():
    replayed = ReplayedRound(arm=1, start=3, tokens=[5, 6, 7], seconds=0.0)
    assert replayed_accepted(replayed, [0, 1, 2]) is None  # nothing after the start yet
    assert replayed_accepted(replayed, [0, 1, 2, 5, 6]) is None  # matches so far, not covered
    assert replayed_accepted(replayed, [0, 1, 2, 4]) == 0
    assert replayed_accepted(replayed, [0, 1, 2, 5, 9]) == 1
    assert replayed_accepted(replayed, [0, 1, 2, 5, 6, 7]) == 3
    assert replayed_accepted(replayed, [0, 1, 2, 5, 6, 8, 9]) == 2


def test_replayed_feedback_scores_like_the_round_it_replays():
    # accepted 1 of 3 at cost 2 where a plain step costs 1: speed = (1 + 1) / (3 + 1) * 1 / 2 = 0.25
    replayed = ReplayedRound(arm=0, start=2, tokens=[5, 6, 7], seconds=0.0)
    feedback = replayed_feedback(
        replayed, 1, [0, 1, 5, 9], VOCAB, num_assistant_tokens=N, arm_seconds=2.0, plain_seconds=1.0
    )
    assert get_reward("speed")(feedback) == pytest.approx(0.25)
    assert get_reward("be")(feedback) == pytest.approx(1 / 3)
    assert get_reward("eal")(feedback) == pytest.approx(1 / 3)
    assert feedback.target_logits.shape == (3, 0)  # no one-hot rows: the target's tokens are enough
    # the third position lies beyond the sequence: another token than the draft's
    assert feedback.target_tokens.tolist() == [5, 9, 8]
    # the same round with one-hot target logits instead scores the same under every replayable reward
    one_hot = torch.nn.functional.one_hot(feedback.target_tokens, VOCAB).float()
    dense = dataclasses.replace(feedback, target_logits=one_hot, target_tokens=None)
    for name in REPLAYABLE_REWARDS:
        assert get_reward(name)(dense) == pytest.approx(get_reward(name)(feedback))


def test_only_rewards_that_acceptance_determines_can_score_a_replayed_round():
    assert {"be", "eal", "speed"} == REPLAYABLE_REWARDS
    assert is_replayable("speed") and is_replayable(get_reward("be"))
    assert not is_replayable("bd") and not is_replayable("cost") and not is_replayable(lambda feedback: 0.5)


# ---------------------------------------------------------------------- policies
@pytest.mark.parametrize("name", sorted(POLICY_REGISTRY))
def test_side_observations_count_exactly_where_the_policy_learns_them(name):
    policy = get_policy(name, **({"arm": 0} if name == "fixed" else {}))
    policy.reset(num_arms=3)
    before = list(policy.counts)
    policy.observe(2, 0.5)
    if policy.learns_side_observations:
        assert policy.counts == [before[0], before[1], before[2] + 1]
        assert policy.sums[2] == pytest.approx(0.5)
    else:
        assert policy.counts == before


def test_a_side_observation_counts_as_a_sample_not_as_a_round():
    policy = get_policy("ucb", beta=0.5)
    policy.reset(num_arms=2)
    policy.update(0, 0.25)
    policy.update(0, 0.25)
    policy.observe(1, 0.75)
    assert policy.counts == [2, 1] and policy.t == 2
    # t = 2 rounds: 0.25 + 0.5 sqrt(2 ln 2 / 2) and 0.75 + 0.5 sqrt(2 ln 2 / 1)
    assert policy.scores() == pytest.approx(
        [0.25 + 0.5 * math.sqrt(math.log(2)), 0.75 + 0.5 * math.sqrt(2 * math.log(2))]
    )
    assert policy.select() == 1  # the observed arm is not "untried": no forced pull, and it leads


# ---------------------------------------------------------------------- generate
class Forbid(LogitsProcessor):
    """Sets the scores of `tokens` to -inf: a drafter must not propose them."""

    def __init__(self, tokens):
        self.tokens = list(tokens)

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[:, self.tokens] = -float("inf")
        return scores


@pytest.mark.parametrize("forbid", [False, True])
def test_side_observations_are_exactly_what_each_drafter_would_have_earned(model, case, unit_clock, forbid):
    prompt, reference, corpus = case
    processors = LogitsProcessorList()
    if forbid:  # a token of the answer and the corpus is forbidden: the output and the drafts change (and, with
        # this seed, side observations are left to compare)
        processors.append(Forbid([81]))
        assert 81 in corpus.index.documents()[0]
        reference = greedy(model, prompt, 40, logits_processor=processors)
    pool = [PromptLookupDrafter(), corpus]
    out = metasd_greedy(
        model,
        prompt,
        40,
        assistant_models=pool,
        num_assistant_tokens=N,
        meta_skinny_gemm=False,
        logits_processor=processors,
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, reference)
    stats = out.metasd
    sequence = reference[0].tolist()
    # each round costs 1 unit, a plain step too: a replayed round with a accepted tokens scores (a + 1) / (N + 1)
    expected, start = [], prompt.shape[1]
    for r, arm in enumerate(stats.arms):
        others = [d for d in (0, 1) if d != arm and d not in stats.abstained[r]]
        budget = min(N, reference.shape[1] - start - 1)
        for other in others if r > 0 else []:
            tokens, _ = pool[other].spawn(model).draft(reference[:, :start], budget, logits_processor=processors)
            if tokens.shape[-1]:
                accepted = replayed_accepted(ReplayedRound(other, start, tokens[0].tolist(), 0.0), sequence)
                if accepted is not None:
                    expected.append((other, (accepted + 1) / (N + 1)))
        start += stats.new_tokens[r]
    observed = [(arm, value) for row in stats.replay_rewards for arm, value in row if arm != 2]
    assert sorted(observed) == sorted(expected)
    assert observed, "the test must see side observations"
    plain = [value for row in stats.replay_rewards for arm, value in row if arm == 2]
    assert plain and all(value == pytest.approx(1 / (N + 1)) for value in plain)
    assert stats.replay_seconds == 0.0  # proposing is free on this clock


def test_a_policy_instance_counts_pulls_and_side_observations(model, case, unit_clock):
    prompt, reference, corpus = case
    policy = get_policy("ucb", beta=0.1)
    out = metasd_greedy(
        model,
        prompt,
        40,
        assistant_models=[PromptLookupDrafter(), corpus],
        meta_policy=policy,
        meta_skinny_gemm=False,
        return_dict_in_generate=True,
    )
    stats = out.metasd
    side = [0, 0, 0]
    for row in stats.replay_rewards:
        for arm, _ in row:
            side[arm] += 1
    assert policy.counts == [p + s for p, s in zip(stats.pulls, side)]


@pytest.mark.parametrize("replay", [True, False, None])
def test_replay_is_lossless(model, case, replay):
    prompt, reference, corpus = case
    out = metasd_greedy(
        model,
        prompt,
        40,
        assistant_models=[PromptLookupDrafter(), tiny_llama(3), corpus],
        meta_replay=replay,
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, reference)
    assert bool(out.metasd.replay_rewards) == (replay is not False)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"meta_replay": "yes"}, "`meta_replay` must be True, False or None (automatic), but is 'yes'."),
        (
            {"meta_replay": True, "meta_reward": "bd"},
            "`meta_replay` needs a reward of ['be', 'eal', 'speed'], but the reward is 'bd'. Pass `meta_replay=False`",
        ),
        (
            {"meta_replay": True, "meta_policy": "exp3"},
            "`meta_replay` needs a policy that learns side observations, but the policy is 'exp3'.",
        ),
    ],
)
def test_replay_refuses_what_it_cannot_do(model, case, kwargs, message):
    prompt, _, corpus = case
    with pytest.raises(MetaSDConfigError) as err:
        metasd_greedy(model, prompt, 8, assistant_models=[PromptLookupDrafter(), corpus], **kwargs)
    assert message in str(err.value)


def test_replay_refuses_sampling(model, case):
    prompt, _, corpus = case
    with pytest.raises(MetaSDConfigError, match=r"`meta_replay` needs greedy decoding, but `do_sample` is True"):
        model.generate(
            prompt,
            do_sample=True,
            max_new_tokens=8,
            custom_generate=hf_metasd.generate,
            assistant_models=[PromptLookupDrafter(), corpus],
            meta_replay=True,
        )


def test_sampling_turns_replay_off_by_itself(model, case):
    prompt, _, corpus = case
    torch.manual_seed(0)
    out = model.generate(
        prompt,
        do_sample=True,
        max_new_tokens=8,
        custom_generate=hf_metasd.generate,
        assistant_models=[PromptLookupDrafter(), corpus],
        return_dict_in_generate=True,
    )
    assert out.metasd.replay_rewards == []


@pytest.mark.parametrize("forbidden", [[], [3], [4], [3, 4]])
def test_a_replayed_proposal_is_the_one_the_drafter_would_have_made_under_the_processors(model, forbidden):
    # prompt lookup finds "1 2" twice: followed by 3, then by 4; a forbidden continuation sends it to the other match
    prefix = torch.tensor([[1, 2, 3, 7, 1, 2, 4, 9, 1, 2]])
    processors = LogitsProcessorList([Forbid(forbidden)] if forbidden else [])
    calls = []
    processors.append(type("Count", (LogitsProcessor,), {"__call__": lambda self, ids, s: calls.append(1) or s})())
    drafter = PromptLookupDrafter()
    gen = MetaCandidateGenerator(
        [drafter], get_policy("ucb"), MetaSDSettings(num_assistant_tokens=2), logits_processor=processors
    )
    expected, _ = gen.drafters[0].draft(prefix, 2, logits_processor=processors)
    calls.clear()
    allowed = gen.replay._first_position_filter(prefix, VOCAB)
    got = gen.replay._draft(0, prefix, 2, first_token=5, allowed=allowed)
    assert got.tolist() == expected.tolist()
    if not forbidden:
        assert len(calls) == 1  # one run of the processors for the round, none per proposed token
