"""The contextual policies (``throughput``, ``precedence``) on hand-made contexts, the round's context by hand, and
in `generate` on a fake clock: the round goes to the copier where its match is long and to the model drafter
elsewhere, and the copier's preview is the round's draft."""

from __future__ import annotations

import pytest
import torch
from conftest import greedy, metasd_greedy, prompts, sharpen, tiny_llama

import hf_metasd
import hf_metasd.costs
import hf_metasd.draft_length
import hf_metasd.kernels
from hf_metasd.draft_length import DraftLength, RoundLength
from hf_metasd.drafters import CorpusDrafter, ModelDrafter, PromptLookupDrafter
from hf_metasd.policies import Precedence, RoundContext, Throughput, get_policy
from hf_metasd.round_context import round_context


# ---------------------------------------------------------------------------------------------------- throughput
def test_throughput_picks_the_best_rate_of_the_round_and_falls_back_in_rate_order():
    policy = get_policy("throughput")
    policy.reset(4)
    assert policy.select_in(RoundContext(rates=(2.0, None, 3.5, 3.0), lengths=(3, 0, 2, 0))) == 2
    assert policy.fallback({2}) == 3 and policy.fallback({2, 3}) == 0 and policy.fallback({0, 2, 3}) is None
    assert policy.select_in(RoundContext(rates=(3.0, 3.0, None, 1.0), lengths=(1, 1, 0, 0))) == 0  # ties: lowest


def test_throughput_without_rates_is_greedy_on_its_means():
    policy = Throughput()
    policy.reset(3)
    policy.update(1, 0.6)
    policy.update(0, 0.2)
    assert policy.select_in(RoundContext(rates=(None, None, None), lengths=(0, 0, 0))) == 1
    assert policy.select() == 1
    assert (
        policy.config() == {"optimism": 0.5, "seed": None} and policy.contextual and not get_policy("ucb").contextual
    )


# ---------------------------------------------------------------------------------------------------- precedence
def test_precedence_takes_the_copier_from_its_threshold_on():
    policy = Precedence(copier=2, model=0, min_match=3)
    policy.reset(4)
    rates, lengths = (1.0, 1.0, 1.0, 1.0), (1, 1, 1, 0)
    picks = [policy.select_in(RoundContext(rates, lengths, (None, None, m, None))) for m in (0, 2, 3, 8)]
    assert picks == [0, 0, 2, 2]
    assert policy.select_in(RoundContext(rates, lengths)) == 0  # no match lengths told: the model drafter
    assert policy.fallback({0}) == 2 and policy.fallback({0, 2}) is None and policy.select() == 0


def test_precedence_refuses_arms_outside_the_pool_and_the_fix_works():
    policy = Precedence(copier=0, model=3)
    with pytest.raises(ValueError, match=r"`model` must be < the number of arms \(3\), but is 3\. Pass a pool index"):
        policy.reset(3)
    Precedence(copier=0, model=2).reset(3)
    with pytest.raises(ValueError, match=r"`min_match`"):
        Precedence(min_match=0)


# ---------------------------------------------------------------------------------------------------- the context
def test_draft_length_value_by_hand():
    lengths = DraftLength(num_arms=1, max_tokens=3, prior_weight=2.0)
    for k, seconds in ((1, 0.10), (2, 0.11), (3, 0.12), (4, 0.20)):
        lengths.observe_verification(k, seconds)
        lengths.observe_verification(k, seconds)
    lengths.observe_acceptance(0, 3, 3)
    lengths.observe_acceptance(0, 3, 3)  # p1 = (2 + 2 * 0.5) / 4, p2 = (2 + 2 * p1) / 4, p3 = (2 + 2 * p2) / 4
    p1, p2, p3 = 0.75, 0.875, 0.9375
    e1, e2, e3 = 1 + p1, 1 + p1 + p1 * p2, 1 + p1 + p1 * p2 + p1 * p2 * p3
    n, rate = lengths.value(0)  # E(1) / 0.11 = 15.9, E(2) / 0.12 = 20.1, E(3) / 0.20 = 15.1
    assert n == 2 and rate == pytest.approx(e2 / 0.12) and e1 / 0.11 < rate and e3 / 0.20 < rate
    assert lengths.value(0, exact=True) == (3, pytest.approx(e3 / 0.20))
    assert lengths.plain_value() == pytest.approx(10.0)
    assert DraftLength(num_arms=1, max_tokens=3).value(0) == (3, None)  # nothing measured


