"""The contextual policy (`contextual_ucb`) and the round context it chooses by: hand-computed indices, the match
lengths the model-free drafters report (searched once per round), and generation: lossless through both entry
points, each round's context (and each replayed round's) as the drafters saw it, no context for other policies."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from conftest import VOCAB, greedy, metasd_greedy, prompts

import hf_metasd.drafters.prompt_lookup
from hf_metasd.benchmark.simulate import Scenario, simulate
from hf_metasd.candidate_generator import MetaCandidateGenerator
from hf_metasd.drafters import CorpusDrafter, ModelDrafter, PromptLookupDrafter
from hf_metasd.drafters.corpus_index import CorpusIndex
from hf_metasd.drafters.prompt_lookup import prompt_lookup_candidates
from hf_metasd.feedback import Replay
from hf_metasd.policies import (
    POLICY_REGISTRY,
    UCB,
    ContextualUCB,
    ContextualUCBSettings,
    RoundContext,
    get_policy,
)
from hf_metasd.policies.contextual_ucb import match_bucket

LONG, NONE = RoundContext((None, 12)), RoundContext((None, 0))  # buckets 4 and 0


def told(policy, context, history):
    policy.set_context(context)
    for arm, reward in history:
        policy.update(arm, reward)


# ---------------------------------------------------------------------------------------------------- the policy
def test_registered_and_the_only_builtin_that_uses_context():
    assert POLICY_REGISTRY["contextual_ucb"] is ContextualUCB
    assert {name for name, cls in POLICY_REGISTRY.items() if cls.uses_context} == {"contextual_ucb"}


def test_buckets_by_match_length():
    assert [match_bucket(m, 5) for m in range(11)] == [0, 1, 1, 2, 2, 3, 3, 3, 3, 4, 4]
    assert [match_bucket(m, 3) for m in (0, 1, 2, 3, 1000)] == [0, 1, 1, 2, 2]
    assert RoundContext((None, 3, 9, None)).match_length == 9


def test_indices_by_hand():
    policy = ContextualUCB(beta=0.1, backoff=1.0)
    policy.reset(3)
    told(policy, LONG, [(0, 0.2), (1, 0.8), (1, 0.8)])
    told(policy, NONE, [(0, 0.6), (1, 0.0), (2, 0.3)])
    # overall: n = [2, 3, 1], means [0.4, 1.6 / 3, 0.3]; every arm observed, so w_i = 1 and t~ = t_b + 3
    assert policy.bucket_counts == [[1, 1, 1], [0] * 3, [0] * 3, [0] * 3, [1, 2, 0]]
    assert policy.bucket_rounds == [3, 0, 0, 0, 3]
    mean1 = 1.6 / 3
    policy.set_context(LONG)  # n~ = [1 + 1, 2 + 1, 0 + 1], t~ = 3 + 3
    bonus = [0.1 * math.sqrt(2 * math.log(6) / n) for n in (2, 3, 1)]
    expected = [(0.2 + 0.4) / 2 + bonus[0], (1.6 + mean1) / 3 + bonus[1], 0.3 + bonus[2]]
    assert policy.scores() == pytest.approx(expected)  # 0.434, 0.820, 0.489
    assert policy.select() == 1
    policy.set_context(NONE)  # n~ = [2, 2, 2], t~ = 3 + 3
    bonus = 0.1 * math.sqrt(2 * math.log(6) / 2)
    expected = [(0.6 + 0.4) / 2 + bonus, (0.0 + mean1) / 2 + bonus, (0.3 + 0.3) / 2 + bonus]
    assert policy.scores() == pytest.approx(expected)  # 0.634, 0.400, 0.434
    assert policy.select() == 0
    policy.set_context(RoundContext((None, 5)))  # bucket 3, never seen: the overall means, n~ = 1, t~ = 0 + 3
    assert policy.scores() == pytest.approx([m + 0.1 * math.sqrt(2 * math.log(3)) for m in (0.4, mean1, 0.3)])
    assert policy.select() == 1


def test_without_backoff_every_arm_is_tried_in_every_bucket():
    policy = ContextualUCB(backoff=0.0)
    policy.reset(2)
    told(policy, NONE, [(0, 0.9), (1, 0.1)])
    policy.set_context(LONG)
    assert policy.scores() == [math.inf, math.inf]
    assert policy.select() == 0 and policy.fallback({0}) == 1


def test_an_arm_never_observed_is_pulled_first_whatever_the_context():
    policy = ContextualUCB()
    policy.reset(3)
    told(policy, LONG, [(0, 0.5)])
    assert policy.select() == 1
    assert policy.scores()[1:] == [math.inf, math.inf]


def test_a_side_observation_is_a_sample_of_the_bucket_not_one_of_its_rounds():
    policy = ContextualUCB()
    policy.reset(2)
    policy.set_context(LONG)
    policy.update(0, 0.5)
    policy.observe(1, 0.75)
    assert policy.counts == [1, 1] and policy.t == 1
    assert policy.bucket_counts[4] == [1, 1] and policy.bucket_sums[4] == [0.5, 0.75] and policy.bucket_rounds[4] == 1


def test_without_context_it_is_ucb():
    """No `set_context` (the simulator): the same choices as UCB, and no bucket learns."""
    contextual, ucb = ContextualUCB(beta=0.7), UCB(beta=0.7)
    rng = random.Random(3)
    for policy in (contextual, ucb):
        policy.reset(3)
    for _ in range(60):
        arm = ucb.select()
        assert contextual.select() == arm and contextual.scores() == ucb.scores()
        reward = rng.random()
        ucb.update(arm, reward)
        contextual.update(arm, reward)
        contextual.observe((arm + 1) % 3, reward / 2)
        ucb.observe((arm + 1) % 3, reward / 2)
    assert contextual.bucket_rounds == [0] * 5 and contextual.bucket_counts == [[0] * 3] * 5
    scenario = Scenario.stationary([0.8, 0.5, 0.3], draft_length=5)
    assert (
        simulate("contextual_ucb", scenario, target_tokens=300).arms
        == simulate("ucb", scenario, target_tokens=300).arms
    )


def test_it_learns_a_different_best_arm_per_context():
    """Arm 1 (a corpus) pays only on long matches, arm 0 (a model drafter) moderately everywhere: the contextual
    policy learns to pick each where it pays."""
    policy, env = ContextualUCB(beta=0.3), random.Random(0)
    policy.reset(2)
    late = []
    for step in range(600):
        context = LONG if step % 2 else NONE
        policy.set_context(context)
        arm = policy.select()
        mean = [0.5, 0.9 if context is LONG else 0.05][arm]
        policy.update(arm, float(env.random() < mean))
        if step >= 400:
            late.append(arm == (1 if context is LONG else 0))
    assert sum(late) / len(late) >= 0.85


def test_state_dict_round_trip_keeps_buckets_and_context():
    policy = ContextualUCB(beta=0.4, num_buckets=3)
    policy.reset(2)
    told(policy, LONG, [(0, 0.3), (1, 0.9)])
    told(policy, NONE, [(0, 0.6)])
    state = json.loads(json.dumps(policy.state_dict()))
    assert state["bucket_counts"] == [[1, 0], [0, 0], [1, 1]] and state["context"] == [None, 0]
    restored = get_policy("contextual_ucb", **state["config"])
    restored.load_state_dict(state)
    assert restored.state_dict() == state and restored.context == NONE
    for context in (LONG, NONE, LONG, LONG):
        for p in (policy, restored):
            p.set_context(context)
        arm = policy.select()
        assert restored.select() == arm
        policy.update(arm, 0.5)
        restored.update(arm, 0.5)
    assert restored.state_dict() == policy.state_dict()


def test_reset_forgets_buckets_and_context():
    policy = ContextualUCB()
    policy.reset(2)
    told(policy, LONG, [(0, 0.3)])
    policy.reset(2)
    assert policy.context is None and policy.bucket_counts[4] == [0, 0] and policy.bucket_rounds[4] == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_buckets": 1}, ValueError, r"`num_buckets` must be an int >= 2, but is 1\. Use 5 \(matches of 0, 1-2,"),
        ({"num_buckets": 2.5}, ValueError, r"`num_buckets` must be an int >= 2, but is 2\.5\. Use 5"),
        ({"num_buckets": 33}, ValueError, r"`num_buckets` must be at most 32, but is 33\. Use 5 \(matches of 0,"),
        ({"backoff": -1.0}, ValueError, r"`backoff` must be .*, but is -1\.0\. Use 2\.0\."),
        ({"beta": -0.1}, ValueError, r"`beta` must be .*, but is -0\.1\. Use 1\.0 \(UCB's default\)\."),
    ],
)
def test_settings_are_validated(kwargs, error, match):
    with pytest.raises(error, match=match):
        ContextualUCB(**kwargs)
    with pytest.raises(error, match=match):
        ContextualUCBSettings(**kwargs)
    assert ContextualUCB(num_buckets=32, backoff=0).config() == {
        "beta": 1.0,
        "num_buckets": 32,
        "backoff": 0.0,
        "seed": None,
    }


def test_a_context_is_validated():
    policy = ContextualUCB()
    with pytest.raises(TypeError, match=r"`context` must be a `RoundContext` or None, but is tuple\. Build it with"):
        policy.set_context((None, 3))
    with pytest.raises(TypeError, match=r"`match_lengths` must be a sequence with one entry per arm, but is int 3\."):
        RoundContext(3)
    with pytest.raises(ValueError, match=r"`match_lengths\[0\]` must be None or an int >= 0, but is True\."):
        RoundContext((True,))
    policy.set_context(RoundContext([None, 3]))  # the fix: a RoundContext (any sequence, kept as a tuple)
    assert policy.context.match_lengths == (None, 3)


def test_policies_without_context_ignore_one():
    policy = get_policy("ucb")
    policy.reset(2)
    policy.set_context(LONG)
    assert not policy.uses_context and policy.select() == 0


# ---------------------------------------------------------------------------------------------------- match lengths
def test_corpus_match_length_is_what_its_draft_continues():
    corpus = CorpusDrafter.from_sequences([[1, 2, 3, 4, 5], [7, 2, 3, 4, 6]], min_match_length=2)
    for context, expected in [([9, 2, 3], 2), ([1, 2, 3], 3), ([9, 9, 3], 0), ([8, 8], 0)]:
        ids = torch.tensor([context])
        assert corpus.match_length(ids) == expected
        tokens, _ = corpus.draft(ids, 3)
        assert (tokens.shape[-1] > 0) == (expected > 0)
        if expected:
            assert corpus.last_match_length == expected
    with_context = CorpusDrafter.from_sequences([[1, 2, 3, 4, 5]], context_lookup=True)
    assert with_context.match_length(torch.tensor([[8, 6, 7, 0, 6, 7]])) == 2  # "6 7" earlier in the context
    assert with_context.match_length(torch.tensor([[8, 6, 2, 3]])) == 2  # the corpus's "2 3"
    assert with_context.match_length(torch.tensor([[8, 6]])) == 0
    assert with_context.match_length(torch.zeros(1, 0, dtype=torch.long)) == 0


@pytest.mark.parametrize("seed", range(3))
def test_prompt_lookup_match_length_is_the_ngram_its_draft_continues(seed):
    gen = torch.Generator().manual_seed(seed)
    drafter = PromptLookupDrafter(max_matching_ngram_size=3)
    for _ in range(40):
        ids = torch.randint(0, 4, (1, int(torch.randint(1, 12, (1,), generator=gen))), generator=gen)
        n = drafter.match_length(ids)
        draft = drafter.draft(ids, 2)[0][0]
        assert (n > 0) == (draft.numel() > 0)
        if n:  # the draft follows an earlier occurrence of the last n tokens, and no longer n-gram has one
            assert prompt_lookup_candidates(ids, 2, n).tolist() == draft.tolist()
            assert n == 3 or prompt_lookup_candidates(ids, 2, n + 1).tolist() == draft.tolist()


def test_the_draft_reuses_the_search_of_match_length(monkeypatch):
    """`match_length` then `draft` on the same sequence search once; another sequence, or a changed online index,
    searches again."""
    calls = {"corpus": 0, "ngrams": 0}
    match, occurrences = CorpusIndex.match, hf_metasd.drafters.prompt_lookup.ngram_occurrences

    def counted_match(self, query):
        calls["corpus"] += 1
        return match(self, query)

    def counted_occurrences(ids, n):
        calls["ngrams"] += 1
        return occurrences(ids, n)

    monkeypatch.setattr(CorpusIndex, "match", counted_match)
    monkeypatch.setattr(hf_metasd.drafters.prompt_lookup, "ngram_occurrences", counted_occurrences)
    corpus = CorpusDrafter.from_sequences([[1, 2, 3, 4]], online_tokens=100)
    lookup = PromptLookupDrafter(max_matching_ngram_size=2)
    ids = torch.tensor([[5, 1, 2, 3, 1, 2]])
    assert corpus.match_length(ids) == 2 and lookup.match_length(ids) == 2
    assert calls == {"corpus": 2, "ngrams": 1}  # the static and the online index; the 2-gram
    assert corpus.draft(ids, 2)[0].tolist() == [[3, 4]] and lookup.draft(ids, 2)[0].tolist() == [[3, 1]]
    assert calls == {"corpus": 2, "ngrams": 1}
    shorter = ids[:, :-2]  # 5 1 2 3: "1 2 3" in the corpus, no earlier "2 3" or "3" in the sequence
    assert corpus.draft(shorter, 2)[0].tolist() == [[4]] and lookup.match_length(shorter) == 0
    assert calls == {"corpus": 4, "ngrams": 3}  # another sequence: searched again (both n-gram sizes)
    corpus.on_generation_end(torch.tensor([[9, 2, 3, 7]]), 0)  # a new online index
    assert corpus.match_length(shorter) == 3 and calls["corpus"] == 6


# ---------------------------------------------------------------------------------------------------- generation
@pytest.fixture(scope="module")
def pool(target, drafters):
    """A model drafter, a corpus of some of the target's answers (with context lookup), prompt lookup."""
    answers = [greedy(target, p, 24)[0, p.shape[1] :].tolist() for p in prompts(3, seed=21)]
    corpus = CorpusDrafter.from_sequences(answers, context_lookup=True, vocab_size=VOCAB, name="corpus")
    return [ModelDrafter(drafters[0], name="model"), corpus, PromptLookupDrafter(name="lookup")]


