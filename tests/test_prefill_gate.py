"""The prefill gate: a drafter whose predicted prompt prefill costs more than it can save in the call is skipped."""

from __future__ import annotations

import pytest
import torch
from conftest import greedy, metasd_greedy
from transformers import GenerationConfig

import hf_metasd
from hf_metasd import MetaSDConfigError
from hf_metasd.candidate_generator import MetaCandidateGenerator
from hf_metasd.costs import MIN_PREFILLS, PrefillCosts
from hf_metasd.drafters import ModelDrafter, PromptLookupDrafter
from hf_metasd.policies import get_policy

PROMPT = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])


def test_prefill_costs_predict_by_the_fastest_rate_once_two_are_measured_and_persist_per_target():
    owner = torch.nn.Linear(1, 1)
    first = PrefillCosts(["big", "small"], target=owner)
    first.observe(0, seconds=7.0, tokens=100)  # a first prefill, cold: 70 ms per token
    assert MIN_PREFILLS == 2 and first.estimate(0, tokens=100) is None  # one measured prefill is not enough
    first.observe(0, seconds=4.5, tokens=300)  # 15 ms per token: the fastest so far
    first.observe(0, seconds=8.0, tokens=400)  # 20 ms per token: slower, ignored
    first.observe(1, seconds=1.0, tokens=0)  # nothing ingested: ignored
    assert first.estimate(0, tokens=1000) == pytest.approx(15.0)
    assert first.estimate(1, tokens=1000) is None
    assert PrefillCosts(["big", "small"], target=owner).estimate(0, tokens=200) == pytest.approx(3.0)  # a later call
    assert PrefillCosts(["big", "small"], target=torch.nn.Linear(1, 1)).estimate(0, tokens=200) is None


def test_a_drafters_one_time_set_up_is_left_out_of_its_measured_prefill(target_copy):
    clock = [0.0]

    class SetsUpOnce(ModelDrafter):
        def catch_up(self, input_ids, **kwargs):
            clock[0] += 1.0  # the catch-up takes 1 s, of which 0.75 s is set-up
            self.setup_seconds += 0.75
            return super().catch_up(input_ids, **kwargs)

    gen = MetaCandidateGenerator(
        [SetsUpOnce(target_copy, name="big")],
        get_policy("fixed", arm=0),
        num_assistant_tokens=2,
        generation_config=GenerationConfig(max_length=40),
        clock=lambda: clock[0],
    )
    gen.get_candidates(PROMPT)
    gen.prefills.observe(0, seconds=1.0, tokens=8)  # a second, slower prefill: 125 ms per token
    assert gen.prefills.estimate(0, tokens=8) == pytest.approx(0.25)  # 0.25 s over 8 tokens, the set-up left out


def _generator(target_copy, *, max_length=40, prefill_gate=True, policy="epsilon_greedy", reward="speed"):
    drafters = [ModelDrafter(target_copy, name="big"), PromptLookupDrafter(name="lookup")]
    kwargs = {"epsilon": 0.0} if policy == "epsilon_greedy" else {}
    return MetaCandidateGenerator(
        drafters,
        get_policy(policy, **kwargs),
        reward=reward,
        num_assistant_tokens=3,
        generation_config=GenerationConfig(max_length=max_length),
        prefill_gate=prefill_gate,
    )


@pytest.mark.parametrize("seconds, skipped", [(1.0, False), (1.2, True)])
def test_the_gate_compares_the_predicted_prefill_with_the_hand_computed_gain(target_copy, seconds, skipped):
    gen = _generator(target_copy)
    gen.policy.set_prior([0.5, 0.3, 0.25], weight=2)  # big, lookup, no_draft
    gen.costs.observe(gen.no_draft_arm, 0.1)  # a plain step: 0.1 s
    gen._seen.add(1)  # the lookup arm already drafted in this call
    for _ in range(MIN_PREFILLS):
        gen.prefills.observe(0, seconds=seconds, tokens=8)  # predicted prefill of the 8-token prompt: `seconds`
    # G = R * c_plain / (N + 1) * (1 / mu_b - 1 / mu_a) = 32 * 0.1 / 4 * (1 / 0.3 - 1 / 0.5) = 1.0667 s
    assert gen._prefill_outweighs_gain(0, PROMPT) is skipped