def test_round_context_previews_copiers_and_rates_every_arm():
    corpus = CorpusDrafter.from_sequences([[9, 9, 9, 9]], context_lookup=True)
    drafters = [ModelDrafter(tiny_llama(3, layers=1), name="m"), PromptLookupDrafter(), corpus]
    lengths = DraftLength(num_arms=4, max_tokens=3)
    for k in range(1, 5):
        lengths.observe_verification(k, 0.1)
        lengths.observe_verification(k, 0.1)
    rounds = RoundLength(lengths, "measured", plain_arm=3, match_arms={2})
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7]])
    context, previews = round_context(drafters, ids, lengths=lengths, round_length=rounds, clock=lambda: 0.0)
    assert sorted(previews) == [1, 2]  # the model drafter is rated, not asked
    assert previews[1].tokens.tolist() == [[8, 5, 6]]  # "6 7" first occurs at 1: 8 5 6
    assert context.match_lengths == (None, None, 3, None)  # the corpus continues "5 6 7" (context lookup)
    assert context.rates[3] == pytest.approx(10.0) and context.lengths[3] == 0
    assert all(rate is not None for rate in context.rates)
    end = RoundLength(lengths, "measured", plain_arm=3, match_arms={2}, max_length=ids.shape[1] + 1)
    context, _ = round_context(drafters, ids, lengths=lengths, round_length=end, clock=lambda: 0.0)
    assert context.rates[:3] == (None, None, None)  # no budget left to draft


# ---------------------------------------------------------------------------------------------------- in generate
def clear_measurements() -> None:
    """Forget what earlier calls measured (rewards, verification costs, acceptance): each call starts fresh."""
    hf_metasd.clear_reward_memory()
    hf_metasd.draft_length._CACHE.clear()
    hf_metasd.kernels._PASS_COSTS.clear()
    hf_metasd.costs._CACHE.clear()


def _repeating_prompt() -> torch.Tensor:
    return torch.tensor([[7, 3, 11, 4, 19, 8, 23, 5, 7, 3, 11, 4, 19, 8, 23]])


def test_throughput_in_generate_copies_where_the_text_repeats_and_predicts_elsewhere(target, target_copy, fake_clock):
    """A model drafter that drafts the target's own tokens at 0.3 of a plain step against a free copier: the model
    drafts the new text, the copier takes over where the answer repeats a span, and the call costs less than the
    model drafter alone."""
    prompt = _repeating_prompt()
    reference = greedy(target, prompt, 40)
    seconds, arms = {}, {}
    for policy, kwargs in (("throughput", {}), ("fixed", {"arm": 0})):
        drafters = [ModelDrafter(target_copy, name="m"), PromptLookupDrafter(max_matching_ngram_size=3)]
        clear_measurements()
        start = fake_clock.now
        with fake_clock.charging((target, [1.0, 1.05, 1.1, 1.15, 1.3]), (target_copy, 0.3)):
            out = metasd_greedy(
                target,
                prompt,
                40,
                assistant_models=drafters,
                meta_policy=policy,
                meta_policy_kwargs=kwargs,
                return_dict_in_generate=True,
            )
        assert torch.equal(out.sequences, reference)
        seconds[policy], arms[policy] = fake_clock.now - start, out.metasd.arms
    assert {0, 1} <= set(arms["throughput"])  # both drafted
    assert seconds["throughput"] < seconds["fixed"]


def test_a_previewed_copier_drafts_once_per_round(target, monkeypatch):
    lookup = PromptLookupDrafter()
    seen = []
    original = PromptLookupDrafter.candidates

    def counted(self, input_ids, num_tokens, is_allowed):
        seen.append(input_ids.shape[1])
        return original(self, input_ids, num_tokens, is_allowed)

    monkeypatch.setattr(PromptLookupDrafter, "candidates", counted)
    prompt = _repeating_prompt()
    out = metasd_greedy(
        target, prompt, 20, assistant_models=[lookup], meta_policy="throughput", return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, greedy(target, prompt, 20))
    assert len(seen) == len(set(seen))  # one proposal per position: the preview is the draft, and the replay's


@pytest.mark.parametrize("policy", ["throughput", "precedence"])
def test_contextual_policies_are_lossless_over_a_copier_and_a_model(target, policy):
    corpus = CorpusDrafter.from_sequences(
        [greedy(target, p, 16)[0, p.shape[1] :].tolist() for p in prompts(4, seed=5)], context_lookup=True
    )
    pool = [ModelDrafter(sharpen(tiny_llama(2, layers=1)), name="m"), corpus]
    kwargs = {"copier": 1, "model": 0} if policy == "precedence" else {}
    for prompt in prompts(4, seed=21):
        out = metasd_greedy(target, prompt, 24, assistant_models=pool, meta_policy=policy, meta_policy_kwargs=kwargs)
        assert torch.equal(out, greedy(target, prompt, 24))
