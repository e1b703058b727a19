r"""`MetaCandidateGenerator`: transformers' candidate-generator contract over a pool of drafters.

Each round is a fixed sequence of named steps, split over the contract's two methods:

``get_candidates``: `_start_round` -> `_select` (the policy's arm, or the calibration round) -> `_draft` (the arm
catches up and drafts the length chosen for it; an arm that abstains hands the round to `Policy.fallback`) ->
`_start_verification` (the kernel of the target's pass, `hf_metasd.kernels.VerificationKernels`) -> candidates.

``update_candidate_strategy`` (after the target verified): `_measure` (what the round measured, folded into the
call's estimates: the kernel's pass cost, the round's cost, verification cost and acceptance by length) ->
`_feedback` (the round as the reward sees it, `hf_metasd.feedback.RoundRewards.feedback`) -> `_learn` (the policy's
reward and, for a full-information policy such as ``hedge``, every drafter's) -> `_replay` (replayed rounds, below)
-> `_record` (telemetry). What a round teaches the policy is `hf_metasd.feedback`'s.

Arms are the pool's drafters plus, when the reward is cost-aware (the default `speed`), the **no-draft arm**: a
round the target decodes alone (one plain step, no drafter, no catch-up). With it the policy can learn that no
drafter pays, and over enough rounds a pool of useless drafters converges to plain decoding speed (how fast depends
on the policy's exploration: UCB with beta = 1 needs far more than one 64-token answer). The cost unit of `speed`,
the calibration round that measures it and the prefill round's deferred reward are `RoundRewards`' bookkeeping.

**Replayed rounds** (``meta_replay``; on by default under greedy decoding with a reward of
`hf_metasd.rewards.REPLAYABLE_REWARDS` and a policy that `learns_side_observations`): after each round, every
model-free drafter that did not draft it (`Drafter.replayable`: prompt lookup, corpus drafters) proposes for the
round's position (`hf_metasd.feedback.Replay`), and once the sequence covers its proposal the policy gets, through
`Policy.observe`, the reward it would have earned: greedy decoding accepts exactly the common prefix of a proposal
and the target's tokens, so the observation is exact. Its cost is its own proposing plus the round's verification.
The no-draft arm, whose `speed` reward is known without a pull (:math:`1 / (N + 1)`), is observed too. A cheap arm is
then learnt without the rounds it would take to pull it, and exploration is left to the model drafters.

Bandit maths lives in `hf_metasd.policies`, model code in `hf_metasd.drafters`, reward maths in `hf_metasd.rewards`,
what a round teaches in `hf_metasd.feedback`, costs in `hf_metasd.costs`, draft lengths in `hf_metasd.draft_length`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from transformers.generation.candidate_generator import CandidateGenerator

from .costs import CostModel, cost_key
from .draft_length import DraftLength, RoundLength
from .drafters import Drafter, unique_names
from .drafters.base import check_draft
from .errors import MetaSDConfigError, MetaSDTypeError, PolicyArmError
from .feedback import Replay, RoundRewards, replay_applies
from .kernels import VerificationKernels
from .policies import Policy
from .priors import set_priors
from .reward_memory import RewardMemory
from .rewards import RoundFeedback, is_cost_aware, reward_name
from .round_context import Round, round_context
from .settings import MetaSDSettings
from .stats import MetaSDStats

__all__ = ["NO_DRAFT", "MetaCandidateGenerator"]

#: Telemetry name of the no-draft arm.
NO_DRAFT = "no_draft"


class MetaCandidateGenerator(CandidateGenerator):
    """Candidate generator that lets a bandit policy pick one arm of a pool per round.

    Args:
        drafters: the call's drafters, one per arm (per-call copies: see `Drafter.spawn`).
        policy: a `Policy`; it is bound to the number of arms (reset if fresh, kept if it already learnt).
        settings: the call's `MetaSDSettings` (validated when built); the generator reads the reward, the draft
            length cap and mode, ``meta_no_draft``, ``meta_replay`` and ``meta_learned_priors``.
        logits_processor: the target's `LogitsProcessorList`; drafters apply it too, so that drafted tokens and the
            logits used by speculative sampling and the rewards are the processed ones.
        generation_config: the call's `GenerationConfig` (for `do_sample` and `max_length`).
        target: the target model (its process-level cost cache; see `CostModel`).
        pool_defaults: the pool's defaults (`DrafterPool.generate_kwargs`): a pool's priors apply only under its
            reward (`hf_metasd.priors.set_priors`, which gives the policy its priors once it is bound to the arms).
        priors_from_call: whether ``settings.meta_priors`` were passed to the call (else they are a pool's or a
            config's).
        choose_kernels: chooses the call's `VerificationKernels` (e.g. `VerificationKernels.for_call`), asked before
            and told after each verification pass; called once, after every check of the constructor, and timed as
            the call's ``kernel_choice`` (``None``: the kernel is not chosen per pass).
        lengths: builds the call's draft-length estimates (`lengths` and `round_length`'s), called as `DraftLength`
            is (a batch row's: `hf_metasd.batched.lengths.RowLengths` on the batch's passes).
        cost_smoothing: the cost model's smoothing.
        clock: the stopwatch of the call (injectable for tests).

    Example:
        >>> import torch
        >>> from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
        >>> from hf_metasd.drafters import ModelDrafter
        >>> from hf_metasd.policies import get_policy
        >>> cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        ...                   num_attention_heads=2, num_key_value_heads=1)
        >>> _ = torch.manual_seed(0)
        >>> pool = [ModelDrafter(LlamaForCausalLM(cfg), name=f"d{i}") for i in range(2)]
        >>> gen = MetaCandidateGenerator(pool, get_policy("ucb"), MetaSDSettings(num_assistant_tokens=3),
        ...                              generation_config=GenerationConfig(max_length=32))
        >>> candidates, logits = gen.get_candidates(torch.tensor([[1, 2, 3]]))
        >>> candidates.shape, logits.shape, gen.stats.drafter_names
        (torch.Size([1, 6]), torch.Size([1, 3, 64]), ['d0', 'd1', 'no_draft'])
    """

    def __init__(
        self,
        drafters: Sequence[Drafter],
        policy: Policy,
        settings: MetaSDSettings | None = None,
        *,
        logits_processor: Any = None,
        generation_config: Any = None,
        target: Any = None,
        pool_defaults: Mapping[str, Any] | None = None,
        priors_from_call: bool = False,
        choose_kernels: Callable[[], VerificationKernels] | None = None,
        lengths: Callable[..., DraftLength] = DraftLength,
        cost_smoothing: float = 0.3,
        clock: Callable[[], float] | None = None,
    ) -> None:
        settings = MetaSDSettings() if settings is None else settings
        if not isinstance(settings, MetaSDSettings):
            raise MetaSDTypeError(
                f"`settings` must be a `MetaSDSettings`, but is {type(settings).__name__}. "
                "Build one with `MetaSDSettings(...)`."
            )
        if not drafters:
            raise MetaSDConfigError(
                "`assistant_models` must hold at least one drafter, but is empty. Pass e.g. `assistant_models=[drafter]`."
            )
        if not isinstance(policy, Policy):
            raise TypeError(f"`policy` must be a `Policy`, but is {type(policy).__name__}. Use `get_policy(name)`.")
        reward = settings.meta_reward
        no_draft = is_cost_aware(reward) if settings.meta_no_draft is None else settings.meta_no_draft
        if no_draft and not is_cost_aware(reward):
            raise MetaSDConfigError(
                f"`meta_no_draft` needs a cost-aware reward to compare drafters with plain decoding, but the reward "
                f"is {reward_name(reward)!r}. Use `meta_reward='speed'`, or `meta_no_draft=False`."
            )
        self.drafters = list(drafters)
        self.no_draft = bool(no_draft)
        self.num_arms = len(self.drafters) + self.no_draft
        self.no_draft_arm = len(self.drafters) if self.no_draft else None
        if policy.num_arms is not None and policy.num_arms != self.num_arms:
            arms = f"{len(self.drafters)} drafters" + (" + the no-draft arm" if self.no_draft else "")
            raise MetaSDConfigError(
                f"`meta_policy` was bound to {policy.num_arms} arms, but this call has {self.num_arms} ({arms}). "
                "Call `policy.reset(num_arms)` or pass the policy by name to start fresh."
            )
        self.policy = policy
        self.policy.bind(self.num_arms)
        self.num_assistant_tokens = settings.num_assistant_tokens
        self.logits_processor = logits_processor
        self.do_sample = bool(getattr(generation_config, "do_sample", False))
        # a full-information policy (`hedge`) learns every drafter's reward each round: those drafters are scored
        self.full_information = policy.full_information
        self.stats = MetaSDStats(
            drafter_names=unique_names(self.drafters) + ([NO_DRAFT] if self.no_draft else []),
            policy=policy.name or type(policy).__name__,
            reward=reward_name(reward),
            num_assistant_tokens=self.num_assistant_tokens,
            **({} if clock is None else {"clock": clock}),
        )
        self.clock = self.stats.clock
        keys = [cost_key(d) for d in self.drafters] + ([NO_DRAFT] if self.no_draft else [])
        self.costs = CostModel(keys, smoothing=cost_smoothing, target=target)
        # verification costs by length are measured in every mode (telemetry); only "measured" chooses by them
        self.draft_length = settings.meta_draft_length
        self.lengths = lengths(
            self.num_arms,
            self.num_assistant_tokens,
            keys=keys,
            target=target,
            smoothing=cost_smoothing,
        )
        self.round_length = RoundLength(
            self.lengths,
            self.draft_length,
            max_length=getattr(generation_config, "max_length", None),
            match_arms={arm for arm, d in enumerate(self.drafters) if d.scores_matches},
            plain_arm=self.no_draft_arm,
        )
        # what this call's policy learns, kept for the next call's priors (a registered reward only: a callable's
        # values mean nothing to another call)
        self.memory = (
            RewardMemory(keys, context=(reward, self.num_assistant_tokens, self.do_sample), target=target)
            if settings.meta_learned_priors and isinstance(reward, str)
            else None
        )
        self.rewards = RoundRewards(
            policy,
            reward,
            costs=self.costs,
            no_draft_arm=self.no_draft_arm,
            num_assistant_tokens=self.num_assistant_tokens,
            stats=self.stats,
            memory=self.memory,
        )
        # replayed rounds (`hf_metasd.feedback.Replay`), or None where they do not apply
        self.replay = (
            Replay(
                self.drafters, [a for a, d in enumerate(self.drafters) if d.replayable], logits_processor, self.clock
            )
            if replay_applies(settings.meta_replay, do_sample=self.do_sample, reward=reward, policy=policy)
            else None
        )
        self._pending: Round | None = None
        self._last_arm: int | None = None
        self._seen: set[int] = set()
        self.stats.learned_priors.update(
            set_priors(
                policy,
                self.stats.drafter_names,
                settings,
                pool_defaults=pool_defaults or {},
                from_call=priors_from_call,
                memory=self.memory,
            )
        )
        self.kernels: VerificationKernels | None = None
        if choose_kernels is not None:  # last: every check above refuses before this measurement runs
            with self.stats.timed("kernel_choice"):
                self.kernels = choose_kernels()

    # ------------------------------------------------------------------ get_candidates
    def get_candidates(
        self, input_ids: torch.LongTensor, **kwargs: Any
    ) -> tuple[torch.LongTensor, torch.Tensor | None]:
        """Select an arm, let it draft; returns ``(1, L + n)`` candidate ids and ``(1, n, V)`` logits or None."""
        round_ = self._start_round(input_ids)
        round_.arm = self._select(round_, input_ids)
        self._draft(round_, input_ids)
        self._start_verification(round_)
        if round_.tokens is None:
            return input_ids, None
        candidates = torch.cat([input_ids, round_.tokens[None].to(input_ids.device)], dim=-1)
        return candidates, None if round_.logits is None else round_.logits[None]

    def _start_round(self, input_ids: torch.LongTensor) -> Round:
        """The round's record: its start (the clock, the sequence length) and whether it is the call's first."""
        started = self.clock()
        if input_ids.shape[0] != 1:
            raise MetaSDConfigError(
                f"batch size must be 1 for MetaSD, but is {input_ids.shape[0]}. Call `generate` once per prompt."
            )
        return Round(first=self.stats.rounds == 0, start=input_ids.shape[1], started=started)

    def _select(self, round_: Round, input_ids: torch.LongTensor) -> int:
        """The policy's arm; the no-draft arm for the calibration round (`RoundRewards.calibrating`). A contextual
        policy chooses from the round's context (`hf_metasd.round_context`: the model-free arms' proposals for this
        position, kept in `round_` as their drafts, and every arm's rate)."""
        if self.rewards.calibrating(round_.first):
            return self.no_draft_arm
        if not self.policy.contextual:
            with self.stats.timed("policy"):
                choice = self.policy.select()
            return self._check_arm(choice, "select")
        with self.stats.timed("draft"):
            context, round_.previews = round_context(
                self.drafters,
                input_ids,
                lengths=self.lengths,
                round_length=self.round_length,
                logits_processor=self.logits_processor,
                do_sample=self.do_sample,
                clock=self.clock,
                optimism=getattr(self.policy, "optimism", 0.0),
                unseen=set(range(len(self.drafters))) - self._seen,
            )
        with self.stats.timed("policy"):
            choice = self.policy.select_in(context)
        return self._check_arm(choice, "select_in")

    def _check_arm(self, choice: Any, method: str) -> int:
        try:
            arm = operator.index(choice)
        except TypeError:
            arm = None
        if arm is None or not 0 <= arm < self.num_arms:
            raise PolicyArmError(
                f"policy {self.stats.policy!r} must select an arm in [0, {self.num_arms}), but selected "
                f"{choice!r}. Fix `{type(self.policy).__name__}.{method}` to return an arm index."
            )
        return arm

    def _draft(self, round_: Round, input_ids: torch.LongTensor) -> None:
        """Let the round's arm catch up and draft the length chosen for it (`RoundLength`); on abstention, ask the
        policy's fallback (at most once per arm), which drafts the length chosen for *it*. Leaves the draft, if
        any, in `round_`."""
        for _ in range(self.num_arms):
            arm = round_.arm
            # replayed rounds score the other arms at this length too (the length this round's pass checks)
            round_.num_tokens = self.round_length.choose(arm, input_ids.shape[1])
            if arm == self.no_draft_arm or round_.num_tokens == 0:
                return
            round_.prefill_seconds += self._catch_up(arm, input_ids)
            preview = round_.previews.get(arm)
            if preview is not None:  # proposed for the round's context: that is its draft
                tokens, logits, round_.match_class = preview.tokens, None, preview.match_class
            else:
                with self.stats.timed("draft"):
                    tokens, logits = self.drafters[arm].draft(
                        input_ids, round_.num_tokens, logits_processor=self.logits_processor, do_sample=self.do_sample
                    )
            check_draft(self.drafters[arm], tokens, logits)  # ids the target can read, logits that are distributions
            self._last_arm = arm
            if tokens.shape[-1] > 0:
                if preview is None:
                    tokens, round_.match_class = self._cut(arm, tokens)
                if round_.match_class is not None or preview is not None:
                    round_.num_tokens = tokens.shape[-1]
                round_.tokens = tokens[0]
                round_.logits = None if logits is None else logits[0, : tokens.shape[-1]]  # (n, V), after any cut
                return
            # The drafter abstained (nothing to propose, e.g. no n-gram match). That is not a pull: nothing is learnt
            # about its drafts, so the policy is not updated; the round goes to the policy's fallback.
            round_.abstained.append(arm)
            with self.stats.timed("policy"):
                fallback = self.policy.fallback(set(round_.abstained))
            if fallback is None:
                return
            round_.arm = self._check_arm(fallback, "fallback")

    def _cut(self, arm: int, tokens: torch.LongTensor) -> tuple[torch.LongTensor, int | None]:
        """`tokens` cut by the arm's match class (`RoundLength.cut`), and the class."""
        return self.round_length.cut(arm, tokens, getattr(self.drafters[arm], "last_match_length", 0))

    def _catch_up(self, arm: int, input_ids: torch.LongTensor) -> float:
        # A drafter that also drafted the previous round only ingests the accepted + bonus tokens: ordinary drafting
        # cost. Its first ingest of the sequence is its prompt prefill (any drafter pays it, alone or in a pool).
        # Anything else (rounds missed while other arms ran) is the cost of switching: catch-up. Returns the prefill's
        # seconds (0 for any other part).
        part = "draft" if self._last_arm == arm else ("catch_up" if arm in self._seen else "prefill")
        start = self.clock()
        with self.stats.timed(part):
            self.drafters[arm].catch_up(input_ids)
        self._seen.add(arm)
        seconds = self.clock() - start if part == "prefill" else 0.0
        self.lengths.observe_prefill(arm, self.drafters[arm].last_catch_up_tokens if seconds else 0, seconds)
        return seconds

    def _start_verification(self, round_: Round) -> None:
        """Switch to the kernel of the target's pass over this round's tokens (not the first pass: it holds the
        prompt), start its clock, and keep the round for `update_candidate_strategy`."""
        if self.kernels is not None and not round_.first:
            round_.kernel = self.kernels.before_pass(round_.width)
        round_.verify_started = self.clock()
        self._pending = round_

    # ------------------------------------------------------------------ the target's features (white-box drafters)
    @property
    def feature_layer_ids(self) -> list[tuple[int, ...]]:
        """The distinct `Drafter.layer_ids` of the call's drafters that read the target's features, in pool order;
        empty when none does (then the verification passes record nothing)."""
        return list(dict.fromkeys(tuple(d.layer_ids) for d in self.drafters if d.layer_ids is not None))

    def observe_target_features(
        self, features: dict[tuple[int, ...], torch.Tensor], next_ids: torch.LongTensor, start: int
    ) -> None:
        """Hand every drafter that reads features (not only the round's) the target's features of the kept positions
        ``start .. start + T - 1``: `features` maps each of `feature_layer_ids` to ``(1, T, k H)``, `next_ids`
        ``(1, T)`` are the tokens that follow those positions (`Drafter.observe`)."""
        for drafter in self.drafters:
            if drafter.layer_ids is not None:
                drafter.observe(features[tuple(drafter.layer_ids)], next_ids, start)

    # ------------------------------------------------------------------ update_candidate_strategy
    def update_candidate_strategy(
        self,
        input_ids: torch.LongTensor,
        scores: torch.Tensor,
        num_matches: int,
        *,
        num_kept: int | None = None,
    ) -> None:
        """Learn from the verification of this round: `scores` ``(1, n + 1, V)`` are the target's processed logits,
        `num_matches` the drafted tokens it accepted, `num_kept` the tokens the round added after stopping criteria
        (default: ``num_matches + 1``)."""
        round_, self._pending = self._pending, None
        if round_ is None:  # called without get_candidates: nothing to learn
            return
        accepted = min(int(num_matches), round_.drafted)
        kept = accepted + 1 if num_kept is None else int(num_kept)
        seconds = self._measure(round_, accepted)
        feedback = self._feedback(round_, scores, accepted, seconds)
        reward = None if feedback is None else self._learn(round_, feedback, input_ids, scores)
        if self.replay is not None:
            self.stats.replay_rewards.append(self._replay(round_, feedback, input_ids, scores.shape[-1]))
        self._observe_scores(round_, input_ids, scores)
        self._record(round_, min(accepted, kept), kept, reward)

    def _observe_scores(self, round_: Round, input_ids: torch.LongTensor, scores: torch.Tensor) -> None:
        """Hand the pass's scores to every drafter that learns from them (`Drafter.learns_from_scores`), with the
        tokens the pass was fed (`Round.fed`); after `_replay`, so that a replayed proposal is what the drafter would
        have proposed at the round's start."""
        fed = round_.fed(input_ids)[:, : scores.shape[1]] if round_.start >= 1 else None
        with self.stats.timed("replay"):
            for drafter in (d for d in self.drafters if d.learns_from_scores and fed is not None):
                drafter.observe_scores(fed, scores[:, : fed.shape[1]])

    def _measure(self, round_: Round, accepted: int) -> float:
        """Fold what the round measured into the call's estimates, and return the round's wall time: the kernel's
        pass cost (`VerificationKernels.after_pass`), the verification cost by length, the arm's acceptance and
        drafting time (`DraftLength`), the round's cost (`CostModel`: the arm's, or a plain step's)."""
        arm, drafted, is_plain = round_.arm, round_.drafted, round_.tokens is None
        now = self.clock()
        seconds = now - round_.started
        verify = None if round_.first else now - round_.verify_started  # the first round's pass is the prefill
        fastest = True if self.kernels is None else self.kernels.after_pass(drafted + 1, round_.kernel, verify)
        if verify is not None:
            if fastest:  # a re-check of the other kernel does not measure verification at this length
                self.lengths.observe_verification(drafted + 1, verify)
            if is_plain and self.no_draft:
                self.costs.observe(self.no_draft_arm, seconds)
            elif not is_plain:
                self.costs.observe(arm, seconds - round_.prefill_seconds)
        if not is_plain:
            self.lengths.observe_acceptance(arm, drafted, accepted, round_.match_class)
            if not round_.first:
                self.lengths.observe_draft(
                    arm, drafted, round_.verify_started - round_.started - round_.prefill_seconds
                )
        return seconds

    def _feedback(self, round_: Round, scores: torch.Tensor, accepted: int, seconds: float) -> RoundFeedback | None:
        """The round as the reward sees it (`RoundRewards.feedback`; changes nothing), or None when the policy is not
        to learn from it."""
        return self.rewards.feedback(
            round_.arm,
            round_.tokens,
            round_.logits,
            scores,
            accepted,
            seconds=seconds,
            draft_seconds=round_.verify_started - round_.started,
            do_sample=self.do_sample,
        )

    def _learn(
        self, round_: Round, feedback: RoundFeedback, input_ids: torch.LongTensor, scores: torch.Tensor
    ) -> float | None:
        """The policy learns the round's reward (`RoundRewards.learn`) and, with a full-information policy, every
        drafter's; returns the round's reward (None while its costs are unknown)."""
        reward = self.rewards.learn(feedback, first=round_.first)
        if reward is not None and self.full_information:
            self.rewards.learn_counterfactual(self.drafters, feedback, reward, input_ids, scores)
        return reward

    def _replay(
        self, round_: Round, feedback: RoundFeedback | None, input_ids: torch.LongTensor, vocab_size: int
    ) -> list[tuple[int, float]]:
        """Replayed rounds (see the module docstring): the replayed arms propose for this round (each proposal's
        round cost, proposing plus this verification, into `CostModel`), and every proposal the sequence now decides
        is a side observation (its acceptance into `DraftLength`, its reward told by `RoundRewards.learn_replayed`).
        Returns the ``(arm, reward)`` observations (telemetry)."""
        verify = None if feedback is None or round_.tokens is None or round_.first else feedback.seconds
        if verify is not None:
            verify -= feedback.draft_seconds
        if round_.num_tokens > 0:
            prefix = input_ids[:, : round_.start]
            with self.stats.timed("replay"):
                proposed = self.replay.propose(
                    prefix,
                    start=round_.start,
                    # an arm cut by its match class proposes what it would have drafted itself: the cap, then its cut
                    num_tokens=lambda arm: (
                        self.round_length.cap(round_.start)
                        if self.round_length.cut_by_match(arm)
                        else round_.num_tokens
                    ),
                    first_token=int(input_ids[0, round_.start]) if input_ids.shape[1] > round_.start else None,
                    vocab_size=vocab_size,
                    cut=self._cut,
                    skip={round_.arm, *round_.abstained},
                    given={arm: (p.proposal, p.match_class) for arm, p in round_.previews.items()},
                )
            for replayed in proposed if verify is not None else ():  # its round's cost: proposing, this verification
                self.costs.observe(replayed.arm, verify + replayed.seconds)
        sequence = input_ids[0].tolist()
        with self.stats.timed("replay"):
            decided = self.replay.decided(sequence)
            for replayed, accepted in decided:
                self.lengths.observe_acceptance(replayed.arm, len(replayed.tokens), accepted, replayed.match_class)
        return self.rewards.learn_replayed(
            decided, sequence, vocab_size, observe_no_draft=round_.arm != self.no_draft_arm
        )

    def _record(self, round_: Round, accepted: int, kept: int, reward: float | None) -> None:
        """The round's telemetry (`MetaSDStats`)."""
        stats = self.stats
        stats.arms.append(round_.arm)
        stats.drafted.append(round_.drafted)
        stats.accepted.append(accepted)
        stats.new_tokens.append(kept)
        stats.rewards.append(reward)
        stats.abstained.append(list(round_.abstained))
        stats.kernels.append(round_.kernel)
        stats.match_classes.append(round_.match_class)
        stats.catch_up_tokens.append(
            self.drafters[round_.arm].last_catch_up_tokens if round_.arm != self.no_draft_arm else 0
        )
