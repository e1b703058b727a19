r"""`TreeRounds`: one call's tree rounds, between the candidate generator and the tree's maths.

With ``meta_tree=True`` a round (after the call's first, which prefills the prompt) is built as follows. The policy
picks its arm and the draft length chosen for it, and that arm drafts, as in a chain round; then the width policy
(`hf_metasd.tree.width.choose_tree`) adds the arms and lengths that raise the round's expected tokens per second
under this machine's measured pass costs (`grow`). Each added arm catches up and drafts; the drafts are merged into
one `TokenTree` and the target verifies it in one pass (`hf_metasd.tree.verify`). A round of one arm (the width
policy added none, or they abstained) is a chain round, verified as before.

After the pass, every arm in the tree is scored exactly (`learn`): its branch's rows hold the target's logits at each
of its drafted positions, so its own accepted count is what a round of it alone would have had accepted (greedy: the
leading drafted tokens that are the target's argmax on its branch; sampling: its drafted tokens on the kept path).
The policy's arm gets its reward as a pull (`Policy.update`), every other arm in the tree as a side observation
(`Policy.observe`, full information for the verified arms); each arm's acceptance by position and drafting seconds go
to `DraftLength`, and its round cost to `CostModel` as a round of it alone would have cost (the round's own overhead,
its drafting, and the measured pass over its own chain), so that rewards keep their units. The pass cost at the
tree's width goes to `DraftLength` (`observe_verification`), which is what the width policy reads next.

Where a tree cannot run (`hf_metasd.tree.cache.tree_unsupported`, and per-step attentions or hidden states asked
for: those are split from chain passes) the call verifies chains, and `MetaSDStats.tree_reason` says why, once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .._distributed import tensor_parallel_group
from .cache import tree_unsupported
from .token_tree import TokenTree
from .verify import TreeVerdict
from .width import MAX_TREE_ARMS, choose_tree, extrapolate, optimistic_rates

__all__ = ["EXPLORATION", "TreeRound", "TreeRounds"]

#: The default optimism :math:`c` of the width policy (`hf_metasd.tree.width.optimistic_rates`).
EXPLORATION = 0.3


@dataclass
class TreeRound:
    """The arms of one tree round besides the policy's, and what each cost.

    Attributes:
        tree: the round's tree (the policy's arm first among its branches).
        seconds: arm -> seconds it spent catching up and drafting this round (its prompt prefill left out).
        match_classes: arm -> the match class its draft was cut by (`hf_metasd.draft_length.match_class`), or None.
        prefill_seconds: the added arms' prompt prefills (not part of any round cost).
    """

    tree: TokenTree
    seconds: dict[int, float] = field(default_factory=dict)
    match_classes: dict[int, int | None] = field(default_factory=dict)
    prefill_seconds: float = 0.0


class TreeRounds:
    """The tree rounds of one call (see the module docstring).

    Args:
        drafters: the call's drafters (arm ``i`` is ``drafters[i]``).
        lengths: the call's `DraftLength` (pass costs by width, acceptance by position, drafting seconds).
        round_length: the call's `RoundLength` (the cap, match-class cuts).
        costs: the call's `CostModel`.
        rewards: the call's `RoundRewards`.
        stats: the call's `MetaSDStats`.
        logits_processor / do_sample: how drafters draft.
        exploration: the width policy's optimism :math:`c`.
        max_arms: the most arms in one tree.
    """

    def __init__(
        self,
        drafters: Sequence[Any],
        lengths: Any,
        round_length: Any,
        costs: Any,
        rewards: Any,
        stats: Any,
        *,
        logits_processor: Any = None,
        do_sample: bool = False,
        exploration: float = EXPLORATION,
        max_arms: int = MAX_TREE_ARMS,
    ) -> None:
        self.drafters = list(drafters)
        self.lengths, self.round_length, self.costs, self.rewards, self.stats = (
            lengths,
            round_length,
            costs,
            rewards,
            stats,
        )
        self.logits_processor, self.do_sample = logits_processor, do_sample
        self.exploration, self.max_arms = exploration, max_arms
        # `check` decides in the single-request loop; a batch's rows never get there
        self.reason: str | None = "a batch (B > 1) verifies each row's chain in its one pass"
        stats.tree_reason = self.reason

    # ------------------------------------------------------------------ where trees run
    def check(self, model: Any, model_kwargs: dict[str, Any], input_ids: torch.Tensor, generation_config: Any) -> None:
        """Decide once per call whether its rounds may verify trees; `reason` (and the call's `tree_reason`) says why
        not, ``None`` when they may."""
        reason = None
        if len(self.drafters) < 2:
            reason = "the pool has one drafter"
        elif getattr(generation_config, "return_dict_in_generate", False) and (
            generation_config.output_attentions or generation_config.output_hidden_states
        ):
            reason = "per-step attentions and hidden states are split from chain passes"
        elif tensor_parallel_group(model) is not None:
            reason = "a tensor-parallel target verifies chains (trees are not tested there)"
        else:
            reason = tree_unsupported(model, model_kwargs.get("cache"), model_kwargs, input_ids)
        self.reason = reason
        self.stats.tree_reason = reason

    @property
    def active(self) -> bool:
        """Whether this call's rounds may verify trees."""
        return self.reason is None

    # ------------------------------------------------------------------ the round's tree
    def plan(self, primary: int, length: int, sequence_length: int, exclude: set[int]) -> list[tuple[int, int]]:
        """The arms and lengths to add to a round of `primary` drafting `length` (`choose_tree`)."""
        cap = self.round_length.cap(sequence_length)
        arms = [primary] + [a for a in range(len(self.drafters)) if a != primary and a not in exclude]
        rates = {
            arm: optimistic_rates(self.lengths.acceptance(arm, cap), self.lengths.tried(arm), self.exploration)
            for arm in arms
        }
        draft = {arm: self.lengths.draft_seconds(arm) for arm in arms}
        verify = extrapolate(self.lengths.verification_seconds(), self.lengths.summary())
        plan = choose_tree((primary, length), rates, draft, verify, cap=cap, max_arms=self.max_arms)
        return plan[1:]

    def grow(
        self,
        primary: tuple[int, torch.Tensor, torch.Tensor | None],
        input_ids: torch.LongTensor,
        exclude: set[int | None],
        *,
        primary_match: int | None = None,
        catch_up: Callable[[int, torch.LongTensor], float],
        cut: Callable[[int, torch.Tensor], tuple[torch.Tensor, int | None]],
    ) -> TreeRound | None:
        """The round's tree: the `primary` ``(arm, tokens (n,), logits (n, V) or None)`` the policy's arm drafted,
        (its draft's match class `primary_match`), and the arms and lengths `plan` adds (none from `exclude`), each
        caught up (`catch_up(arm, input_ids)` returns its prompt-prefill seconds), drafted and cut as its match class
        says (`cut`). ``None`` when no arm was added or none drafted anything: the round is a chain."""
        arm, tokens, _ = primary
        clock = self.stats.clock
        plan = self.plan(arm, int(tokens.shape[0]), input_ids.shape[1], {a for a in exclude if a is not None})
        drafts = [primary]
        record = TreeRound(tree=None, match_classes={arm: primary_match})  # type: ignore[arg-type]
        for arm, length in plan:
            start = clock()
            prefill = catch_up(arm, input_ids)
            with self.stats.timed("draft"):
                tokens, logits = self.drafters[arm].draft(
                    input_ids, length, logits_processor=self.logits_processor, do_sample=self.do_sample
                )
            record.prefill_seconds += prefill
            if tokens.shape[-1] == 0:
                continue  # nothing to propose: left out of the tree
            tokens, record.match_classes[arm] = cut(arm, tokens)
            drafts.append((arm, tokens[0], None if logits is None else logits[0, : tokens.shape[-1]]))
            record.seconds[arm] = clock() - start - prefill
        if len(drafts) == 1:
            return None
        record.tree = TokenTree.from_drafts(int(input_ids[0, -1]), drafts)
        return record

    # ------------------------------------------------------------------ what the round teaches
    def _solo_accepted(self, verdict: TreeVerdict, arm: int) -> int:
        """What a round of `arm` alone would have had accepted (greedy: exactly; sampling: its tokens on the path)."""
        tree = verdict.tree
        if self.do_sample:
            return tree.accepted_by(arm, verdict.path)
        branch = tree.branches[arm]
        best = verdict.scores[[0, *branch[:-1]]].argmax(dim=-1).tolist()
        count = 0
        for node, token in zip(branch, best):
            if int(tree.tokens[node]) != token:
                break
            count += 1
        return count

    def learn(
        self, record: TreeRound, verdict: TreeVerdict, primary: int, drafting: float, verify: float, *, fastest: bool
    ) -> tuple[Any, dict[int, float]]:
        """Fold the verified tree into the call's estimates and tell the policy every arm's reward (module
        docstring). `primary`: the policy's arm; `drafting`: the round's seconds before its pass (selection, every
        arm's catch-up and drafting; the policy's arm's prompt prefill left out); `verify`: the pass's; `fastest`:
        whether the pass ran its width's fastest kernel (else its time does not measure the width). Returns the
        policy's arm's `RoundFeedback` and the side rewards told."""
        tree = verdict.tree
        if fastest:
            self.lengths.observe_verification(tree.width, verify)
        # the policy's arm's share: the round's seconds before the pass but the added arms' (its selection in it)
        before = drafting - record.prefill_seconds
        spent = {**record.seconds, primary: max(0.0, before - sum(record.seconds.values()))}
        chain_costs = self.lengths.verification_seconds()
        primary_feedback, side = None, {}
        for arm, branch in tree.branches.items():
            n, accepted = len(branch), self._solo_accepted(verdict, arm)
            self.lengths.observe_acceptance(arm, n, accepted, record.match_classes.get(arm))
            self.lengths.observe_draft(arm, n, spent[arm])
            chain = chain_costs[n] if n < len(chain_costs) and chain_costs[n] is not None else verify
            self.costs.observe(arm, spent[arm] + chain)
            feedback = self.rewards.feedback(
                arm,
                tree.tokens[branch],
                tree.draft_logits.get(arm),
                verdict.scores[[0, *branch]][None],
                accepted,
                seconds=spent[arm] + chain,
                draft_seconds=spent[arm],
                do_sample=self.do_sample,
            )
            if arm == primary:
                primary_feedback = feedback
                continue
            value = self.rewards.value(feedback)
            if value is not None:
                self.rewards.tell(arm, value, side=True)
                side[arm] = value
        return primary_feedback, side

    def record(
        self, verdict: TreeVerdict | None, arm: int, drafted: int, accepted: int, side: dict[int, float]
    ) -> None:
        """The round's tree telemetry (`MetaSDStats`): its arms and lengths, its width, the arm of the kept path
        (`accepted` drafted tokens kept), the side rewards; a chain round of `arm` drafting `drafted` is recorded as
        a tree of one branch."""
        stats = self.stats
        if verdict is None:
            stats.tree_arms.append([arm] if drafted else [])
            stats.tree_lengths.append([drafted] if drafted else [])
            stats.tree_widths.append(1 + drafted)
            stats.path_arms.append(arm if drafted and accepted > 0 else None)
            stats.tree_rewards.append({})
            return
        tree = verdict.tree
        stats.tree_arms.append(tree.arms)
        stats.tree_lengths.append([len(b) for b in tree.branches.values()])
        stats.tree_widths.append(tree.width)
        path = verdict.path[:accepted]
        stats.path_arms.append(tree.path_arm(path, prefer=arm) if path else None)
        stats.tree_rewards.append(dict(side))