def test_greedy_is_lossless_with_the_contextual_policy(target, pool, entry_point):
    for prompt in prompts(2, seed=21) + prompts(2, seed=22):
        out = metasd_greedy(
            target,
            prompt,
            24,
            assistant_models=pool,
            meta_policy="contextual_ucb",
            num_assistant_tokens=4,
            return_dict_in_generate=True,
        )
        assert torch.equal(out.sequences, greedy(target, prompt, 24)), f"contextual_ucb via {entry_point}"
        assert out.metasd.policy == "contextual_ucb"
    kwargs = {"repetition_penalty": 1.3, "no_repeat_ngram_size": 3}
    out = metasd_greedy(target, prompt, 24, assistant_models=pool, meta_policy="contextual_ucb", **kwargs)
    assert torch.equal(out, greedy(target, prompt, 24, **kwargs))


class Spy(ContextualUCB):
    """Records the context of every round it selects for and of every reward it is told; drafts with `arm`."""

    def __init__(self, arm):
        super().__init__()
        self.arm, self.selected, self.told = arm, [], []

    def select(self):
        self.selected.append(self.context)
        return self.arm

    def update(self, arm, reward):
        self.told.append((arm, self.context, "pull"))
        super().update(arm, reward)

    def observe(self, arm, reward):
        self.told.append((arm, self.context, "side"))
        super().observe(arm, reward)


