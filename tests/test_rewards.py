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
