"""Draft length chosen by measurement (`hf_metasd.draft_length`): hand-computed choices, optimism about unmeasured
lengths, the acceptance estimate, and whole calls under a fake clock whose verification cost depends on the number
of tokens verified, as on a real CPU."""

from __future__ import annotations

import pytest
import torch
from conftest import greedy, metasd_greedy, prompts

import hf_metasd.costs
import hf_metasd.draft_length
import hf_metasd.stats
from hf_metasd import MetaSDConfigError
from hf_metasd.draft_length import DraftLength

PROMPT = prompts(1, seed=11)[0]


# ---------------------------------------------------------------------- the choice, by hand
def _measured(lengths: DraftLength, seconds: dict[int, float], times: int = 2) -> None:
    for _ in range(times):
        for k, s in seconds.items():
            lengths.observe_verification(k, s)


def test_nothing_measured_drafts_the_cap():
    lengths = DraftLength(num_arms=2, max_tokens=5)
    assert lengths.choose(0) == 5
    assert lengths.choose(0, cap=2) == 2 and lengths.choose(0, cap=0) == 0
    lengths.observe_verification(4, 0.2)  # once: shorter passes are guessed at k/4 of it, 5 and 6 at 0.2
    assert lengths.verification_seconds() == pytest.approx([0.05, 0.1, 0.15, 0.2, 0.2, 0.2])
    assert lengths.choose(1) == 1  # 1.5 / 0.1 is the best guess


def test_hand_computed_choice_with_known_rates_and_costs():
    lengths = DraftLength(num_arms=1, max_tokens=3, prior_weight=0.0)
    # positions 1, 2, 3 reached 4, 4, 2 times and accepted 4, 2, 1 times: rates 1.0, 0.5, 0.5
    lengths.observe_acceptance(0, 3, 3)
    lengths.observe_acceptance(0, 3, 1)
    lengths.observe_acceptance(0, 3, 2)
    lengths.observe_acceptance(0, 3, 1)
    assert lengths.acceptance(0, 3) == [1.0, 0.5, 0.5]
    # E(1) = 2, E(2) = 2.5, E(3) = 2.75; v(2) = 1.0, v(3) = 1.2, v(4) = 1.5 -> 2.0, 2.083, 1.833: n = 2
    _measured(lengths, {1: 0.9, 2: 1.0, 3: 1.2, 4: 1.5})
    assert lengths.choose(0) == 2
    # a verification of 4 tokens as cheap as one of 3: E(3) / 1.2 = 2.29 wins
    _measured(lengths, {4: 1.2}, times=30)
    assert lengths.choose(0) == 3


def test_drafting_cost_per_token_shortens_the_draft():
    lengths = DraftLength(num_arms=2, max_tokens=3, prior_weight=0.0)
    for arm in (0, 1):
        lengths.observe_acceptance(arm, 3, 3)  # rates 1, 1, 1: E(n) = n + 1
    _measured(lengths, {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0})
    lengths.observe_draft(1, 2, 2.0)  # arm 1: one second per drafted token
    # arm 0 (free drafting): 4 / 1.0 at n = 3; arm 1: (n + 1) / (n + 1) = 1 for every n, ties go to the longest
    assert lengths.choose(0) == 3 and lengths.choose(1) == 3
    lengths.observe_draft(1, 1, 4.0)  # smoothed: 0.7 * 1 + 0.3 * 4 = 1.9 per token: (n + 1) / (1.9 n + 1)
    assert lengths.choose(1) == 1


def test_an_unmeasured_length_is_assumed_as_cheap_as_the_dearest_shorter_one():
    lengths = DraftLength(num_arms=1, max_tokens=3)
    _measured(lengths, {1: 0.06, 4: 0.09})
    assert lengths.verification_seconds() == pytest.approx([0.06, 0.06, 0.06, 0.09])
    assert lengths.choose(0) == 2  # rates 1/2: 1.75 / 0.06 beats 1.875 / 0.09 and 1.5 / 0.06


