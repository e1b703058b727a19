r"""`MetaCandidateGenerator`: transformers' candidate-generator contract over a pool of drafters.

Each round is a fixed sequence of named steps, split over the contract's two methods:

``get_candidates``: `_start_round` (first-round set-up, the prompt warm start before round 2) -> `_select` (the
policy's arm, or the calibration round below) -> `_route` (match routing, below) -> `_draft_length` -> `_draft` (the
arm catches up and drafts; an arm that abstains hands the round to `Policy.fallback`) -> candidates.

``update_candidate_strategy`` (after the target verified): `_feedback` (what the round tells: acceptance, the
smoothed costs) -> `_reward` -> `_learn` (the policy's update, and the counterfactual update in full-information
mode) -> telemetry. Every reward the policy gets (`_tell`) is also recorded in the call's `RewardMemory`, from which
later calls take their learned priors (`hf_metasd.reward_memory`).

Arms are the pool's drafters plus, when the reward is cost-aware (the default `speed`), the **no-draft arm**: a
round the target decodes alone (one plain step, no drafter, no catch-up). With it the policy can learn that no
drafter pays, and over enough rounds a pool of useless drafters converges to plain decoding speed (how fast depends
on the policy's exploration: UCB with beta = 1 needs far more than one 64-token answer). The cost
unit of `speed` is the smoothed cost of a plain step: when it is not known yet (first call for a target), the first
round after the prompt's prefill is a plain step (the *calibration round*, a pull of the no-draft arm), and the
reward of the prefill round, whose wall time is dominated by the prompt, waits until its arm's cost is measured.

**Replayed rounds** (``replay``; on by default under greedy decoding with a reward of
`hf_metasd.rewards.REPLAYABLE_REWARDS` and a policy that `learns_side_observations`): after each round, every
model-free drafter that did not draft it (`Drafter.replayable`: prompt lookup, corpus drafters) proposes for the
round's position, and once the sequence covers its proposal the policy gets, through `Policy.observe`, the reward
it would have earned: greedy decoding accepts exactly the common prefix of a proposal and the target's tokens, so
the observation is exact. Its cost is its own proposing plus the round's verification. The no-draft arm, whose
`speed` reward is known without a pull (:math:`1 / (N + 1)`), is observed too. A cheap arm is then learnt without
the rounds it would take to pull it, and exploration is left to the model drafters.

**Match routing** (``match_routing``, off by default): when the policy picks an arm that scores its matches
(`Drafter.scores_matches`: corpus drafters), every such arm proposes for the round (a suffix-array search, well under
a millisecond) and the round goes to the one whose proposal continues the longest match of the context, ties broken
by the match's support (its occurrences), then by the policy's pick. The policy then chooses between *kinds* of
drafting (a model drafter, the lookup arms, the target alone) and the context chooses among lookup arms. The arm that
drafts is the one pulled and rewarded; the others are learnt from replayed rounds as before. Routing is selection
work and is timed as ``policy``. Off by default: with the embedded pool it changed nothing measurable on dev prompts
(docs/concepts.md, "Match routing").

**Prefill gate** (``prefill_gate``, off by default; under the `speed` reward with a policy that learns from rewards):
a drafter's first draft of a call needs its prompt prefill, which the round costs leave out (every method pays it
once) and which on a long prompt costs more than many rounds. When the policy picks an arm that has not read the
sequence yet, its prefill is predicted from its earlier ones (`hf_metasd.costs.PrefillCosts`) and compared with
what the arm can save over the tokens the length budget leaves, at its mean reward against the best arm that needs
no prefill (`_prefill_outweighs_gain`); if the prefill costs more than that and more than a plain step, the arm is
skipped like an abstaining one (not a pull; the round goes to `Policy.fallback`) and `MetaSDStats.prefill_skips`
counts it. Before two measured prefills of an arm (`hf_metasd.costs.MIN_PREFILLS`), or without a reward or prior for
it, nothing is skipped.

**Confidence stop** (``confidence_stop``, off by default; needs the no-draft arm): a model drafter
(`Drafter.stops_on_confidence`) stops drafting after token :math:`k` once the product of its drafted tokens'
probabilities :math:`P_k` falls below :math:`\hat d_a / \hat c_{plain}`, its measured seconds per drafting step over
the measured seconds of a plain target step. Token :math:`k + 1` can only be accepted if the first :math:`k` are, so
it is worth at most :math:`P_k` target steps, less than the drafting step it costs. Both costs are measured on this
machine (smoothed, cached per process like the round costs: `hf_metasd.costs.CostModel`); before both are known
the drafter drafts the full length. A drafter that knows nothing (an untrained model: :math:`P_1 \approx 1/V`) then
drafts one token per pull instead of `num_assistant_tokens`. Off by default: on dev prompts it changed nothing
measurable (docs/concepts.md, "Confidence stop").

Bandit maths lives in `hf_metasd.policies`, model code in `hf_metasd.drafters`, reward maths in `hf_metasd.rewards`
and `hf_metasd.feedback`, costs in `hf_metasd.costs`.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.generation.candidate_generator import CandidateGenerator

from ._validation import check_int
from .costs import CostModel, PrefillCosts, object_key
from .draft_length import DraftLength, check_draft_length_mode, match_class
from .drafters import Drafter, unique_names
from .drafters.prompt_lookup import forbidden_tokens
from .errors import MetaSDConfigError, PolicyArmError
from .feedback import (
    ReplayedRound,
    counterfactual_feedback,
    replayed_accepted,
    replayed_feedback,
    warm_start_rewards,
)
from .kernels import KernelSwitch, PassKernels
from .policies import Policy
from .reward_memory import RewardMemory
from .rewards import REPLAYABLE_REWARDS, RoundFeedback, get_reward, is_cost_aware, is_replayable, reward_name
from .stats import MetaSDStats

__all__ = ["DEFAULT_NUM_ASSISTANT_TOKENS", "NO_DRAFT", "MetaCandidateGenerator"]

DEFAULT_NUM_ASSISTANT_TOKENS = 3
#: Telemetry name of the no-draft arm.
NO_DRAFT = "no_draft"


@dataclass
class _Round:
    arm: int
    tokens: torch.Tensor | None  # (N,)
    logits: torch.Tensor | None  # (N, V)
    started: float
    verify_started: float
    abstained: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0  # a drafter's first ingest of the prompt: not part of its round cost
    min_confidence: float | None = None  # the confidence stop passed to the drafter (None: none)
    first: bool = False
    start: int = 0  # sequence length at the round's start
    num_tokens: int = 0  # the round's draft length
    match_class: int | None = None  # the draft's match class (`hf_metasd.draft_length.match_class`), if it has one
    routed_from: int | None = None  # the policy's pick when match routing gave the round to another arm
    kernel: str | None = None  # the verification kernel of the round's pass (None: not chosen per pass)


class MetaCandidateGenerator(CandidateGenerator):
    """Candidate generator that lets a bandit policy pick one arm of a pool per round.

    Args:
        drafters: the call's drafters, one per arm (per-call copies: see `Drafter.spawn`).
        policy: a `Policy`; it is bound to the number of arms (reset if fresh, kept if it already learnt).
        reward: ``"speed"`` (default), ``"bd"``, ``"be"``, ``"eal"``, ``"cost"`` or a callable
            ``f(RoundFeedback) -> float``.
        num_assistant_tokens: draft length ``N`` per round, capped by the length budget.
        logits_processor: the target's `LogitsProcessorList`; drafters apply it too, so that drafted tokens and the
            logits used by speculative sampling and the rewards are the processed ones.
        generation_config: the call's `GenerationConfig` (for `do_sample` and `max_length`).
        full_information: after each round, also score every drafter with logits on the round's accepted tokens (it
            catches up on them, which it must do anyway before it drafts again) and pass those counterfactual rewards
            to `policy.update_all`.
        warm_start: prompt warm start over the last `warm_start` prompt positions (0: off): the target's prefill
            also returns its logits there, every drafter with logits keeps its own while prefilling the prompt, and
            before round 2 each gets one observation, its ``1 - TV`` averaged over the window (BD on the prompt).
        no_draft: whether the pool has the no-draft arm (``None``: exactly when the reward is cost-aware).
        replay: replayed rounds (see the module docstring); ``None``: on under greedy decoding when the reward can
            score them and the policy `learns_side_observations`.
        confidence_stop: the confidence stop of model drafters (see the module docstring); needs the no-draft arm
            (whose plain-step cost it reads).
        learned_priors: record the rewards the policy learns from for later calls' priors (`RewardMemory`).
        draft_length: ``"measured"``: each round drafts the length, at most `num_assistant_tokens`, that this
            machine verifies fastest per expected token (`hf_metasd.draft_length`); ``"fixed"``: always
            `num_assistant_tokens`.
        match_routing: match routing (see the module docstring).
        prefill_gate: the prefill gate (see the module docstring); acts only under the `speed` reward with a policy
            that learns from rewards.
        target: the target model (its process-level cost cache; see `CostModel`).
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
        >>> gen = MetaCandidateGenerator(pool, get_policy("ucb"), num_assistant_tokens=3,
        ...                              generation_config=GenerationConfig(max_length=32))
        >>> candidates, logits = gen.get_candidates(torch.tensor([[1, 2, 3]]))
        >>> candidates.shape, logits.shape, gen.stats.drafter_names
        (torch.Size([1, 6]), torch.Size([1, 3, 64]), ['d0', 'd1', 'no_draft'])
    """

    def __init__(
        self,
        drafters: Sequence[Drafter],
        policy: Policy,
        *,
        reward: str | Callable[[RoundFeedback], float] = "speed",
        num_assistant_tokens: int = DEFAULT_NUM_ASSISTANT_TOKENS,
        logits_processor: Any = None,
        generation_config: Any = None,
        full_information: bool = False,
        warm_start: int = 0,
        no_draft: bool | None = None,
        replay: bool | None = None,
        confidence_stop: bool = False,
        learned_priors: bool = False,
        draft_length: str = "measured",
        match_routing: bool = False,
        prefill_gate: bool = False,
        target: Any = None,
        cost_smoothing: float = 0.3,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if not drafters:
            raise MetaSDConfigError(
                "`assistant_models` must hold at least one drafter, but is empty. Pass e.g. `assistant_models=[drafter]`."
            )
        check_int(
            "num_assistant_tokens",
            num_assistant_tokens,
            low=1,
            hint=f"Use e.g. {DEFAULT_NUM_ASSISTANT_TOKENS}.",
            error=MetaSDConfigError,
        )
        if not isinstance(warm_start, int) or isinstance(warm_start, bool) or warm_start < 0:
            raise MetaSDConfigError(
                f"`meta_warm_start` must be an int >= 0 (prompt positions), but is {warm_start!r}. "
                "Use e.g. 16, or 0 for off."
            )
        if not isinstance(policy, Policy):
            raise TypeError(f"`policy` must be a `Policy`, but is {type(policy).__name__}. Use `get_policy(name)`.")
        self.reward = get_reward(reward)
        self.cost_aware = is_cost_aware(reward)
        if no_draft is None:
            no_draft = self.cost_aware
        if no_draft and not self.cost_aware:
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
        self.num_assistant_tokens = num_assistant_tokens
        self.logits_processor = logits_processor
        self.do_sample = bool(getattr(generation_config, "do_sample", False))
        self.max_length = getattr(generation_config, "max_length", None)
        self.full_information = full_information
        self.replay = self._replay_setting(replay, reward)
        self._replayable = [arm for arm, d in enumerate(self.drafters) if d.replayable] if self.replay else []
        self._replays: list[ReplayedRound] = []
        if not isinstance(match_routing, bool):
            raise MetaSDConfigError(
                f"`meta_match_routing` must be True or False, but is {match_routing!r}. Pass a bool."
            )
        self.match_routing = match_routing
        self._routable = [arm for arm, d in enumerate(self.drafters) if d.scores_matches] if match_routing else []
        self.warm_start = warm_start
        # transformers' loop passes the target's outputs to `get_candidates` and merges `model_kwargs_overrides` into
        # the target's inputs when this is set: the warm start uses both, once.
        self.requires_model_outputs = warm_start > 0
        self.model_kwargs_overrides: dict[str, Any] = {}
        names = unique_names(self.drafters) + ([NO_DRAFT] if self.no_draft else [])
        stats_kwargs = {} if clock is None else {"clock": clock}
        self.stats = MetaSDStats(
            drafter_names=names,
            policy=policy.name or type(policy).__name__,
            reward=reward_name(reward),
            num_assistant_tokens=num_assistant_tokens,
            **stats_kwargs,
        )
        self.clock = self.stats.clock
        keys = [_cost_key(d) for d in self.drafters] + ([NO_DRAFT] if self.no_draft else [])
        self.costs = CostModel(keys, smoothing=cost_smoothing, target=target)
        self.prefills = PrefillCosts(keys[: len(self.drafters)], target=target)
        self.prefill_gate = self._prefill_gate_setting(prefill_gate, reward)
        # seconds per drafting step (a forward of one drafted token), for the confidence stop
        self.step_costs = CostModel(
            [("draft_step", key) for key in keys[: len(self.drafters)]], smoothing=cost_smoothing, target=target
        )
        self.confidence_stop = self._confidence_stop_setting(confidence_stop, reward)
        self.draft_length = check_draft_length_mode(draft_length)
        # verification costs by length are measured in every mode (telemetry); only "measured" chooses by them
        self.lengths = DraftLength(
            self.num_arms, num_assistant_tokens, keys=keys, target=target, smoothing=cost_smoothing
        )
        # what this call's policy learns, kept for the next call's priors (a registered reward only: a callable's
        # values mean nothing to another call)
        self.memory = (
            RewardMemory(keys, context=(reward, num_assistant_tokens, self.do_sample), target=target)
            if learned_priors and isinstance(reward, str)
            else None
        )
        self._prompt_length: int | None = None
        self._warm_window = 0
        self._warm_logits: dict[int, torch.Tensor] = {}
        self._pending: _Round | None = None
        self._deferred: list[RoundFeedback] = []  # prefill-round feedback waiting for its arm's cost
        self._last_arm: int | None = None
        self._pass_kernels: PassKernels | None = None
        self._kernel_switch: KernelSwitch | None = None
        self._seen: set[int] = set()

    def _replay_setting(self, replay: bool | None, reward: Any) -> bool:
        """`replay` resolved: ``None`` becomes whether replayed rounds apply; ``True`` where they cannot is refused."""
        if replay is not None and not isinstance(replay, bool):
            raise MetaSDConfigError(
                f"`meta_replay` must be True, False or None (automatic), but is {replay!r}. Pass a bool, or leave it out."
            )
        problems = []
        if self.do_sample:
            problems.append(("greedy decoding", "`do_sample` is True"))
        if not is_replayable(reward):
            problems.append((f"a reward of {sorted(REPLAYABLE_REWARDS)}", f"the reward is {reward_name(reward)!r}"))
        if not self.policy.learns_side_observations:
            name = self.policy.name or type(self.policy).__name__
            problems.append(("a policy that learns side observations", f"the policy is {name!r}"))
        if replay is None:
            return not problems
        if replay and problems:
            needs, but = problems[0]
            raise MetaSDConfigError(
                f"`meta_replay` needs {needs}, but {but}. Pass `meta_replay=False`, or leave it out (automatic)."
            )
        return replay

    def _prefill_gate_setting(self, prefill_gate: bool, reward: Any) -> bool:
        """`prefill_gate` checked (a bool); it acts only under the `speed` reward with a policy that uses rewards."""
        if not isinstance(prefill_gate, bool):
            raise MetaSDConfigError(
                f"`meta_prefill_gate` must be True or False, but is {prefill_gate!r}. Pass a bool."
            )
        return prefill_gate and reward == "speed" and self.no_draft and self.policy.uses_rewards

    def _confidence_stop_setting(self, confidence_stop: bool, reward: Any) -> bool:
        """`confidence_stop` checked: a bool, and True only with the no-draft arm."""
        if not isinstance(confidence_stop, bool):
            raise MetaSDConfigError(
                f"`meta_confidence_stop` must be True or False, but is {confidence_stop!r}. Pass a bool."
            )
        if confidence_stop and not self.no_draft:
            raise MetaSDConfigError(
                "`meta_confidence_stop` needs the no-draft arm (it compares a drafting step with a plain step), but "
                f"this call has none (reward {reward_name(reward)!r}). Use `meta_reward='speed'`, or "
                "`meta_confidence_stop=False`."
            )
        return confidence_stop

    def _min_confidence(self, arm: int) -> float | None:
        """The confidence stop for `arm`: its seconds per drafting step over a plain step's, once both are known."""
        if not self.confidence_stop or not self.drafters[arm].stops_on_confidence:
            return None
        step, plain = self.step_costs.estimate(arm), self.costs.estimate(self.no_draft_arm)
        if step is None or not plain:
            return None
        return step / plain

    def use_kernels(self, kernels: PassKernels, switch: KernelSwitch) -> None:
        """Choose each verification pass's kernel with `kernels` and apply it through `switch` (the switch of the
        `skinny_linear` patch around the call; see `hf_metasd.kernels`)."""
        self._pass_kernels, self._kernel_switch = kernels, switch

    # ------------------------------------------------------------------ get_candidates
    def get_candidates(
        self, input_ids: torch.LongTensor, **kwargs: Any
    ) -> tuple[torch.LongTensor, torch.Tensor | None]:
        """Select an arm, let it draft; returns ``(1, L + n)`` candidate ids and ``(1, n, V)`` logits or None."""
        started = self.clock()
        if input_ids.shape[0] != 1:
            raise MetaSDConfigError(
                f"batch size must be 1 for MetaSD, but is {input_ids.shape[0]}. Call `generate` once per prompt."
            )
        first = self._start_round(input_ids, kwargs.get("model_outputs"))
        selected = self._select(first)
        arm = self._route(selected, input_ids)
        num_tokens = self._draft_length(input_ids, arm)
        pending = _Round(
            arm, None, None, started, started, first=first, start=input_ids.shape[1], num_tokens=num_tokens
        )
        pending.routed_from = None if arm == selected else selected
        tokens, logits = self._draft(pending, input_ids, num_tokens, warm=first and self._warm_window > 0)
        if self._pass_kernels is not None and not first:  # the first pass holds the prompt: too many rows
            rows = 1 + (0 if tokens is None else tokens.shape[-1])
            pending.kernel = self._pass_kernels.choose(rows)
            if pending.kernel is not None:
                switch = self._kernel_switch
                if rows == 1:  # a plain step: "skinny" is the row repeated twice; the drafters' steps never are
                    switch.one_row = pending.kernel == "skinny"
                else:
                    switch.skinny = pending.kernel == "skinny"
        pending.verify_started = self.clock()
        self._pending = pending
        if first and self._warm_window:
            # the target's first pass keeps its logits from position L - w - 1 on: the window and what was drafted
            # (fewer than `num_tokens` when the drafter stopped early or abstained)
            drafted = 0 if tokens is None else tokens.shape[-1]
            self.model_kwargs_overrides = {"logits_to_keep": self._warm_window + drafted + 1}
        if tokens is None:
            return input_ids, None
        pending.tokens = tokens[0]
        pending.logits = None if logits is None else logits[0]
        return torch.cat([input_ids, tokens.to(input_ids.device)], dim=-1), logits

    def _start_round(self, input_ids: torch.LongTensor, model_outputs: Any) -> bool:
        """First round: remember the prompt. Round 2: the prompt warm start. Returns whether this is round 1."""
        if self._prompt_length is None:
            self._prompt_length = input_ids.shape[1]
            self._warm_window = min(self.warm_start, input_ids.shape[1] - 1)
            return True
        if self._warm_window and model_outputs is not None:
            with self.stats.timed("warm_start"):
                self._apply_warm_start(input_ids, model_outputs)
        return False

    def _select(self, first: bool) -> int:
        """The policy's arm; the no-draft arm for the calibration round (see the module docstring)."""
        if (
            not first
            and self.no_draft
            and self.policy.uses_rewards
            and self.costs.estimate(self.no_draft_arm) is None
            and self.stats.rounds > 0
            and self.no_draft_arm not in self.stats.arms
        ):
            return self.no_draft_arm
        with self.stats.timed("policy"):
            choice = self.policy.select()
        return self._check_arm(choice, "select")

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

    def _route(self, selected: int, input_ids: torch.LongTensor) -> int:
        """Match routing (see the module docstring): the arm among those that score matches whose proposal after
        `input_ids` continues the longest match (then the most supported, then `selected`); `selected` itself when it
        does not score matches."""
        cap = self._length_cap(input_ids)
        if selected not in self._routable or len(self._routable) < 2 or cap == 0:
            return selected
        with self.stats.timed("policy"):
            best, best_key = selected, self._match_key(selected, input_ids, cap)
            for arm in self._routable:
                if arm != selected:
                    key = self._match_key(arm, input_ids, cap)
                    if key > best_key:
                        best, best_key = arm, key
        return best

    def _match_key(self, arm: int, input_ids: torch.LongTensor, num_tokens: int) -> tuple[int, int]:
        """``(match length, support)`` of `arm`'s proposal after `input_ids`; ``(-1, -1)`` when it would abstain."""
        drafter = self.drafters[arm]
        tokens, _ = drafter.draft(input_ids, num_tokens, do_sample=False)
        if tokens.shape[-1] == 0:
            return (-1, -1)
        return (int(drafter.last_match_length), int(drafter.last_support))

    def _length_cap(self, input_ids: torch.LongTensor) -> int:
        """`num_assistant_tokens`, capped by the length budget (the last position is the target's own token)."""
        cap = self.num_assistant_tokens
        if self.max_length is not None:
            cap = max(0, min(cap, self.max_length - input_ids.shape[1] - 1))
        return cap

    def _draft_length(self, input_ids: torch.LongTensor, arm: int) -> int:
        """Tokens `arm` drafts this round: the length budget's cap, and under ``"measured"`` the length this machine
        verifies fastest per expected token (`DraftLength.choose`)."""
        cap = self._length_cap(input_ids)
        if self.draft_length == "fixed" or arm == self.no_draft_arm or self._cut_by_match(arm):
            return cap
        return self.lengths.choose(arm, cap)

    def _cut_by_match(self, arm: int) -> bool:
        """Whether `arm` drafts the cap and is cut by its match class (`DraftLength`, "Match classes")."""
        return self.draft_length == "measured" and arm != self.no_draft_arm and self.drafters[arm].scores_matches

    def _cut(self, arm: int, tokens: torch.LongTensor) -> tuple[torch.LongTensor, int | None]:
        """`tokens` ``(1, n)`` of a drafter that scores matches, cut to the length its match class reads best, and
        that class; other arms' tokens as they are."""
        if not self._cut_by_match(arm) or tokens.shape[-1] == 0:
            return tokens, None
        match = match_class(self.drafters[arm].last_match_length)
        return tokens[:, : self.lengths.choose(arm, tokens.shape[-1], match)], match

    def _draft(
        self, pending: _Round, input_ids: torch.LongTensor, num_tokens: int, *, warm: bool
    ) -> tuple[torch.LongTensor | None, torch.Tensor | None]:
        """Let `pending.arm` catch up and draft; on abstention, ask the policy's fallback (bounded by the pool), which
        drafts the length chosen for it."""
        for _ in range(self.num_arms):
            arm = pending.arm
            if arm == self.no_draft_arm or num_tokens == 0:
                return None, None
            if arm not in self._seen and self._prefill_outweighs_gain(arm, input_ids):
                self.stats.prefill_skips += 1
            else:
                self._catch_up(pending, input_ids, warm=warm)
                drafter = self.drafters[arm]
                pending.min_confidence = self._min_confidence(arm)
                stop = {} if pending.min_confidence is None else {"min_confidence": pending.min_confidence}
                start = self.clock()
                with self.stats.timed("draft"):
                    tokens, logits = drafter.draft(
                        input_ids, num_tokens, logits_processor=self.logits_processor, do_sample=self.do_sample, **stop
                    )
                if self.confidence_stop and drafter.stops_on_confidence and tokens.shape[-1] > 1:
                    # the first token comes from the catch-up's logits; each further one cost one forward
                    self.step_costs.observe(arm, (self.clock() - start) / (tokens.shape[-1] - 1))
                self._last_arm = arm
                if tokens.shape[-1] > 0:
                    tokens, pending.match_class = self._cut(arm, tokens)
                    if pending.match_class is not None:
                        pending.num_tokens = tokens.shape[-1]
                        logits = None if logits is None else logits[:, : tokens.shape[-1]]  # (1, n, V) with the cut
                    return tokens, logits
            # The drafter abstained (nothing to propose, e.g. no n-gram match), or its prompt prefill would cost more
            # than it can gain in this call. That is not a pull: nothing is learnt about its drafts, so the policy
            # is not updated; the round goes to the policy's fallback.
            pending.abstained.append(arm)
            with self.stats.timed("policy"):
                fallback = self.policy.fallback(set(pending.abstained))
            if fallback is None:
                return None, None
            pending.arm = self._check_arm(fallback, "fallback")
            # the length was chosen for the arm that abstained: the fallback drafts its own (`DraftLength.choose`),
            # and replayed rounds score the other arms at it too (the length this round's verification pass checks)
            num_tokens = pending.num_tokens = self._draft_length(input_ids, pending.arm)
        return None, None

    def _catch_up(self, pending: _Round, input_ids: torch.LongTensor, *, warm: bool) -> None:
        # A drafter that also drafted the previous round only ingests the accepted + bonus tokens: ordinary drafting
        # cost. Its first ingest of the sequence is its prompt prefill (any drafter pays it, alone or in a pool).
        # Anything else (rounds missed while other arms ran) is the cost of switching: catch-up.
        arm, drafter = pending.arm, self.drafters[pending.arm]
        part = "draft" if self._last_arm == arm else ("catch_up" if arm in self._seen else "prefill")
        setup = drafter.setup_seconds
        start = self.clock()
        with self.stats.timed(part):
            if warm and drafter.returns_logits:
                # logits at positions L - w - 1 .. L - 1; the first w predict the last w prompt tokens
                logits = drafter.catch_up(input_ids, return_logits=self._warm_window + 1)
                if logits is not None and logits.shape[1] == self._warm_window + 1:
                    self._warm_logits[arm] = logits[0, : self._warm_window]
            else:
                drafter.catch_up(input_ids)
        if part == "prefill":
            seconds = self.clock() - start
            pending.prefill_seconds += seconds
            # one-time set-up inside the catch-up (`Drafter.setup_seconds`) is not what the next prefill costs
            self.prefills.observe(
                arm, seconds=seconds - (drafter.setup_seconds - setup), tokens=int(input_ids.shape[1])
            )
        self._seen.add(arm)

    def _prefill_outweighs_gain(self, arm: int, input_ids: torch.LongTensor) -> bool:
        r"""Whether `arm`'s prompt prefill, predicted from its earlier ones (`PrefillCosts`), would cost more than
        the arm can save over the rest of this call (the **prefill gate**; see the module docstring).

        Under the `speed` reward a round of arm :math:`a` costs :math:`\hat c_{plain} / ((N + 1)\,\mu_a)` seconds
        per token (:math:`\mu_a` its mean reward, priors included), so over the :math:`R` tokens the length budget
        leaves, switching to :math:`a` from the best arm :math:`b` that needs no prefill (an arm already in the
        sequence, or the target alone at :math:`\mu = 1 / (N + 1)`) saves

        .. math:: G = \frac{R\, \hat c_{plain}}{N + 1} \left(\frac{1}{\mu_b} - \frac{1}{\mu_a}\right),

        and the arm is skipped when :math:`\hat P_a(L) > \max(G, \hat c_{plain})`. A prefill that costs at most one
        plain step is left to the policy (it costs less than the round that explores the arm; on short prompts a
        gate without this bound kept the policy from exploring, 1.51x against 1.55x plain on dev prompts). Nothing is
        skipped before the quantities are measured (the arm's prefills, a plain step's cost, any reward or
        prior of the arm) or without a length budget.
        """
        if not self.prefill_gate or self.max_length is None:
            return False
        length = int(input_ids.shape[1])
        predicted, plain = self.prefills.estimate(arm, tokens=length), self.costs.estimate(self.no_draft_arm)
        counts = self.policy.effective_counts()
        if predicted is None or not plain or counts[arm] == 0 or predicted <= plain:
            return False
        means = self.policy.means()
        rounds = self.num_assistant_tokens + 1.0
        best = max([1.0 / rounds] + [means[a] for a in self._seen if a != arm and counts[a] > 0])
        if means[arm] <= best:
            return True
        gain = (self.max_length - length) * plain / rounds * (1.0 / best - 1.0 / means[arm])
        return predicted > gain

    def _apply_warm_start(self, input_ids: torch.LongTensor, model_outputs: Any) -> None:
        """Before round 2: one BD observation on the prompt window per drafter with logits (see `warm_start`)."""
        window, length = self._warm_window, self._prompt_length
        self._warm_window = 0
        self.model_kwargs_overrides = {}
        rewards = warm_start_rewards(
            self.drafters, input_ids, model_outputs, window, length, self._warm_logits, seen=self._seen
        )
        # BD of two distributions is a number; NaN means the drafter's logits were none (e.g. NaN weights): such a
        # drafter could not have drafted there, so it is not observed (as an abstaining one is not)
        rewards = {arm: reward for arm, reward in rewards.items() if not math.isnan(reward)}
        for arm, reward in rewards.items():
            self.policy.update(arm, reward)
        self.stats.warm_start_rewards = rewards

    # ------------------------------------------------------------------ update_candidate_strategy
    def update_candidate_strategy(
        self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int, *, num_kept: int | None = None
    ) -> None:
        """Learn from the verification of this round: `scores` ``(1, n + 1, V)`` are the target's processed logits,
        `num_matches` the drafted tokens it accepted, `num_kept` the tokens the round added after stopping criteria
        (default: ``num_matches + 1``)."""
        pending, self._pending = self._pending, None
        if self._kernel_switch is not None:
            self._kernel_switch.one_row = False  # only for the verification pass it was set for: drafters never
        if pending is None:  # called without get_candidates: nothing to learn
            return
        drafted = 0 if pending.tokens is None else int(pending.tokens.shape[0])
        accepted = min(int(num_matches), drafted)
        kept = accepted + 1 if num_kept is None else int(num_kept)
        feedback = self._feedback(pending, scores, accepted)
        reward = None
        if feedback is not None:
            reward = self._learn(feedback, input_ids, scores, pending)
        if self.replay:
            self.stats.replay_rewards.append(self._replay(pending, feedback, input_ids, scores.shape[-1]))
        stats = self.stats
        stats.arms.append(pending.arm)
        stats.drafted.append(drafted)
        stats.accepted.append(min(accepted, kept))
        stats.new_tokens.append(kept)
        stats.rewards.append(reward)
        stats.abstained.append(list(pending.abstained))
        stats.routed_from.append(pending.routed_from)
        stats.kernels.append(pending.kernel)
        stats.min_confidence.append(pending.min_confidence)
        stats.match_classes.append(pending.match_class)
        stats.catch_up_tokens.append(
            self.drafters[pending.arm].last_catch_up_tokens if pending.arm != self.no_draft_arm else 0
        )

    def _feedback(self, pending: _Round, scores: torch.Tensor, accepted: int) -> RoundFeedback | None:
        """The round as the reward sees it; folds the round's measured cost into the cost model.

        Returns None when the policy is not to learn from this round: a plain step that the policy did not choose
        (every drafter it asked abstained and the fallback gave up), or the length limit left nothing to draft.
        """
        arm = pending.arm
        is_plain = pending.tokens is None
        now = self.clock()
        seconds = now - pending.started
        drafted = 0 if is_plain else int(pending.tokens.shape[0])
        if not pending.first:  # the first round's pass is the prompt's prefill
            verify = now - pending.verify_started
            kernels = self._pass_kernels
            if kernels is None or pending.kernel is None or pending.kernel == kernels.best(drafted + 1):
                self.lengths.observe_verification(drafted + 1, verify)  # a re-check of the other kernel is not
            if kernels is not None:
                kernels.observe(drafted + 1, pending.kernel, verify)
            if is_plain and self.no_draft:
                self.costs.observe(self.no_draft_arm, seconds)
            elif not is_plain:
                self.costs.observe(arm, seconds - pending.prefill_seconds)
        if not is_plain:
            self.lengths.observe_acceptance(arm, drafted, accepted, pending.match_class)
            if not pending.first:
                self.lengths.observe_draft(
                    arm, drafted, pending.verify_started - pending.started - pending.prefill_seconds
                )
        if is_plain and arm != self.no_draft_arm:
            return None
        tokens = pending.tokens if not is_plain else scores.new_zeros(0, dtype=torch.long)
        return RoundFeedback(
            arm=arm,
            draft_tokens=tokens,
            target_logits=scores[0, : tokens.shape[0]],
            draft_logits=pending.logits,
            num_accepted=accepted,
            seconds=seconds,
            draft_seconds=pending.verify_started - pending.started,
            do_sample=self.do_sample,
            num_assistant_tokens=self.num_assistant_tokens,
            arm_seconds=self.costs.estimate(arm),
            plain_seconds=self.costs.estimate(self.no_draft_arm) if self.no_draft else None,
        )

    def _reward(self, feedback: RoundFeedback) -> float | None:
        """The reward of `feedback`, or None while a cost-aware reward's costs are unknown."""
        if self.cost_aware and (feedback.arm_seconds is None or feedback.plain_seconds is None):
            return None
        with self.stats.timed("reward"):
            return float(self.reward(feedback))

    def _learn(
        self, feedback: RoundFeedback, input_ids: torch.LongTensor, scores: torch.Tensor, pending: _Round
    ) -> float | None:
        """Update the policy with this round (and any deferred prefill round whose cost is now known)."""
        still_deferred = []
        for old in self._deferred:
            old.arm_seconds = self.costs.estimate(old.arm)
            old.plain_seconds = self.costs.estimate(self.no_draft_arm) if self.no_draft else None
            late = self._reward(old)
            if late is None:
                still_deferred.append(old)
                continue
            self._tell(old.arm, late)
            self.stats.rewards[0] = late  # the prefill round is round 0
        self._deferred = still_deferred
        reward = self._reward(feedback)
        if reward is None:
            if pending.first:
                self._deferred.append(feedback)
            return None
        self._tell(feedback.arm, reward)
        if self.full_information:
            self._learn_counterfactual(feedback, input_ids, scores, reward)
        return reward

    def _replay_draft(
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

    def _first_position_filter(self, prefix: torch.LongTensor, vocab_size: int) -> Callable[[int], bool]:
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

    def _replay(
        self, pending: _Round, feedback: RoundFeedback | None, input_ids: torch.LongTensor, vocab_size: int
    ) -> list[tuple[int, float]]:
        """Replayed rounds (see the module docstring): propose for this round, observe every proposal now decided.

        Returns the ``(arm, reward)`` side observations made after this round (telemetry).
        """
        prefix = input_ids[:, : pending.start]
        verify = None if feedback is None or pending.tokens is None or pending.first else feedback.seconds
        if verify is not None:
            verify -= feedback.draft_seconds
        first_token = int(input_ids[0, pending.start]) if input_ids.shape[1] > pending.start else None
        allowed = self._first_position_filter(prefix, vocab_size)
        for arm in self._replayable:
            if arm == pending.arm or arm in pending.abstained or pending.num_tokens == 0:
                continue
            begin = self.clock()
            # an arm cut by its match class proposes what it would have drafted itself: the cap, cut by its class
            length = self._length_cap(prefix) if self._cut_by_match(arm) else pending.num_tokens
            with self.stats.timed("replay"):
                tokens = self._replay_draft(arm, prefix, length, first_token, allowed)
                tokens, match = self._cut(arm, tokens)
            seconds = self.clock() - begin
            if tokens.shape[-1] == 0:  # it would have abstained: nothing to learn, as in a real round
                continue
            self._replays.append(ReplayedRound(arm, pending.start, tokens[0].tolist(), seconds, match))
            if verify is not None:  # its round's cost: its proposing, this round's verification
                self.costs.observe(arm, verify + seconds)
        plain = self.costs.estimate(self.no_draft_arm) if self.no_draft else None
        observed: list[tuple[int, float]] = []
        sequence = input_ids[0].tolist()
        waiting = []
        for replayed in self._replays:
            with self.stats.timed("replay"):
                accepted = replayed_accepted(replayed, sequence)
                if accepted is None:
                    waiting.append(replayed)
                    continue
                self.lengths.observe_acceptance(replayed.arm, len(replayed.tokens), accepted, replayed.match_class)
                decided = replayed_feedback(
                    replayed,
                    accepted,
                    sequence,
                    vocab_size,
                    num_assistant_tokens=self.num_assistant_tokens,
                    arm_seconds=self.costs.estimate(replayed.arm),
                    plain_seconds=plain,
                )
            value = self._reward(decided)
            if value is not None:
                observed.append((replayed.arm, value))
        self._replays = waiting
        if self.no_draft and pending.arm != self.no_draft_arm and plain is not None:
            observed.append((self.no_draft_arm, self._no_draft_reward(plain, vocab_size)))
        for arm, value in observed:
            self._tell(arm, value, side=True)
        return observed

    def _tell(self, arm: int, reward: float, *, side: bool = False) -> None:
        """Give the policy a reward (a pull's, or with `side` a side observation) and remember it for later calls."""
        with self.stats.timed("policy"):
            if side:
                self.policy.observe(arm, reward)
            else:
                self.policy.update(arm, reward)
            if self.memory is not None:
                self.memory.record(arm, reward)

    def _no_draft_reward(self, plain_seconds: float, vocab_size: int) -> float:
        """The reward of a plain step, known without one (the no-draft arm drafts nothing and costs a plain step;
        under `speed`, :math:`1 / (N + 1)`)."""
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
            return float(self.reward(plain_round))

    def _learn_counterfactual(
        self, feedback: RoundFeedback, input_ids: torch.LongTensor, scores: torch.Tensor, reward: float
    ) -> None:
        """Full information: every other drafter with logits is scored on this round's accepted window."""
        rewards = {feedback.arm: reward}
        accepted_by = {feedback.arm: feedback.num_accepted}
        with self.stats.timed("catch_up"):
            observed = counterfactual_feedback(
                self.drafters, feedback, input_ids, scores, self.num_assistant_tokens, skip={feedback.arm}
            )
        for other, (counterfactual, matches) in observed.items():
            if not _is_distribution(counterfactual.draft_logits):
                continue  # it could not have drafted here (e.g. NaN logits): not observed, as an abstaining arm
            counterfactual.arm_seconds = self.costs.estimate(other)
            counterfactual.plain_seconds = feedback.plain_seconds
            value = self._reward(counterfactual)
            if value is not None:
                rewards[other] = value
                accepted_by[other] = matches
        if self.no_draft and self.no_draft_arm != feedback.arm and feedback.plain_seconds is not None:
            rewards[self.no_draft_arm] = self._no_draft_reward(feedback.plain_seconds, scores.shape[-1])
        self.stats.counterfactual_rewards.append(rewards)
        self.stats.counterfactual_accepted.append(accepted_by)
        with self.stats.timed("policy"):
            self.policy.update_all(rewards)


def _is_distribution(logits: torch.Tensor | None) -> bool:
    """Whether every row of `logits` ``(..., V)`` is a distribution a drafter can draft from: its largest entry is
    finite (a NaN, a ``+inf`` or a row of ``-inf`` make it NaN or infinite); ``None`` (no logits) is not checked.

    Example:
        >>> inf = float("inf")
        >>> _is_distribution(torch.tensor([[0.0, -inf]])), _is_distribution(torch.tensor([[float("nan"), 0.0]]))
        (True, False)
        >>> _is_distribution(torch.tensor([[-inf, -inf]])), _is_distribution(None)
        (False, True)
    """
    return logits is None or bool(torch.isfinite(logits.amax(dim=-1)).all())


def _cost_key(drafter: Drafter) -> tuple[Any, ...]:
    """What identifies a drafter's costs and learned rewards across calls: its kind, name, settings (`config`) and
    the object holding its weights or its corpus (shared by a drafter's `spawn` copies), by its `object_key`: not
    by its id, which a new object reuses once the old one is freed, and the entries of a freed one are swept out
    (`hf_metasd.costs.target_cache`). Two drafters of one name that differ in a setting (a corpus drafter with and
    without `context_lookup`) or in their data are two drafters."""
    holder = getattr(drafter, "model", None)
    if holder is None:
        holder = getattr(drafter, "index", None)
    settings = json.dumps(drafter.config(), sort_keys=True, default=repr)
    return (drafter.kind, drafter.name, settings, object_key(holder) if holder is not None else None)