@pytest.mark.parametrize("seconds, skipped", [(0.1, False), (0.15, True)])
def test_a_prefill_no_dearer_than_a_plain_step_is_left_to_the_policy(target_copy, seconds, skipped):
    gen = _generator(target_copy)
    gen.policy.set_prior([0.2, 0.9, 0.25], weight=2)  # the model drafter is worse than the lookup arm in hand
    gen.costs.observe(gen.no_draft_arm, 0.1)
    gen._seen.add(1)
    # one plain step (0.1 s): exploring it costs no more than a round; 0.15 s: more than a step, and no gain at all
    for _ in range(MIN_PREFILLS):
        gen.prefills.observe(0, seconds=seconds, tokens=8)
    assert gen._prefill_outweighs_gain(0, PROMPT) is skipped


def test_the_gate_waits_for_what_it_needs_to_know(target_copy):
    gen = _generator(target_copy)
    gen.costs.observe(gen.no_draft_arm, 0.1)
    for _ in range(MIN_PREFILLS):
        gen.prefills.observe(0, seconds=100.0, tokens=8)
    assert not gen._prefill_outweighs_gain(0, PROMPT)  # no reward or prior of the arm yet
    gen.policy.set_prior([0.5, None, None], weight=2)
    assert gen._prefill_outweighs_gain(0, PROMPT)  # against the target alone: mu_b = 1 / (N + 1)
    unmeasured = _generator(target_copy)
    unmeasured.policy.set_prior([0.5, None, None], weight=2)
    unmeasured.costs.observe(unmeasured.no_draft_arm, 0.1)
    assert not unmeasured._prefill_outweighs_gain(0, PROMPT)  # no prefill of the arm measured yet
    unbounded = _generator(target_copy, max_length=None)
    unbounded.policy.set_prior([0.5, None, None], weight=2)
    unbounded.costs.observe(unbounded.no_draft_arm, 0.1)
    for _ in range(MIN_PREFILLS):
        unbounded.prefills.observe(0, seconds=100.0, tokens=8)
    assert not unbounded._prefill_outweighs_gain(0, PROMPT)  # no length budget: no remaining tokens to weigh


@pytest.mark.parametrize(
    "kwargs", [{"prefill_gate": False}, {"policy": "round_robin"}, {"reward": "be"}], ids=["off", "no-rewards", "be"]
)
def test_the_gate_acts_only_when_asked_under_the_speed_reward_with_a_policy_that_learns(target_copy, kwargs):
    assert _generator(target_copy).prefill_gate
    assert not _generator(target_copy, **kwargs).prefill_gate


@pytest.mark.parametrize("gate", [True, False])
def test_a_skipped_prefill_hands_the_round_to_the_fallback_losslessly(target, target_copy, monkeypatch, gate):
    # every prefill is predicted to take a day: with the gate on, the model drafter never reads the prompt
    monkeypatch.setattr(PrefillCosts, "estimate", lambda self, arm, tokens: 86400.0)
    common = {"assistant_models": [target_copy, PromptLookupDrafter(name="lookup")], "meta_policy": "ucb"}
    metasd_greedy(target, PROMPT, 4, **common)  # measures a plain step's cost for this target (calibration)
    out = metasd_greedy(
        target,
        PROMPT,
        16,
        **common,
        meta_priors={"LlamaForCausalLM": 0.9},
        meta_prefill_gate=gate,
        return_dict_in_generate=True,
    )
    stats = out.metasd
    assert torch.equal(out.sequences, greedy(target, PROMPT, 16))
    if gate:
        assert stats.prefill_skips > 0 and 0 not in stats.arms
        assert sum(0 in arms for arms in stats.abstained) == stats.prefill_skips  # each skip is an abstention
    else:
        assert stats.prefill_skips == 0 and 0 in stats.arms


def test_a_gate_setting_that_is_not_a_bool_is_refused_before_any_compute(target, target_copy):
    with pytest.raises(
        MetaSDConfigError, match=r"^`meta_prefill_gate` must be True or False, but is 'yes'\. Pass a bool\.$"
    ):
        metasd_greedy(target, PROMPT, 4, assistant_models=[target_copy], meta_prefill_gate="yes")
    assert hf_metasd.generation.DEFAULTS["meta_prefill_gate"] is False  # off by default: see docs/concepts.md