def test_a_dear_length_measured_once_is_tried_again_before_it_is_ruled_out():
    lengths = DraftLength(num_arms=1, max_tokens=3, min_observations=2)
    _measured(lengths, {1: 0.06, 2: 0.06, 3: 0.06})
    lengths.observe_verification(4, 0.5)  # one unlucky measurement
    assert lengths.verification_seconds()[3] == pytest.approx(0.06) and lengths.choose(0) == 3
    lengths.observe_verification(4, 0.5)
    assert lengths.verification_seconds()[3] == pytest.approx(0.5) and lengths.choose(0) == 2


def test_a_shorter_length_never_measured_is_guessed_from_a_longer_one():
    lengths = DraftLength(num_arms=1, max_tokens=3)
    _measured(lengths, {4: 0.08})  # no plain step measured (e.g. a policy that never gives one)
    assert lengths.verification_seconds() == pytest.approx([0.02, 0.04, 0.06, 0.08])
    assert lengths.choose(0) == 1  # 1.5 / 0.04 is the best guess: it is tried and measured
    _measured(lengths, {2: 0.07})
    assert lengths.verification_seconds() == pytest.approx([0.035, 0.07, 0.07, 0.08])
    assert lengths.choose(0) == 2  # 1.75 / 0.07 beats 1.875 / 0.08 and 1.5 / 0.07


def test_acceptance_shrinks_to_the_position_before():
    lengths = DraftLength(num_arms=1, max_tokens=4, prior_weight=2.0)
    assert lengths.acceptance(0, 3) == [0.5, 0.5, 0.5]
    lengths.observe_acceptance(0, 2, 2)  # reached 1, 2; accepted both
    lengths.observe_acceptance(0, 2, 0)  # reached 1; accepted none
    # p1 = (1 + 2 * 0.5) / (2 + 2) = 0.5; p2 = (1 + 2 * 0.5) / (1 + 2) = 2/3; p3, p4 never reached: as p2
    assert lengths.acceptance(0, 4) == pytest.approx([0.5, 2 / 3, 2 / 3, 2 / 3])


def test_old_acceptance_counts_fade():
    lengths = DraftLength(num_arms=1, max_tokens=1, prior_weight=0.0)
    for _ in range(512):
        lengths.observe_acceptance(0, 1, 1)
    lengths.observe_acceptance(0, 1, 0)  # 513 reached, 512 accepted: halved
    assert lengths._tried[0] == [256.5] and lengths._accepted[0] == [256.0]


def test_measurements_are_shared_across_calls_with_the_same_target(monkeypatch):
    monkeypatch.setattr(hf_metasd.draft_length, "_CACHE", type(hf_metasd.draft_length._CACHE)())
    target = torch.nn.Linear(2, 2)
    first = DraftLength(num_arms=1, max_tokens=3, keys=["d"], target=target)
    _measured(first, {1: 0.1, 4: 0.3})
    first.observe_acceptance(0, 3, 3)
    second = DraftLength(num_arms=1, max_tokens=3, keys=["d"], target=target)
    assert second.summary() == first.summary() and second.acceptance(0, 3) == first.acceptance(0, 3)
    other = DraftLength(num_arms=1, max_tokens=3, keys=["d"], target=torch.nn.Linear(2, 2))
    assert other.summary() == {} and other.choose(0) == 3
    with hf_metasd.reward_memory_scope("another method"):  # acceptance is per scope, costs are the machine's
        scoped = DraftLength(num_arms=1, max_tokens=3, keys=["d"], target=target)
    assert scoped.summary() == first.summary() and scoped.acceptance(0, 1) == [0.5]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match=r"`max_tokens` must be an int >= 1, but is 0\. Use the call's"):
        DraftLength(num_arms=1, max_tokens=0)
    with pytest.raises(ValueError, match=r"`keys` must hold one key per arm \(2\), but holds 1\. Fix the list\."):
        DraftLength(num_arms=2, max_tokens=3, keys=["a"])


