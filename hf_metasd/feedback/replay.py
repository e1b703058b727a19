"""Replayed rounds: a round that a model-free drafter did not draft, scored in hindsight under greedy decoding.

The drafter proposes for the round's position (a cheap function of the sequence up to there), and once the sequence
covers the proposal the accepted count is its common prefix with the target's tokens, exactly what the target would
have accepted (greedy decoding keeps the target's argmax, which is the sequence). `Replay` holds a call's proposals
until the sequence decides them; `hf_metasd.feedback.RoundRewards.learn_replayed` turns the decided ones into side
observations of the policy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..drafters import Drafter
from ..drafters.prompt_lookup import forbidden_tokens
from ..errors import MetaSDConfigError
from ..rewards import REPLAYABLE_REWARDS, RoundFeedback, is_replayable, reward_name

__all__ = ["Replay", "ReplayedRound", "replay_applies", "replayed_accepted", "replayed_feedback"]


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


def replay_applies(setting: bool | None, *, do_sample: bool, reward: Any, policy: Any) -> bool:
    """``meta_replay`` resolved: ``None`` becomes whether replayed rounds apply (greedy decoding, a reward of
    `REPLAYABLE_REWARDS`, a policy that `learns_side_observations`); ``True`` where they cannot is refused."""
    problems = []
    if do_sample:
        problems.append(("greedy decoding", "`do_sample` is True"))
    if not is_replayable(reward):
        problems.append((f"a reward of {sorted(REPLAYABLE_REWARDS)}", f"the reward is {reward_name(reward)!r}"))
    if not policy.learns_side_observations:
        problems.append(
            ("a policy that learns side observations", f"the policy is {policy.name or type(policy).__name__!r}")
        )
    if setting is None:
        return not problems
    if setting and problems:
        needs, but = problems[0]
        raise MetaSDConfigError(
            f"`meta_replay` needs {needs}, but {but}. Pass `meta_replay=False`, or leave it out (automatic)."
        )
    return setting


class Replay:
    """The replayed rounds of one call (see the module docstring): the model-free drafters `arms` propose for each
    round they did not draft (`propose`), and each proposal waits until the sequence decides it (`decided`).

    Args:
        drafters: the call's drafters (indexed by arm).
        arms: the arms that are replayed (`Drafter.replayable`: prompt lookup, corpus drafters).
        logits_processor: the call's logits processors (a proposal is made again under them only when they forbid its
            first token; see `_draft`).
        clock: the call's stopwatch (what each proposal cost).

    Example:
        >>> from hf_metasd.drafters import PromptLookupDrafter
        >>> replay = Replay([PromptLookupDrafter()], [0], None)
        >>> [r.tokens for r in replay.propose(torch.tensor([[1, 2, 3, 1, 2]]), start=5, num_tokens=lambda arm: 2)]
        [[3, 1]]
        >>> replay.decided([1, 2, 3, 1, 2, 3]), [(r.tokens, n) for r, n in replay.decided([1, 2, 3, 1, 2, 3, 1])]
        ([], [([3, 1], 2)])
    """

    def __init__(
        self,
        drafters: Sequence[Drafter],
        arms: Sequence[int],
        logits_processor: Any,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.drafters = drafters
        self.arms = list(arms)
        self.logits_processor = logits_processor
        self.clock = clock if clock is not None else (lambda: 0.0)
        self._waiting: list[ReplayedRound] = []

    def propose(
        self,
        prefix: torch.LongTensor,
        *,
        start: int,
        num_tokens: Callable[[int], int],
        first_token: int | None = None,
        vocab_size: int | None = None,
        cut: Callable[[int, torch.LongTensor], tuple[torch.LongTensor, int | None]] | None = None,
        skip: Sequence[int] = (),
        given: Mapping[int, tuple[torch.LongTensor, int | None]] | None = None,
    ) -> list[ReplayedRound]:
        """What each replayed arm not in `skip` would have drafted after `prefix` ``(1, start)``: `num_tokens(arm)`
        tokens, cut by `cut(arm, tokens)` (``(tokens, match class)``; default: as proposed), or the ``(tokens, match
        class)`` `given` for it (already proposed at this position, e.g. for the round's context). `first_token` is
        the target's token at `start` when known. An arm that would have abstained proposes nothing, as in a real
        round. The proposals wait for `decided`; returns them."""
        allowed = self._first_position_filter(prefix, vocab_size)
        proposed = []
        for arm in self.arms:
            if arm in skip:
                continue
            begin = self.clock()
            if given is not None and arm in given:
                tokens, match = given[arm]
            else:
                tokens = self._draft(arm, prefix, num_tokens(arm), first_token, allowed)
                tokens, match = cut(arm, tokens) if cut is not None else (tokens, None)
            if tokens.shape[-1] > 0:
                proposed.append(ReplayedRound(arm, start, tokens[0].tolist(), self.clock() - begin, match))
        self._waiting.extend(proposed)
        return proposed

    def decided(self, sequence: Sequence[int]) -> list[tuple[ReplayedRound, int]]:
        """The waiting proposals that `sequence` now decides, each with the drafted tokens greedy decoding would have
        accepted (`replayed_accepted`); the others keep waiting."""
        decided, waiting = [], []
        for replayed in self._waiting:
            accepted = replayed_accepted(replayed, sequence)
            if accepted is None:
                waiting.append(replayed)
            else:
                decided.append((replayed, accepted))
        self._waiting = waiting
        return decided

    def _draft(
        self, arm: int, prefix: torch.LongTensor, num_tokens: int, first_token: int | None, allowed: Callable
    ) -> torch.LongTensor:
        """What `arm` would have drafted after `prefix`, ``(1, n)``, without paying the call's logits processors on
        every proposal.

        The drafter proposes without them. That changes no accepted count when the proposal's first token is the
        target's (a token the processors forbid is never the target's, and the drafter keeps the same match) or is
        one they allow at this position (it misses either way); `allowed(token)` tells, from one run of the
        processors per round. Only a proposal whose first token they forbid is made again with them: the drafter
        could then have looked for another match, or abstained.
        """
        drafter = self.drafters[arm]
        tokens, _ = drafter.draft(prefix, num_tokens, do_sample=False)
        if tokens.shape[-1] == 0 or int(tokens[0, 0]) == first_token or allowed(int(tokens[0, 0])):
            return tokens
        tokens, _ = drafter.draft(prefix, num_tokens, logits_processor=self.logits_processor, do_sample=False)
        return tokens

    def _first_position_filter(self, prefix: torch.LongTensor, vocab_size: int | None) -> Callable[[int], bool]:
        """``allowed(token)``: whether the call's logits processors allow `token` right after `prefix` (they run at
        most once, on the first question)."""
        if self.logits_processor is None or len(self.logits_processor) == 0:
            return lambda token: True
        forbidden: list[torch.Tensor] = []

        def allowed(token: int) -> bool:
            if not forbidden:
                forbidden.append(forbidden_tokens(self.logits_processor, prefix, vocab_size))
            return not bool(forbidden[0][token])

        return allowed
