r"""`RoundRewards`: what one call's policy learns from each round, and when each reward is known.

The reward functions are pure (`hf_metasd.rewards`); what this module keeps is their bookkeeping within a call:

* **The round's feedback** (`feedback`): the verified round as the reward sees it (a `RoundFeedback`), or nothing to
  learn (a plain step the policy did not choose). Built from what the round measured; it changes nothing.
* **A pull's reward** (`learn`): a cost-aware reward (`speed`) is in units of the smoothed cost of a plain step
  (`hf_metasd.costs.CostModel`), so it is known only once the pulled arm's cost and a plain step's are measured. The
  prompt's prefill round, whose wall time is dominated by the prompt, waits (is *deferred*) until its arm's cost is
  known, then counts as round 0's reward.
* **The calibration round** (`calibrating`): when a plain step's cost is not known yet (the first call for a target),
  the first round after the prefill is a plain step, a pull of the no-draft arm, so that the unit is measured.
* **The no-draft arm's reward** (`plain_value`), known without a pull: it drafts nothing and costs a plain step
  (under `speed`, :math:`1 / (N + 1)`).
* **Counterfactual rewards** (`learn_counterfactual`) for a full-information policy (``hedge``): every other drafter
  with logits, scored on the round's accepted window (`hf_metasd.feedback.counterfactual_feedback`).
* **Replayed rewards** (`learn_replayed`): model-free arms that did not draft a round, scored in hindsight once the
  sequence decides their proposals (`hf_metasd.feedback.Replay`), told to the policy as side observations.
* Every reward told to the policy (`tell`: `Policy.update` for a pull, `Policy.observe` for a side observation) is
  also recorded in the call's `RewardMemory`, from which later calls take their learned priors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..costs import CostModel
from ..drafters import Drafter
from ..policies import Policy
from ..reward_memory import RewardMemory
from ..rewards import RoundFeedback, get_reward, is_cost_aware, reward_value
from ..stats import MetaSDStats
from .counterfactual import counterfactual_feedback
from .replay import ReplayedRound, replayed_feedback

__all__ = ["RoundRewards"]


class RoundRewards:
    """The rewards of one call's rounds (see the module docstring), told to `policy` and remembered in `memory`.

    Args:
        policy: the call's policy.
        reward: a reward name or callable (`hf_metasd.rewards.get_reward`).
        costs: the call's smoothed round costs, one entry per arm.
        no_draft_arm: the no-draft arm's index, or ``None`` when the pool has none.
        num_assistant_tokens: the call's draft length cap ``N``.
        stats: the call's telemetry (its stopwatch times rewards and policy updates).
        memory: where the call records its rewards for later calls (``None``: not recorded).
    """

    def __init__(
        self,
        policy: Policy,
        reward: str | Callable[[RoundFeedback], float],
        *,
        costs: CostModel,
        no_draft_arm: int | None,
        num_assistant_tokens: int,
        stats: MetaSDStats,
        memory: RewardMemory | None = None,
    ) -> None:
        self.policy = policy
        self.reward = get_reward(reward)
        self.cost_aware = is_cost_aware(reward)
        self.costs = costs
        self.no_draft_arm = no_draft_arm
        self.num_assistant_tokens = num_assistant_tokens
        self.stats = stats
        self.memory = memory
        self._deferred: list[RoundFeedback] = []  # prefill-round feedback waiting for its arm's cost

    def plain_seconds(self) -> float | None:
        """The smoothed cost of a plain step (the cost unit of `speed`), or ``None`` while unknown or without the
        no-draft arm."""
        return None if self.no_draft_arm is None else self.costs.estimate(self.no_draft_arm)

    def calibrating(self, first: bool) -> bool:
        """Whether this round is the calibration round: a plain step, because the cost unit is not measured yet
        (after the prefill round, before any plain step, under a policy that learns from rewards)."""
        return (
            not first
            and self.no_draft_arm is not None
            and self.policy.uses_rewards
            and self.plain_seconds() is None
            and self.stats.rounds > 0
            and self.no_draft_arm not in self.stats.arms
        )

    def feedback(
        self,
        arm: int,
        tokens: torch.Tensor | None,
        draft_logits: torch.Tensor | None,
        scores: torch.Tensor,
        accepted: int,
        *,
        seconds: float,
        draft_seconds: float,
        do_sample: bool,
    ) -> RoundFeedback | None:
        """The verified round as the reward sees it: arm `arm` drafted `tokens` ``(n,)`` (``None``: a plain step) from
        `draft_logits` ``(n, V)``, the target's `scores` ``(1, n + 1, V)`` accepted `accepted` of them, the round took
        `seconds`, `draft_seconds` of them before verification; the arm's and a plain step's smoothed costs as known
        now.

        Returns ``None`` when the policy is not to learn from the round: a plain step that the policy did not choose
        (every drafter it asked abstained and the fallback gave up), or the length limit left nothing to draft.
        """
        if tokens is None and arm != self.no_draft_arm:
            return None
        tokens = tokens if tokens is not None else scores.new_zeros(0, dtype=torch.long)
        return RoundFeedback(
            arm=arm,
            draft_tokens=tokens,
            target_logits=scores[0, : tokens.shape[0]],
            draft_logits=draft_logits,
            num_accepted=accepted,
            seconds=seconds,
            draft_seconds=draft_seconds,
            do_sample=do_sample,
            num_assistant_tokens=self.num_assistant_tokens,
            arm_seconds=self.costs.estimate(arm),
            plain_seconds=self.plain_seconds(),
        )

    def value(self, feedback: RoundFeedback) -> float | None:
        """The reward of `feedback`, or ``None`` while a cost-aware reward's costs are unknown."""
        if self.cost_aware and (feedback.arm_seconds is None or feedback.plain_seconds is None):
            return None
        with self.stats.timed("reward"):
            return reward_value(self.reward, feedback)

    def plain_value(self, plain_seconds: float, vocab_size: int) -> float:
        """The reward of a plain step, known without one (the no-draft arm drafts nothing and costs a plain step)."""
        plain_round = RoundFeedback(
            arm=self.no_draft_arm,
            draft_tokens=torch.zeros(0, dtype=torch.long),
            target_logits=torch.zeros(0, vocab_size),
            draft_logits=None,
            num_accepted=0,
            seconds=plain_seconds,
            num_assistant_tokens=self.num_assistant_tokens,
            arm_seconds=plain_seconds,
            plain_seconds=plain_seconds,
        )
        with self.stats.timed("reward"):
            return reward_value(self.reward, plain_round)

    def tell(self, arm: int, reward: float, *, side: bool = False) -> None:
        """Give the policy a reward (a pull's, or with `side` a side observation) and remember it for later calls."""
        with self.stats.timed("policy"):
            if side:
                self.policy.observe(arm, reward)
            else:
                self.policy.update(arm, reward)
            if self.memory is not None:
                self.memory.record(arm, reward)

    def learn(self, feedback: RoundFeedback, *, first: bool) -> float | None:
        """Tell the policy this round's reward (and any deferred prefill round's whose cost is now known); returns
        it, or ``None`` while its costs are unknown (the `first` round's feedback then waits)."""
        still_deferred = []
        for old in self._deferred:
            old.arm_seconds = self.costs.estimate(old.arm)
            old.plain_seconds = self.plain_seconds()
            late = self.value(old)
            if late is None:
                still_deferred.append(old)
                continue
            self.tell(old.arm, late)
            self.stats.rewards[0] = late  # the prefill round is round 0
        self._deferred = still_deferred
        reward = self.value(feedback)
        if reward is None:
            if first:
                self._deferred.append(feedback)
            return None
        self.tell(feedback.arm, reward)
        return reward

    def learn_counterfactual(
        self,
        drafters: Sequence[Drafter],
        feedback: RoundFeedback,
        reward: float,
        input_ids: torch.LongTensor,
        scores: torch.Tensor,
    ) -> None:
        """Full information: every other drafter with logits is scored on this round's accepted window, and the
        policy gets every arm's reward at once (`Policy.update_all`)."""
        rewards: dict[int, float] = {feedback.arm: reward}
        accepted_by = {feedback.arm: feedback.num_accepted}
        with self.stats.timed("catch_up"):
            observed = counterfactual_feedback(
                drafters, feedback, input_ids, scores, self.num_assistant_tokens, skip={feedback.arm}
            )
        for other, (counterfactual, matches) in observed.items():
            counterfactual.arm_seconds = self.costs.estimate(other)
            counterfactual.plain_seconds = feedback.plain_seconds
            value = self.value(counterfactual)
            if value is not None:
                rewards[other] = value
                accepted_by[other] = matches
        if self.no_draft_arm not in (None, feedback.arm) and feedback.plain_seconds is not None:
            rewards[self.no_draft_arm] = self.plain_value(feedback.plain_seconds, scores.shape[-1])
        self.stats.counterfactual_rewards.append(rewards)
        self.stats.counterfactual_accepted.append(accepted_by)
        with self.stats.timed("policy"):
            self.policy.update_all(rewards)

    def learn_replayed(
        self,
        decided: Sequence[tuple[ReplayedRound, int]],
        sequence: Sequence[int],
        vocab_size: int,
        *,
        observe_no_draft: bool,
    ) -> list[tuple[int, float]]:
        """Side observations for the policy: the reward of every replayed round the sequence now decides
        (`hf_metasd.feedback.Replay.decided`: each with its accepted count) whose costs are known, and, with
        `observe_no_draft` (the round did not pull the no-draft arm), the no-draft arm's reward known without a pull.
        Returns the ``(arm, reward)`` observations told to the policy (telemetry)."""
        plain = self.plain_seconds()
        with self.stats.timed("replay"):
            feedbacks = [
                replayed_feedback(
                    replayed,
                    accepted,
                    sequence,
                    vocab_size,
                    num_assistant_tokens=self.num_assistant_tokens,
                    arm_seconds=self.costs.estimate(replayed.arm),
                    plain_seconds=plain,
                )
                for replayed, accepted in decided
            ]
        observed = [(f.arm, value) for f in feedbacks if (value := self.value(f)) is not None]
        if observe_no_draft and plain is not None:
            observed.append((self.no_draft_arm, self.plain_value(plain, vocab_size)))
        for arm, value in observed:
            self.tell(arm, value, side=True)
        return observed

    def __repr__(self) -> str:
        return f"RoundRewards(policy={self.policy!r}, cost_aware={self.cost_aware}, deferred={len(self._deferred)})"
