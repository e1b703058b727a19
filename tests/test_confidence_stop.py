"""The confidence stop: a model drafter stops drafting once the product of its drafted tokens' probabilities falls
below its measured cost per drafting step over a plain target step's. Hand-computed stops on a tiny model, the
threshold under an injected clock, losslessness, and the messages."""

from __future__ import annotations

import pytest
import torch
from conftest import greedy, metasd_greedy, prompts, sharpen, tiny_llama

import hf_metasd.costs
import hf_metasd.stats
from hf_metasd import MetaSDConfigError
from hf_metasd.drafters import ModelDrafter, PromptLookupDrafter

PROMPT = prompts(1, seed=7)[0]


@pytest.fixture
def clock(fake_clock, monkeypatch):
    monkeypatch.setattr(hf_metasd.costs, "_CACHE", type(hf_metasd.costs._CACHE)())  # no costs from earlier tests
    return fake_clock


def _cumulative_probabilities(logits: torch.Tensor, tokens: torch.Tensor) -> list[float]:
    """``P_k`` for k = 1..n: the running product of each drafted token's probability under its logits ``(1, n, V)``."""
    probs = torch.softmax(logits[0], dim=-1).gather(-1, tokens[0, :, None])[:, 0]
    return torch.cumprod(probs.double(), dim=0).tolist()


@pytest.mark.parametrize("stop_after", [1, 2, 3])
def test_drafting_stops_after_the_first_token_whose_running_probability_is_below_the_threshold(stop_after):
    model = sharpen(tiny_llama(31, layers=1), 3.0)
    full = ModelDrafter(model, name="d")
    tokens, logits = full.draft(PROMPT, 5)
    cumulative = _cumulative_probabilities(logits, tokens)
    assert all(a > b for a, b in zip(cumulative, cumulative[1:]))  # strictly falling: each threshold is exact
    # a threshold between P_k and P_{k+1}... is met up to token k and missed by token k (k = stop_after) when it
    # sits just above P_k; drafting then stops with k tokens
    threshold = cumulative[stop_after - 1] * 1.0000001
    stopped, stopped_logits = ModelDrafter(model, name="d").draft(PROMPT, 5, min_confidence=threshold)
    assert stopped.tolist() == tokens[:, :stop_after].tolist()
    assert torch.equal(stopped_logits, logits[:, :stop_after])
    # just below P_k: token k + 1 is drafted too
    more, _ = ModelDrafter(model, name="d").draft(PROMPT, 5, min_confidence=cumulative[stop_after - 1] * 0.9999999)
    assert more.tolist() == tokens[:, : stop_after + 1].tolist()


def test_thresholds_zero_and_above_one_draft_everything_and_one_token():
    model = tiny_llama(32, layers=1)
    tokens, _ = ModelDrafter(model).draft(PROMPT, 4)
    assert ModelDrafter(model).draft(PROMPT, 4, min_confidence=0.0)[0].tolist() == tokens.tolist()
    assert ModelDrafter(model).draft(PROMPT, 4, min_confidence=1.5)[0].tolist() == tokens[:, :1].tolist()


def test_a_stopped_draft_leaves_the_cache_ready_for_the_next_round():
    model = sharpen(tiny_llama(33, layers=1), 3.0)
    drafter = ModelDrafter(model)
    first, _ = drafter.draft(PROMPT, 4, min_confidence=1.5)  # one token, no forward on it
    sequence = torch.cat([PROMPT, first, torch.tensor([[5, 6]])], dim=-1)
    drafter.catch_up(sequence)
    again, again_logits = drafter.draft(sequence, 3)
    fresh, fresh_logits = ModelDrafter(model).draft(sequence, 3)
    assert again.tolist() == fresh.tolist()
    torch.testing.assert_close(again_logits, fresh_logits)


def test_min_confidence_must_be_a_non_negative_float():
    with pytest.raises(
        ValueError, match=r"`min_confidence` must be a float in \[0, inf\), but is -0.1\. Pass the cost"
    ):
        ModelDrafter(tiny_llama(34, layers=1)).draft(PROMPT, 2, min_confidence=-0.1)


def _run(target, pool, clock, charges, new_tokens=40, **kwargs):
    with clock.charging(*charges):
        return metasd_greedy(
            target,
            PROMPT,
            new_tokens,
            assistant_models=pool,
            meta_skinny_gemm=False,
            num_assistant_tokens=3,
            return_dict_in_generate=True,
            **kwargs,
        )


