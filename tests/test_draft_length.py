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
from hf_metasd.draft_length import DraftLength, match_class

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


def test_match_class_is_the_ceiling_of_the_log2_of_the_match_length():
    assert [match_class(m) for m in range(1, 18)] == [0, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4, 5]
    assert match_class(0) == 0


def test_acceptance_per_match_class_is_shrunk_towards_the_arms_rates():
    lengths = DraftLength(num_arms=1, max_tokens=3, prior_weight=2.0)
    # class 0 (one-token matches): reached position 1 twice, accepted never; class 4: accepted all 3, twice
    lengths.observe_acceptance(0, 3, 0, 0)
    lengths.observe_acceptance(0, 3, 0, 0)
    lengths.observe_acceptance(0, 3, 3, 4)
    lengths.observe_acceptance(0, 3, 3, 4)
    # the arm: position 1 reached 4 times, accepted 2: (2 + 2 * 0.5) / 6 = 0.5; positions 2, 3 reached 2 of 2:
    # (2 + 2 * 0.5) / 4 = 0.75, then (2 + 2 * 0.75) / 4 = 0.875
    assert lengths.acceptance(0, 3) == pytest.approx([0.5, 0.75, 0.875])
    # class 0: (0 + 2 * 0.5) / 4 = 0.25, then never reached: the arm's 0.75 and 0.875
    assert lengths.acceptance(0, 3, 0) == pytest.approx([0.25, 0.75, 0.875])
    # class 4: (2 + 2 * 0.5) / 4, (2 + 2 * 0.75) / 4, (2 + 2 * 0.875) / 4
    assert lengths.acceptance(0, 3, 4) == pytest.approx([0.75, 0.875, 0.9375])
    assert lengths.acceptance(0, 3, 2) == pytest.approx([0.5, 0.75, 0.875])  # a class never seen: the arm's


def test_a_weak_match_drafts_less_than_a_strong_one():
    lengths = DraftLength(num_arms=1, max_tokens=3, prior_weight=2.0)
    for _ in range(20):
        lengths.observe_acceptance(0, 3, 0, 0)
        lengths.observe_acceptance(0, 3, 3, 4)
    # a pass over 2 tokens costs as much as a plain step, longer ones 20 % more per extra token
    _measured(lengths, {1: 1.0, 2: 1.0, 3: 1.2, 4: 1.4})
    # class 0: p1 = (0 + 2 * p_arm1) / 22 ~ 0.05, E(1) / v(2) = 1.05 beats E(3) / v(4) ~ 0.75; class 4: E(3) ~ 3.8
    assert lengths.choose(0, match_class=0) == 1
    assert lengths.choose(0, match_class=4) == 3
    assert lengths.choose(0) == 3  # the arm over both classes: p1 ~ 0.5, p2, p3 ~ 1: 2.5 / 1.4 beats 1.5 / 1.0


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


# ---------------------------------------------------------------------- match classes in whole calls
LINEAR = [10.0, 11.0, 12.0, 13.0]  # a pass over k tokens costs 9 + k, the prompt's prefill 13


def _corpus_call(target, drafter, clock, **kwargs):
    with clock.charging((target, LINEAR)):
        return metasd_greedy(
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


def test_a_corpus_drafter_is_cut_by_its_match_class(target, clock):
    from hf_metasd.drafters import CorpusDrafter

    answer = greedy(target, PROMPT, 40)[0, PROMPT.shape[1] :].tolist()
    g = torch.Generator().manual_seed(5)
    noise = torch.randint(1, 96, (60, 30), generator=g).tolist()  # short matches whose continuations are wrong
    drafter = CorpusDrafter.from_sequences([answer[20:], *noise], min_match_length=1, min_frequency=0.0)
    for _ in range(3):  # later calls start from the counts the earlier ones left (per process and target)
        out = _corpus_call(target, drafter, clock)
    stats = out.metasd
    assert torch.equal(out.sequences, greedy(target, PROMPT, 40))
    rounds = list(zip(stats.match_classes, stats.drafted, stats.accepted))
    assert all(c is not None for c, d, _ in rounds if d > 0), rounds
    weak = [d for c, d, _ in rounds if c == 0]
    strong = [d for c, d, _ in rounds if c is not None and c >= 3]
    assert weak and set(weak) == {1}, rounds  # one-token matches never paid: one token, the cheapest pass
    assert strong and max(strong) == 3, rounds  # long matches of the answer's second half: the cap
    assert "corpus drafts by match length in tokens" in stats.summary()
    fixed = _corpus_call(target, drafter, clock, meta_draft_length="fixed")
    assert torch.equal(fixed.sequences, out.sequences) and set(fixed.metasd.match_classes) == {None}


def test_a_cut_draft_keeps_its_logits_in_step_under_sampling(target, drafters, clock, monkeypatch):
    from hf_metasd.candidate_generator import MetaCandidateGenerator
    from hf_metasd.drafters import ModelDrafter

    class WeakMatches(ModelDrafter):  # a model drafter that says every proposal continues a one-token match
        scores_matches = True
        last_match_length = 1

    shapes = []  # (drafted tokens, logits rows) of every round: the candidate-generator contract pairs them
    get_candidates = MetaCandidateGenerator.get_candidates

    def recorded(self, input_ids, **kwargs):
        candidates, logits = get_candidates(self, input_ids, **kwargs)
        if logits is not None:
            shapes.append((candidates.shape[1] - input_ids.shape[1], logits.shape[1]))
        return candidates, logits

    monkeypatch.setattr(MetaCandidateGenerator, "get_candidates", recorded)
    torch.manual_seed(0)
    with clock.charging((target, LINEAR), (drafters[0], 0.1)):
        out = target.generate(
            PROMPT,
            do_sample=True,
            max_new_tokens=40,
            custom_generate=hf_metasd.generate,
            assistant_models=[WeakMatches(drafters[0])],
            meta_policy="fixed",
            meta_policy_kwargs={"arm": 0},
            num_assistant_tokens=3,
            meta_skinny_gemm=False,
            return_dict_in_generate=True,
        )
    assert out.sequences.shape[1] == PROMPT.shape[1] + 40
    assert 1 in out.metasd.drafted, out.metasd.drafted  # weak matches were cut to one token
    assert shapes and all(n == rows for n, rows in shapes), shapes
