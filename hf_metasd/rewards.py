r"""Rewards: the alignment feedback a policy learns from, computed from what verification already produced.

The built-in rewards lie in ``[0, 1]``:

* **BE** (block efficiency): :math:`n_{acc} / N`, accepted drafted tokens over drafted tokens.
* **cost** (cost-aware): tokens gained per second of round wall time, normalised by the best a free drafter could
  do, :math:`\frac{n_{acc} + 1}{N + 1} \cdot \frac{T_{verify}}{T_{draft} + T_{verify}}`, so a slower drafter with
  higher acceptance competes fairly with a faster one.
* **BD** (block divergence): :math:`\frac1N \sum_{j=1}^{N} \bigl(1 - \mathrm{TV}(p_j, q_j)\bigr)` with
  :math:`\mathrm{TV}(p, q) = \tfrac12 \lVert p - q \rVert_1`, over **all** drafted positions :math:`j` (after the first
  rejection too: the target's logits there come from the same verification pass, conditioned on the drafted prefix).
  :math:`p_j` and :math:`q_j` are the softmax of the target's and the drafter's *processed* logits. A drafter without
  logits (prompt lookup) is one-hot, :math:`q_j = \delta_{x_j}`, so its term is :math:`p_j(x_j)`.

A reward is any callable ``reward(feedback: RoundFeedback) -> float``; `get_reward` resolves names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .errors import UnknownRewardError

__all__ = [
    "REWARDS",
    "RoundFeedback",
    "block_divergence",
    "block_efficiency",
    "cost_aware",
    "get_reward",
    "reward_name",
]


@dataclass
class RoundFeedback:
    """What one round tells the policy. Tensors are for batch size 1, batch dimension removed.

    Attributes:
        arm: index of the drafter that drafted.
        draft_tokens: ``(N,)`` drafted token ids.
        target_logits: ``(N, V)`` target's processed logits at the drafted positions (position ``j`` predicts
            ``draft_tokens[j]``).
        draft_logits: ``(N, V)`` drafter's processed logits at the same positions, or ``None`` (deterministic drafter).
        num_accepted: drafted tokens the target accepted (``0 <= num_accepted <= N``).
        seconds: wall time of the round (drafting and verification), for cost-aware rewards.
        draft_seconds: the part of `seconds` spent selecting, catching up and drafting.
    """

    arm: int
    draft_tokens: torch.Tensor
    target_logits: torch.Tensor
    draft_logits: torch.Tensor | None
    num_accepted: int
    seconds: float = 0.0
    draft_seconds: float = 0.0

    @property
    def num_drafted(self) -> int:
        """N, the number of drafted tokens."""
        return int(self.draft_tokens.shape[-1])


def block_efficiency(num_accepted: int, num_drafted: int) -> float:
    """BE = accepted / drafted.

    Example:
        >>> block_efficiency(3, 5)
        0.6
    """
    if num_drafted < 1:
        raise ValueError(f"`num_drafted` must be >= 1, but is {num_drafted}. BE is undefined for an empty draft.")
    if not 0 <= num_accepted <= num_drafted:
        raise ValueError(
            f"`num_accepted` must be in [0, {num_drafted}], but is {num_accepted}. Pass the verified match count."
        )
    return num_accepted / num_drafted


def block_divergence(
    target_logits: torch.Tensor, draft_tokens: torch.Tensor, draft_logits: torch.Tensor | None = None
) -> float:
    """BD = mean over drafted positions of ``1 - TV(softmax(target_logits), softmax(draft_logits))``.

    Args:
        target_logits: ``(N, V)`` processed target logits at the drafted positions.
        draft_tokens: ``(N,)`` drafted tokens (used when `draft_logits` is ``None``: one-hot drafter).
        draft_logits: ``(N, V)`` processed drafter logits, or ``None``.

    Example:
        >>> import torch
        >>> p = torch.log(torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.7, 0.1]]))
        >>> q = torch.log(torch.tensor([[1.0, 0.0, 0.0], [0.2, 0.6, 0.2]]))
        >>> round(block_divergence(p, torch.tensor([0, 1]), q), 6)   # (1 - 0.5 + 1 - 0.1) / 2
        0.7
        >>> round(block_divergence(p, torch.tensor([0, 1])), 6)      # one-hot: (0.5 + 0.7) / 2
        0.6
    """
    if target_logits.dim() != 2:
        raise ValueError(f"`target_logits` must have shape (N, V), but has shape {tuple(target_logits.shape)}.")
    num = target_logits.shape[0]
    if num < 1:
        raise ValueError(
            "`target_logits` must cover at least one drafted position, but covers 0. Draft a token first."
        )
    p = torch.softmax(target_logits.float(), dim=-1)
    if draft_logits is None:
        terms = p.gather(-1, draft_tokens.reshape(num, 1).to(p.device)).squeeze(-1)
    else:
        if draft_logits.shape != target_logits.shape:
            raise ValueError(
                f"`draft_logits` must have the shape of `target_logits` {tuple(target_logits.shape)}, but has "
                f"{tuple(draft_logits.shape)}. The drafter's vocabulary must match the target's."
            )
        q = torch.softmax(draft_logits.float().to(p.device), dim=-1)
        terms = 1.0 - 0.5 * (p - q).abs().sum(-1)
    return float(terms.clamp(0.0, 1.0).mean())


def cost_aware(num_accepted: int, num_drafted: int, draft_seconds: float, verify_seconds: float) -> float:
    """Cost-aware reward: tokens per second of the round over the best possible, ``(N + 1)`` tokens per verification.

    Example:
        >>> cost_aware(3, 5, draft_seconds=0.05, verify_seconds=0.15)  # 4/6 of the tokens, 3/4 of the time verifying
        0.5
    """
    block_efficiency(num_accepted, num_drafted)  # validates the counts
    if draft_seconds < 0 or verify_seconds <= 0:
        raise ValueError(
            f"`verify_seconds` must be > 0 and `draft_seconds` >= 0, but are {verify_seconds} and {draft_seconds}. "
            "Pass measured wall times."
        )
    return (num_accepted + 1) / (num_drafted + 1) * verify_seconds / (draft_seconds + verify_seconds)


def _be(feedback: RoundFeedback) -> float:
    return block_efficiency(feedback.num_accepted, feedback.num_drafted)


def _bd(feedback: RoundFeedback) -> float:
    return block_divergence(feedback.target_logits, feedback.draft_tokens, feedback.draft_logits)


def _cost(feedback: RoundFeedback) -> float:
    verify = max(feedback.seconds - feedback.draft_seconds, 1e-9)
    return cost_aware(feedback.num_accepted, feedback.num_drafted, feedback.draft_seconds, verify)


_be.__name__, _bd.__name__, _cost.__name__ = "be", "bd", "cost"

#: name -> reward callable taking a `RoundFeedback`.
REWARDS: dict[str, Callable[[RoundFeedback], float]] = {"be": _be, "bd": _bd, "cost": _cost}


def get_reward(reward: str | Callable[[RoundFeedback], float]) -> Callable[[RoundFeedback], float]:
    """Resolve `meta_reward`: a name in `REWARDS` or a callable ``f(feedback) -> float``."""
    if callable(reward):
        return reward
    if isinstance(reward, str) and reward in REWARDS:
        return REWARDS[reward]
    raise UnknownRewardError(
        f"`meta_reward` must be one of {sorted(REWARDS)} or a callable `f(RoundFeedback) -> float`, but is {reward!r}. "
        'Use "bd" (the default) or "be".'
    )


def reward_name(reward: str | Callable[[RoundFeedback], float]) -> str:
    """A printable name for a reward."""
    return reward if isinstance(reward, str) else getattr(reward, "__name__", type(reward).__name__)