def test_the_threshold_is_the_measured_drafting_step_over_the_measured_plain_step(target, clock):
    drafter = tiny_llama(35, layers=1)  # near-uniform over 96 tokens: P_1 is about 0.01
    charges = [(target, 10.0), (drafter, 2.0)]
    out = _run(target, [drafter], clock, charges, meta_policy="round_robin", meta_confidence_stop=True)
    stats = out.metasd
    assert torch.equal(out.sequences, greedy(target, PROMPT, 40))
    rounds = [r for r, arm in enumerate(stats.arms) if arm == 0]
    thresholds = [stats.min_confidence[r] for r in rounds]
    # until its first full draft (3 tokens: 2 forwards of 2 units) and a plain step (10 units) are measured, none
    assert thresholds[0] is None and stats.drafted[rounds[0]] == 3
    known = [r for r in rounds if stats.min_confidence[r] is not None]
    assert known and all(stats.min_confidence[r] == pytest.approx(2.0 / 10.0) for r in known)
    # a near-uniform drafter is never 20 % sure: one token per round once the threshold is known
    assert all(stats.drafted[r] == 1 for r in known)
    assert all(m is None for r, m in enumerate(stats.min_confidence) if stats.arms[r] != 0)  # no-draft rounds


def test_a_second_call_stops_from_its_first_round(target, clock):
    drafter = tiny_llama(36, layers=1)
    charges = [(target, 10.0), (drafter, 2.0)]
    _run(target, [drafter], clock, charges, meta_policy="round_robin", meta_confidence_stop=True)
    stats = _run(target, [drafter], clock, charges, meta_policy="round_robin", meta_confidence_stop=True).metasd
    assert stats.arms[0] == 0 and stats.min_confidence[0] == pytest.approx(0.2) and stats.drafted[0] == 1


@pytest.mark.parametrize("setting", [True, False])
def test_lossless_with_every_setting(target, drafters, target_copy, setting):
    pool = [*drafters, target_copy, PromptLookupDrafter()]
    for prompt in prompts(3, seed=11):
        out = metasd_greedy(
            target, prompt, 30, assistant_models=pool, meta_confidence_stop=setting, return_dict_in_generate=True
        )
        assert torch.equal(out.sequences, greedy(target, prompt, 30))
        if setting is False:
            assert all(m is None for m in out.metasd.min_confidence)


@pytest.mark.parametrize("setting", [{}, {"meta_confidence_stop": False}], ids=["default", "False"])
def test_off_by_default_drafts_the_full_length(target, clock, setting):
    drafter = tiny_llama(37, layers=1)
    charges = [(target, 10.0), (drafter, 2.0)]
    _run(target, [drafter], clock, charges, meta_policy="round_robin", meta_confidence_stop=True)  # costs known
    # (the draft length fixed: measured lengths would shorten an untrained drafter's drafts for another reason)
    stats = _run(
        target, [drafter], clock, charges, meta_policy="round_robin", meta_draft_length="fixed", **setting
    ).metasd
    assert all(m is None for m in stats.min_confidence)
    assert all(d == 3 for d, a in zip(stats.drafted[:-2], stats.arms) if a == 0)


def test_needs_the_no_draft_arm(target, drafters):
    with pytest.raises(
        MetaSDConfigError,
        match=r"`meta_confidence_stop` needs the no-draft arm \(it compares a drafting step with a plain step\), "
        r"but this call has none \(reward 'bd'\)\. Use `meta_reward='speed'`, or `meta_confidence_stop=False`\.",
    ):
        metasd_greedy(target, PROMPT, 4, assistant_models=drafters, meta_reward="bd", meta_confidence_stop=True)
    out = metasd_greedy(target, PROMPT, 4, assistant_models=drafters, meta_reward="bd", return_dict_in_generate=True)
    assert all(m is None for m in out.metasd.min_confidence)


def test_setting_must_be_a_bool_or_none(target, drafters):
    with pytest.raises(
        MetaSDConfigError, match=r"`meta_confidence_stop` must be True or False, but is 'yes'\. Pass a bool\."
    ):
        metasd_greedy(target, PROMPT, 4, assistant_models=drafters, meta_confidence_stop="yes")


def test_warm_start_window_stays_aligned_when_round_one_drafts_fewer_tokens(target, drafters, monkeypatch):
    """The target's first pass keeps its logits on the prompt window plus what was actually drafted (one token
    under a stop above 1, not `num_assistant_tokens`)."""
    from hf_metasd import block_divergence
    from hf_metasd.candidate_generator import MetaCandidateGenerator

    monkeypatch.setattr(MetaCandidateGenerator, "_min_confidence", lambda self, arm: 1.5)
    window = 3
    out = metasd_greedy(
        target,
        PROMPT,
        4,
        assistant_models=[drafters[0]],
        meta_warm_start=window,
        num_assistant_tokens=3,
        return_dict_in_generate=True,
    )
    assert out.metasd.drafted[0] == 1
    with torch.no_grad():
        p = target(PROMPT).logits[0, -window - 1 : -1]
        q = drafters[0](PROMPT).logits[0, -window - 1 : -1]
    assert out.metasd.warm_start_rewards[0] == pytest.approx(block_divergence(p, PROMPT[0, -window:], q), abs=1e-5)
