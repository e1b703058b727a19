"""Full-information (counterfactual) scoring: what every other drafter would have scored on a round's accepted window.

It reuses what the target computed anyway and what every drafter must ingest anyway before it drafts: the target's
logits on a round's accepted tokens, and the drafter's logits on the same positions while it catches up. The scores
are the rewards of `hf_metasd.rewards`; `hf_metasd.feedback.RoundRewards.learn_counterfactual` tells them to a
full-information policy.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..drafters import Drafter
from ..rewards import RoundFeedback

__all__ = ["counterfactual_feedback", "is_distribution"]


def counterfactual_feedback(
    drafters: Sequence[Drafter],
    feedback: RoundFeedback,
    input_ids: torch.LongTensor,
    scores: torch.Tensor,
    num_assistant_tokens: int,
    *,
    skip: set[int],
) -> dict[int, tuple[RoundFeedback, int]]:
    """What each other drafter would have scored on this round's accepted window.

    After a round that accepted ``a`` drafted tokens, the target's `scores` ``(1, n + 1, V)`` cover the positions of
    the ``a`` accepted tokens and the bonus token: the last ``a + 1`` tokens of `input_ids`. Every drafter with logits
    catches up on the new tokens, returning its raw logits there; its counterfactual draft is its argmax at each of
    those positions. A drafter's counterfactual accepted count is the number of leading positions where its argmax
    is the verified token, capped by the draft length: observable only within the window (a conservative estimate).

    A drafter whose logits there are no distribution (`is_distribution`: NaN weights) could not have drafted
    there: it is left out, as an abstaining one is.

    Returns:
        ``{arm: (feedback, accepted)}`` for every drafter with logits not in `skip`.
    """
    num = feedback.num_accepted + 1
    target = scores[0, :num]
    tokens = input_ids[0, -num:]
    out: dict[int, tuple[RoundFeedback, int]] = {}
    for arm, drafter in enumerate(drafters):
        if arm in skip or not drafter.returns_logits:
            continue
        logits = drafter.catch_up(input_ids[:, :-1], return_logits=True)
        if logits is None or logits.shape[1] < num:
            continue
        window = logits[0, -num:].to(target.device)
        if not is_distribution(window):
            continue
        proposal = window.argmax(-1)
        matches = min(int((proposal == tokens.to(proposal.device)).long().cumprod(0).sum()), num_assistant_tokens)
        counterfactual = RoundFeedback(
            arm=arm,
            draft_tokens=proposal,
            target_logits=target,
            draft_logits=window,
            num_accepted=min(matches, num),
            do_sample=feedback.do_sample,
            num_assistant_tokens=num_assistant_tokens,
        )
        out[arm] = (counterfactual, matches)
    return out


def is_distribution(logits: torch.Tensor | None) -> bool:
    """Whether every row of `logits` ``(..., V)`` is a distribution a drafter can draft from: its largest entry is
    finite (a NaN, a ``+inf`` or a row of ``-inf`` make it NaN or infinite); ``None`` (no logits) is not checked.

    Example:
        >>> inf = float("inf")
        >>> is_distribution(torch.tensor([[0.0, -inf]])), is_distribution(torch.tensor([[float("nan"), 0.0]]))
        (True, False)
        >>> is_distribution(torch.tensor([[-inf, -inf]])), is_distribution(None)
        (False, True)
    """
    return logits is None or bool(torch.isfinite(logits.amax(dim=-1)).all())