# ---------------------------------------------------------------------- whole calls under a fake clock
# (`FakeClock` charges the target by the tokens each pass is fed, a drafter a constant per forward)
@pytest.fixture
def clock(fake_clock, monkeypatch):
    monkeypatch.setattr(hf_metasd.costs, "_CACHE", type(hf_metasd.costs._CACHE)())
    monkeypatch.setattr(hf_metasd.draft_length, "_CACHE", type(hf_metasd.draft_length._CACHE)())
    return fake_clock


def _call(target, drafter, clock, target_costs, **kwargs):
    start = clock.now
    with clock.charging((target, target_costs), (drafter, 0.1)):
        out = metasd_greedy(
            target,
            PROMPT,
            40,
            assistant_models=[drafter],
            meta_policy="fixed",
            meta_policy_kwargs={"arm": 0},
            meta_skinny_gemm=False,
            num_assistant_tokens=3,
            return_dict_in_generate=True,
            **kwargs,
        )
    return out, clock.now - start


# a pass over 1-3 tokens costs 10, over 4 tokens 30 (the prompt's prefill too)
STEEP = [10.0, 10.0, 10.0, 30.0]


def test_a_call_learns_to_draft_what_this_machine_verifies_cheaply(target, target_copy, clock):
    out, _ = _call(target, target_copy, clock, STEEP)
    stats = out.metasd
    assert torch.equal(out.sequences, greedy(target, PROMPT, 40))
    assert stats.draft_length == "measured"
    # the first call tries the cap (the prefill round, then a measured one), guesses shorter lengths from it and
    # measures them, then settles on 2 tokens: a pass over 3 costs 10, over 4 costs 30
    assert stats.drafted[:2] == [3, 3] and set(stats.drafted[-7:-1]) == {2}, stats.drafted
    assert stats.verification_costs[4] == pytest.approx(30.0) and stats.verification_costs[3] == pytest.approx(10.0)
    # a later call starts from what the first measured (per process and target)
    again, elapsed = _call(target, target_copy, clock, STEEP)
    assert torch.equal(again.sequences, out.sequences) and set(again.metasd.drafted[:-1]) == {2}
    fixed, fixed_elapsed = _call(target, target_copy, clock, STEEP, meta_draft_length="fixed")
    assert torch.equal(fixed.sequences, out.sequences)
    assert set(fixed.metasd.drafted[:-1]) == {3} and fixed.metasd.draft_length == "fixed"
    assert elapsed < 0.6 * fixed_elapsed  # the fake clock's time: 3 tokens for 10 beat 4 for 30


def test_a_flat_verification_cost_keeps_the_cap(target, target_copy, clock):
    out, _ = _call(target, target_copy, clock, [10.0, 10.0, 10.0, 10.5])
    assert torch.equal(out.sequences, greedy(target, PROMPT, 40))
    assert set(out.metasd.drafted[-6:]) == {3}, out.metasd.drafted  # after a few shorter tries
    again, _ = _call(target, target_copy, clock, [10.0, 10.0, 10.0, 10.5])
    assert set(again.metasd.drafted) == {3}


def test_sampling_with_measured_lengths_runs_and_respects_the_cap(target, target_copy, clock):
    torch.manual_seed(0)
    with clock.charging((target, STEEP), (target_copy, 0.1)):
        out = target.generate(
            PROMPT,
            do_sample=True,
            max_new_tokens=30,
            custom_generate=hf_metasd.generate,
            assistant_models=[target_copy],
            num_assistant_tokens=3,
            meta_skinny_gemm=False,
            return_dict_in_generate=True,
        )
    assert out.sequences.shape[1] == PROMPT.shape[1] + 30 and max(out.metasd.drafted) <= 3


def test_meta_draft_length_must_be_a_known_mode(target, target_copy):
    with pytest.raises(
        MetaSDConfigError,
        match=r"`meta_draft_length` must be one of \['measured', 'fixed'\], but is 'auto'\. Use \"measured\"",
    ):
        metasd_greedy(target, PROMPT, 5, assistant_models=[target_copy], meta_draft_length="auto")


def test_the_fix_the_message_suggests_works(target, target_copy):
    out = metasd_greedy(target, PROMPT, 5, assistant_models=[target_copy], meta_draft_length="fixed")
    assert torch.equal(out, greedy(target, PROMPT, 5))
