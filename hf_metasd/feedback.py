"""Feedback beyond the arm that drafted: the prompt warm start, full-information (counterfactual) scoring and
replayed rounds.

The first two reuse what the target computed anyway and what every drafter must ingest anyway before it drafts: the target's
logits on the prompt (warm start) or on a round's accepted tokens (full information), and the drafter's logits on
the same positions while it catches up. The scores are the rewards of `hf_metasd.rewards`.

A **replayed round** is a round that a model-free drafter did not draft, scored in hindsight under greedy decoding:
the drafter proposes for the round's position (a cheap function of the sequence up to there), and once the sequence
covers the proposal the accepted count is its common prefix with the target's tokens, exactly what the target would
have accepted (greedy decoding keeps the target's argmax, which is the sequence).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .drafters import Drafter
from .rewards import RoundFeedback, block_divergence

__all__ = ["ReplayedRound", "counterfactual_feedback", "replayed_accepted", "replayed_feedback", "warm_start_rewards"]


def warm_start_rewards(
    drafters: Sequence[Drafter],
    input_ids: torch.LongTensor,
    model_outputs: Any,
    window: int,
    prompt_length: int,
    kept_logits: dict[int, torch.Tensor],
    *,
    seen: set[int],
) -> dict[int, float]:
    """BD of every drafter with logits on the last `window` prompt positions (called before round 2).

    The target's first forward pass kept its logits on that window (`model_outputs.logits[0, :window]`, positions
    ``L - w - 1 .. L - 2`` predicting the last `window` prompt tokens). A drafter that prefilled the prompt in round 1
    kept its own (`kept_logits`); the others prefill now (as they must before drafting), keeping theirs; their prefill
    is then added to `seen`.

    Returns:
        ``{arm: 1 - TV averaged over the window}`` for every drafter with logits.
    """
    logits = getattr(model_outputs, "logits", None)
    if logits is None or logits.shape[1] < window:
        return {}
    target = logits[0, :window].float()
    tokens = input_ids[0, prompt_length - window : prompt_length]
    rewards: dict[int, float] = {}
    for arm, drafter in enumerate(drafters):
        if not drafter.returns_logits:
            continue
        drafted = kept_logits.pop(arm, None)
        if drafted is None:  # prefill now, keeping the logits from position L - w - 1 on
            full = drafter.catch_up(input_ids, return_logits=input_ids.shape[1] - (prompt_length - window - 1))
            if full is None or full.shape[1] < window:
                continue
            drafted = full[0, :window]
        seen.add(arm)
        rewards[arm] = block_divergence(target, tokens, drafted.to(target.device))
    return rewards


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


@dataclass
class ReplayedRound:
    """What drafter `arm` would have proposed for the round whose first drafted token is at position `start`.

    Attributes:
        arm: the drafter's arm.
        start: the sequence length at the round's start (the proposal's first token would sit there).
        tokens: the proposal, as ids.
        seconds: what proposing cost.
        match_class: the proposal's match class for a drafter that scores matches (see
            `hf_metasd.draft_length.match_class`), else ``None``.
    """

    arm: int
    start: int
    tokens: list[int]
    seconds: float
    match_class: int | None = None


def replayed_accepted(replayed: ReplayedRound, sequence: Sequence[int]) -> int | None:
    """The drafted tokens greedy decoding would have accepted of `replayed`, or None while `sequence` cannot tell.

    The count is the common prefix of the proposal and ``sequence[start:]``; it is decided once a token differs or
    the sequence covers the whole proposal.

    Example:
        >>> round_ = ReplayedRound(arm=0, start=2, tokens=[7, 8, 9], seconds=0.0)
        >>> replayed_accepted(round_, [1, 2, 7, 8]), replayed_accepted(round_, [1, 2, 7, 5])
        (None, 1)
        >>> replayed_accepted(round_, [1, 2, 7, 8, 9, 4])
        3
    """
    known = sequence[replayed.start : replayed.start + len(replayed.tokens)]
    accepted = 0
    while accepted < len(known) and known[accepted] == replayed.tokens[accepted]:
        accepted += 1
    if accepted < len(known) or len(known) == len(replayed.tokens):
        return accepted
    return None


def replayed_feedback(
    replayed: ReplayedRound,
    accepted: int,
    sequence: Sequence[int],
    vocab_size: int,
    *,
    num_assistant_tokens: int,
    arm_seconds: float | None,
    plain_seconds: float | None,
) -> RoundFeedback:
    """The `RoundFeedback` of a replayed round, for the rewards of `hf_metasd.rewards.REPLAYABLE_REWARDS`.

    Greedy decoding's acceptance depends on the target's logits only through their argmax, so the round carries the
    target's tokens ``sequence[start + j]`` as `target_tokens` ``(n,)`` and empty ``(n, 0)`` `target_logits` (no
    ``(n, vocab_size)`` one-hot rows to allocate and reduce for every replayed arm of every round); a position after
    the first mismatch that the sequence does not reach yet gets another token than the draft's (it cannot be
    accepted either way). `vocab_size` keeps that token in the vocabulary.
    """
    n = len(replayed.tokens)
    targets = [
        sequence[replayed.start + j] if replayed.start + j < len(sequence) else (replayed.tokens[j] + 1) % vocab_size
        for j in range(n)
    ]
    return RoundFeedback(
        arm=replayed.arm,
        draft_tokens=torch.tensor(replayed.tokens, dtype=torch.long),
        target_logits=torch.zeros(n, 0),
        target_tokens=torch.tensor(targets, dtype=torch.long),
        draft_logits=None,
        num_accepted=accepted,
        do_sample=False,
        num_assistant_tokens=num_assistant_tokens,
        arm_seconds=arm_seconds,
        plain_seconds=plain_seconds,
    )
