"""BE and BD against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from hf_metasd.rewards import RoundFeedback, block_divergence, block_efficiency, get_reward


def _log(rows):
    return torch.log(torch.tensor(rows, dtype=torch.float32))


def test_block_efficiency_values():
    assert block_efficiency(0, 5) == 0.0
    assert block_efficiency(5, 5) == 1.0
    assert block_efficiency(2, 4) == 0.5


@pytest.mark.parametrize(
    ("acc", "n", "match"),
    [(1, 0, "`num_drafted` must be >= 1"), (4, 3, r"`num_accepted` must be in \[0, 3\], but is 4")],
)
def test_block_efficiency_rejects_impossible_counts(acc, n, match):
    with pytest.raises(ValueError, match=match):
        block_efficiency(acc, n)


def test_block_divergence_hand_computed():
    p = _log([[0.5, 0.25, 0.25], [0.1, 0.6, 0.3]])
    q = _log([[0.25, 0.5, 0.25], [0.1, 0.3, 0.6]])
    # TV row 0 = 0.5 * (0.25 + 0.25 + 0) = 0.25; row 1 = 0.5 * (0 + 0.3 + 0.3) = 0.3
    assert block_divergence(p, torch.tensor([1, 2]), q) == pytest.approx(((1 - 0.25) + (1 - 0.3)) / 2, abs=1e-6)


def test_block_divergence_counts_positions_after_the_first_rejection():
    p = _log([[0.9, 0.05, 0.05], [0.05, 0.05, 0.9]])
    tokens = torch.tensor([1, 2])  # position 0 would be rejected under greedy; position 1 still counts
    assert block_divergence(p, tokens) == pytest.approx((0.05 + 0.9) / 2, abs=1e-6)


def test_one_hot_drafter_equals_explicit_one_hot_logits():
    p = _log([[0.2, 0.7, 0.1], [0.3, 0.3, 0.4]])
    tokens = torch.tensor([1, 2])
    one_hot = torch.full((2, 3), -math.inf)
    one_hot[0, 1] = one_hot[1, 2] = 0.0
    assert block_divergence(p, tokens) == pytest.approx(block_divergence(p, tokens, one_hot), abs=1e-6)
    assert block_divergence(p, tokens) == pytest.approx((0.7 + 0.4) / 2, abs=1e-6)


def test_block_divergence_is_one_for_identical_and_dense_otherwise():
    logits = torch.randn(4, 11)
    assert block_divergence(logits, torch.zeros(4, dtype=torch.long), logits.clone()) == pytest.approx(1.0)
    assert 0.0 < block_divergence(logits, torch.zeros(4, dtype=torch.long), torch.randn(4, 11)) < 1.0


def test_block_divergence_shape_errors():
    with pytest.raises(
        ValueError, match=r"`draft_logits` must have the shape of `target_logits` \(2, 3\), but has \(2, 4\)"
    ):
        block_divergence(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"`target_logits` must have shape \(N, V\)"):
        block_divergence(torch.zeros(3), torch.zeros(3, dtype=torch.long))


def test_get_reward_names_and_callables():
    fb = RoundFeedback(0, torch.tensor([1, 0]), _log([[0.5, 0.5, 1e-9], [0.5, 0.5, 1e-9]]), None, num_accepted=1)
    assert get_reward("be")(fb) == 0.5
    assert get_reward("bd")(fb) == pytest.approx(0.5, abs=1e-6)
    assert get_reward(lambda f: 0.25)(fb) == 0.25


def test_cost_aware_hand_computed():
    from hf_metasd.rewards import cost_aware

    assert cost_aware(5, 5, draft_seconds=0.0, verify_seconds=1.0) == 1.0  # a free, perfect drafter
    assert cost_aware(0, 4, draft_seconds=1.0, verify_seconds=1.0) == pytest.approx(0.1)  # 1/5 * 1/2
    with pytest.raises(ValueError, match=r"`verify_seconds` must be > 0 and `draft_seconds` >= 0, but are 0.0 and"):
        cost_aware(1, 2, draft_seconds=0.1, verify_seconds=0.0)


def test_acceptance_rates_per_mode_and_the_expected_accepted_length():
    import math

    from hf_metasd.rewards import acceptance_rates, expected_accepted_length

    p = torch.log(torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.1, 0.1, 0.8]]))
    tokens = torch.tensor([0, 2, 2])
    greedy_rates = acceptance_rates(p, tokens)
    assert greedy_rates.tolist() == [1.0, 0.0, 1.0]  # argmax or not
    assert expected_accepted_length(greedy_rates) == 1.0  # stops at the first rejection: exactly BE's count
    sampled = acceptance_rates(p, tokens, do_sample=True)  # no drafter logits: p_j(x_j)
    assert sampled.tolist() == pytest.approx([0.6, 0.3, 0.8])
    assert expected_accepted_length(sampled) == pytest.approx(0.6 + 0.6 * 0.3 + 0.6 * 0.3 * 0.8)
    q = torch.log(torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.5, 0.0], [0.1, 0.1, 0.8]]).clamp_min(1e-30))
    tv = acceptance_rates(p, tokens, q, do_sample=True)  # 1 - TV
    assert tv.tolist() == pytest.approx([1.0, 0.7, 1.0], abs=1e-6)
    assert not math.isnan(expected_accepted_length(tv))


def test_speed_reward_compares_drafters_with_plain_decoding():
    from hf_metasd.rewards import RoundFeedback, get_reward, speed

    assert speed(3.0, 3, arm_seconds=0.2, plain_seconds=0.1) == pytest.approx(0.5)  # 4 tokens in 2 steps: 2x
    assert speed(0.0, 3, arm_seconds=0.1, plain_seconds=0.1) == pytest.approx(0.25)  # the no-draft arm
    assert speed(3.0, 3, arm_seconds=0.05, plain_seconds=0.1) == 1.0  # clipped: timing noise
    with pytest.raises(ValueError, match=r"`arm_seconds` and `plain_seconds` must be > 0, but are 0 and 0.1"):
        speed(1.0, 3, arm_seconds=0, plain_seconds=0.1)
    p = torch.log(torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]]))
    feedback = RoundFeedback(
        0, torch.tensor([0, 1, 0]), p, None, 2, num_assistant_tokens=3, arm_seconds=0.15, plain_seconds=0.1
    )
    assert get_reward("speed")(feedback) == pytest.approx((2 + 1) / 4 * 0.1 / 0.15)
    assert get_reward("eal")(feedback) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match=r"the `speed` reward needs `arm_seconds` and `plain_seconds`"):
        get_reward("speed")(RoundFeedback(0, torch.tensor([0]), p[:1], None, 1))


def test_rewards_register_once():
    from hf_metasd.rewards import REWARDS, register_reward

    with pytest.raises(
        ValueError, match=r"`name` must be unused, but 'bd' is already a reward\. Choose another name\."
    ):
        register_reward("bd", lambda feedback: 0.0)
    register_reward("always_half", lambda feedback: 0.5)
    assert REWARDS["always_half"](None) == 0.5
    del REWARDS["always_half"]