def test_each_round_and_each_replayed_round_is_learnt_in_its_own_context(target, pool, monkeypatch):
    generators, decided, steps = [], [], []
    context_step, replay_decided = MetaCandidateGenerator._context, Replay.decided

    def spy_context(self, input_ids):
        if self not in generators:
            generators.append(self)
        context_step(self, input_ids)
        corpus, lookup = self.drafters[1], self.drafters[2]
        context = self.contexts[input_ids.shape[1]]
        assert context.match_lengths == (None, corpus.match_length(input_ids), lookup.match_length(input_ids))
        assert self.policy.context is context
        steps.append(context)

    def spy_decided(self, sequence):
        found = replay_decided(self, sequence)
        current = max(generators[0].contexts)  # the start of the round being learnt from
        decided.extend((r.start, r.arm, current) for r, _ in found)
        return found

    monkeypatch.setattr(MetaCandidateGenerator, "_context", spy_context)
    monkeypatch.setattr(Replay, "decided", spy_decided)
    policy = Spy(arm=0)  # the model drafter drafts, and misses: the corpus's longer proposals wait a round or more
    prompt = prompts(1, seed=21)[0]
    out = metasd_greedy(target, prompt, 24, assistant_models=pool, meta_policy=policy, meta_reward="be")
    assert torch.equal(out, greedy(target, prompt, 24))
    (generator,) = generators
    contexts = generator.contexts
    assert policy.selected == steps  # every round selects (BE: no calibration round) in the context just computed
    assert {c.match_length > 0 for c in steps} == {True, False}  # the context changes within the answer
    sides = [(arm, context) for arm, context, kind in policy.told if kind == "side"]
    assert sides and sides == [(arm, contexts[start]) for start, arm, _ in decided]  # BE: every decided one is told
    late = [(start, current) for start, _, current in decided if start < current]  # decided in a later round
    assert any(contexts[start] != contexts[current] for start, current in late)


def test_other_policies_compute_no_context(target, pool, monkeypatch):
    def refuse(self, input_ids):
        raise AssertionError("a policy that does not use context made the generator compute one")

    monkeypatch.setattr(CorpusDrafter, "match_length", refuse)
    monkeypatch.setattr(PromptLookupDrafter, "match_length", refuse)
    prompt = prompts(1, seed=21)[0]
    assert torch.equal(metasd_greedy(target, prompt, 12, assistant_models=pool), greedy(target, prompt, 12))


def test_a_contextual_call_searches_the_corpus_once_per_round(target, pool, monkeypatch):
    """The context step, the draft and the replayed rounds' proposals at one position share one search."""
    calls = []
    match = CorpusIndex.match

    def counted_match(self, query):
        calls.append(query)
        return match(self, query)

    monkeypatch.setattr(CorpusIndex, "match", counted_match)
    prompt = prompts(1, seed=21)[0]
    out = metasd_greedy(
        target, prompt, 24, assistant_models=pool, meta_policy="contextual_ucb", return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, greedy(target, prompt, 24))
    assert len(calls) == len(out.metasd.arms)
