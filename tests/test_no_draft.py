"""The no-draft arm and the cost-aware `speed` reward, with an injected clock: MetaSD is never slower than the target
alone, and still picks a drafter that pays."""

from __future__ import annotations

import pytest
import torch
from conftest import greedy, metasd_greedy, prompts, sharpen, tiny_llama

import hf_metasd.costs
import hf_metasd.stats
from hf_metasd import MetaSDConfigError
from hf_metasd.costs import CostModel

PROMPT = prompts(1, seed=5)[0]


def _run(target, pool, fake_clock, costs, new_tokens=60, **kwargs):
    with fake_clock.charging(*costs):
        return metasd_greedy(
            target,
            PROMPT,
            new_tokens,
            assistant_models=pool,
            meta_skinny_gemm=False,
            return_dict_in_generate=True,
            **kwargs,
        )


@pytest.fixture
def fresh_costs(monkeypatch):
    """No smoothed costs remembered from earlier calls (each test measures its own)."""
    monkeypatch.setattr(hf_metasd.costs, "_CACHE", type(hf_metasd.costs._CACHE)())


@pytest.mark.parametrize("draft_length", ["measured", "fixed"])
def test_a_pool_of_useless_drafters_converges_to_plain_decoding(target, fake_clock, fresh_costs, draft_length):
    useless = [sharpen(tiny_llama(s, layers=1)) for s in (21, 22, 23)]
    # a target step costs 10, a drafter step 4: drafting 3 tokens that are always rejected costs 22 per token (1 token,
    # the length a measured call settles on for drafters that are never accepted: 14)
    out = _run(
        target,
        useless,
        fake_clock,
        [(target, 10.0)] + [(d, 4.0) for d in useless],
        new_tokens=200,
        meta_policy="ucb",
        meta_policy_kwargs={"beta": 0.05},
        meta_draft_length=draft_length,
    )
    stats = out.metasd
    assert torch.equal(out.sequences, greedy(target, PROMPT, 200))
    assert stats.drafter_names[-1] == "no_draft"
    no_draft = stats.drafter_names.index("no_draft")
    assert stats.arms[1] == no_draft  # the calibration round: a plain step measures the unit of the reward
    # cheaper pulls (measured lengths) leave the useless arms closer to the no-draft arm: pulled a little more often
    assert sum(a == no_draft for a in stats.arms) / stats.rounds > (0.95 if draft_length == "fixed" else 0.9), (
        stats.pulls
    )
    # in fake time, within 5 % of decoding 200 tokens alone (10 per token)
    assert fake_clock.now <= 200 * 10.0 / 0.95


def test_a_drafter_that_pays_wins_over_the_no_draft_arm(target, target_copy, fake_clock, fresh_costs):
    useless = sharpen(tiny_llama(24, layers=1))
    out = _run(target, [useless, target_copy], fake_clock, [(target, 10.0), (useless, 1.0), (target_copy, 1.0)])
    stats = out.metasd
    assert torch.equal(out.sequences, greedy(target, PROMPT, 60))
    assert stats.pulls[1] > stats.pulls[0] and stats.pulls[1] > stats.pulls[2], stats.pulls
    assert fake_clock.now < 0.6 * 60 * 10.0  # the exact copy makes it far faster than the target alone


def test_speed_rewards_are_exact_under_the_fake_clock(target, target_copy, fake_clock, fresh_costs):
    fixed_length = {"meta_draft_length": "fixed"}  # measured lengths would mix rounds of other lengths into the costs
    out = _run(
        target,
        [target_copy],
        fake_clock,
        [(target, 10.0), (target_copy, 2.0)],
        new_tokens=20,
        meta_policy="fixed",
        **fixed_length,
    )
    # fixed ignores rewards and never asks for the calibration round: the plain-step cost stays unknown
    assert all(r is None for r in out.metasd.rewards) and out.metasd.drafter_names[1] not in out.metasd.arms
    out = _run(target, [target_copy], fake_clock, [(target, 10.0), (target_copy, 2.0)], new_tokens=40, **fixed_length)
    stats = out.metasd
    # a copy round: catch-up 1 forward + 2 drafting forwards (2 each) + verify 10 = 16 units for 4 tokens; plain: 10
    copy_rounds = [r for r, (a, d) in enumerate(zip(stats.arms, stats.drafted)) if a == 0 and d == 3]
    late = [stats.rewards[r] for r in copy_rounds[3:] if stats.rewards[r] is not None]
    assert late and all(v == pytest.approx(4 / 4 * 10 / 16, rel=1e-6) for v in late)
    plain = [stats.rewards[r] for r, a in enumerate(stats.arms) if a == 1 and stats.rewards[r] is not None]
    assert plain and all(v == pytest.approx(1 / 4) for v in plain)


def test_no_draft_needs_a_cost_aware_reward(target, drafters):
    with pytest.raises(
        MetaSDConfigError, match=r"`meta_no_draft` needs a cost-aware reward .* but the reward is 'bd'"
    ):
        metasd_greedy(target, PROMPT, 4, assistant_models=drafters, meta_reward="bd", meta_no_draft=True)
    out = metasd_greedy(target, PROMPT, 4, assistant_models=drafters, meta_reward="bd", return_dict_in_generate=True)
    assert "no_draft" not in out.metasd.drafter_names
    out = metasd_greedy(
        target, PROMPT, 4, assistant_models=drafters, meta_no_draft=False, return_dict_in_generate=True
    )
    assert "no_draft" not in out.metasd.drafter_names


def test_cost_model_smooths_and_remembers_across_calls():
    model = torch.nn.Linear(2, 2)
    costs = CostModel(["a", "no_draft"], smoothing=0.5, target=model)
    assert costs.estimate(0) is None
    costs.observe(0, 2.0)
    costs.observe(0, 4.0)
    assert costs.estimate(0) == pytest.approx(3.0)
    later = CostModel(["a", "no_draft"], smoothing=0.5, target=model)
    assert later.estimate(0) == pytest.approx(3.0) and later.estimate(1) is None
    with pytest.raises(ValueError, match=r"`smoothing` must be a float in \(0, 1\], but is 0"):
        CostModel(["a"], smoothing=0)
