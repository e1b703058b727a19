"""`MetaCandidateGenerator`: transformers' candidate-generator contract over a pool of drafters.

It routes and nothing else: each round the policy selects a drafter, that drafter catches up and drafts, and after
the target verified, the reward is computed from the logits verification produced and fed back to the policy. Bandit
maths lives in `hf_metasd.policies`, model code in `hf_metasd.drafters`, rewards in `hf_metasd.rewards`.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.generation.candidate_generator import CandidateGenerator

from .drafters import Drafter, unique_names
from .errors import MetaSDConfigError, PolicyArmError
from .policies import Policy
from .rewards import RoundFeedback, block_divergence, get_reward, reward_name
from .stats import MetaSDStats

__all__ = ["MetaCandidateGenerator"]

DEFAULT_NUM_ASSISTANT_TOKENS = 5


@dataclass
class _Round:
    arm: int
    tokens: torch.Tensor | None  # (N,)
    logits: torch.Tensor | None  # (N, V)
    started: float
    verify_started: float


class MetaCandidateGenerator(CandidateGenerator):
    """Candidate generator that lets a bandit policy pick one drafter of a pool per round.

    Args:
        drafters: the pool, one `Drafter` per arm (see `hf_metasd.drafters.as_drafters`).
        policy: a `Policy`; it is bound to ``len(drafters)`` arms (reset if fresh, kept if it already learnt).
        reward: ``"bd"`` (default), ``"be"``, ``"cost"`` or a callable ``f(RoundFeedback) -> float``.
        num_assistant_tokens: draft length ``N`` per round (constant schedule), capped by the length budget.
        logits_processor: the target's `LogitsProcessorList`; drafters apply it too, so that drafted tokens and the
            logits used by speculative sampling and BD are the processed ones.
        generation_config: the call's `GenerationConfig` (for `do_sample` and `max_length`).
        full_information: after each round, also score every drafter that catches up on the round's accepted tokens
            against the target (``1 - TV`` at those positions) and pass those counterfactual rewards to
            `policy.update_all`. Costs each drafter one forward pass per round.
        warm_start: prompt warm start over a window of the last `warm_start` prompt positions (0: off). The target's
            first forward pass (its prefill, in round 1) is asked for its logits on that window too
            (`model_kwargs_overrides`), every drafter with logits prefills the prompt (which it must do anyway before
            it drafts) keeping its logits on the same window, and before round 2 each such drafter's
            ``1 - TV(p_target, q_drafter)`` averaged over the window is given to the policy as one observation. This
            replaces the forced first pull of each drafter (UCB's "try each once"); later exploration is unchanged.
            Extra cost: the LM heads on `warm_start` positions.

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
        (torch.Size([1, 6]), torch.Size([1, 3, 64]), ['d0', 'd1'])
    """

    def __init__(
        self,
        drafters: Sequence[Drafter],
        policy: Policy,
        *,
        reward: str | Callable[[RoundFeedback], float] = "bd",
        num_assistant_tokens: int = DEFAULT_NUM_ASSISTANT_TOKENS,
        logits_processor: Any = None,
        generation_config: Any = None,
        full_information: bool = False,
        warm_start: int = 0,
    ) -> None:
        if not drafters:
            raise MetaSDConfigError(
                "`assistant_models` must hold at least one drafter, but is empty. Pass e.g. `assistant_models=[drafter]`."
            )
        if (
            not isinstance(num_assistant_tokens, int)
            or isinstance(num_assistant_tokens, bool)
            or num_assistant_tokens < 1
        ):
            raise MetaSDConfigError(
                f"`num_assistant_tokens` must be an int >= 1, but is {num_assistant_tokens!r}. "
                f"Use e.g. {DEFAULT_NUM_ASSISTANT_TOKENS}."
            )
        if not isinstance(warm_start, int) or isinstance(warm_start, bool) or warm_start < 0:
            raise MetaSDConfigError(
                f"`meta_warm_start` must be an int >= 0 (prompt positions), but is {warm_start!r}. Use e.g. 16, or 0 for off."
            )
        if not isinstance(policy, Policy):
            raise TypeError(f"`policy` must be a `Policy`, but is {type(policy).__name__}. Use `get_policy(name)`.")
        self.drafters = list(drafters)
        self.policy = policy
        self.policy.bind(len(self.drafters))
        self.reward = get_reward(reward)
        self.num_assistant_tokens = num_assistant_tokens
        self.logits_processor = logits_processor
        self.do_sample = bool(getattr(generation_config, "do_sample", False))
        self.max_length = getattr(generation_config, "max_length", None)
        self.full_information = full_information
        self.warm_start = warm_start
        # transformers' loop passes the target's outputs to `get_candidates` and merges `model_kwargs_overrides` into
        # the target's inputs when this is set: the warm start uses both, once.
        self.requires_model_outputs = warm_start > 0
        self.model_kwargs_overrides: dict[str, Any] = {}
        self._prompt_length: int | None = None
        self._warm_window = 0
        self._warm_logits: dict[int, torch.Tensor] = {}
        self.stats = MetaSDStats(
            drafter_names=unique_names(self.drafters),
            policy=policy.name or type(policy).__name__,
            reward=reward_name(reward),
            num_assistant_tokens=num_assistant_tokens,
        )
        self._pending: _Round | None = None
        self._last_arm: int | None = None
        self._seen: set[int] = set()
        for drafter in self.drafters:
            drafter.reset()

    # ------------------------------------------------------------------ step 1: select and draft
    def _select(self) -> int:
        start = time.perf_counter()
        choice = self.policy.select()
        self.stats.policy_seconds += time.perf_counter() - start
        return self._check_arm(choice, "select")

    def _check_arm(self, choice: Any, method: str) -> int:
        try:
            arm = operator.index(choice)
        except TypeError:
            arm = None
        if arm is None or not 0 <= arm < len(self.drafters):
            raise PolicyArmError(
                f"policy {self.stats.policy!r} must select an arm in [0, {len(self.drafters)}), but selected "
                f"{choice!r}. Fix `{type(self.policy).__name__}.{method}` to return a drafter index."
            )
        return arm

    def _draft_length(self, input_ids: torch.LongTensor) -> int:
        if self.max_length is None:
            return self.num_assistant_tokens
        return max(0, min(self.num_assistant_tokens, self.max_length - input_ids.shape[1] - 1))

    def _catch_up(self, arm: int, input_ids: torch.LongTensor, *, warm: bool = False) -> None:
        drafter = self.drafters[arm]
        start = time.perf_counter()
        if warm and drafter.returns_logits:
            # logits at positions L - w - 1 .. L - 1; the first w predict the last w prompt tokens
            logits = drafter.catch_up(input_ids, return_logits=self._warm_window + 1)
            if logits is not None and logits.shape[1] == self._warm_window + 1:
                self._warm_logits[arm] = logits[0, : self._warm_window]
        else:
            drafter.catch_up(input_ids)
        seconds = time.perf_counter() - start
        # A drafter that also drafted the previous round only ingests the accepted + bonus tokens: that is ordinary
        # drafting cost. Its first ingest of the sequence is its prompt prefill (any drafter pays it, alone or in a
        # pool). Anything else (rounds missed while others drafted) is the cost of switching: catch-up.
        if self._last_arm == arm:
            self.stats.draft_seconds += seconds
        elif arm not in self._seen:
            self._seen.add(arm)
            self.stats.prefill_seconds += seconds
        else:
            self.stats.catch_up_seconds += seconds

    def get_candidates(
        self, input_ids: torch.LongTensor, **kwargs: Any
    ) -> tuple[torch.LongTensor, torch.Tensor | None]:
        """Select a drafter, let it draft; returns ``(1, L + n)`` candidate ids and ``(1, n, V)`` logits or None."""
        started = time.perf_counter()
        if input_ids.shape[0] != 1:
            raise MetaSDConfigError(
                f"batch size must be 1 for MetaSD, but is {input_ids.shape[0]}. Call `generate` once per prompt."
            )
        first_round = self._prompt_length is None
        if first_round:
            self._prompt_length = input_ids.shape[1]
            self._warm_window = min(self.warm_start, input_ids.shape[1] - 1)
        elif self._warm_window and kwargs.get("model_outputs") is not None:
            self._apply_warm_start(input_ids, kwargs["model_outputs"])
        arm = self._select()
        num_tokens = self._draft_length(input_ids)
        if first_round and self._warm_window:
            self.model_kwargs_overrides = {"logits_to_keep": self._warm_window + num_tokens + 1}
        if num_tokens == 0:
            self.stats.catch_up_tokens.append(0)
            self._pending = _Round(arm, None, None, started, time.perf_counter())
            return input_ids, None
        abstained: set[int] = set()
        for _ in range(len(self.drafters)):  # bounded even if a custom `fallback` repeats an abstained arm
            self._catch_up(arm, input_ids, warm=first_round and self._warm_window > 0)
            start = time.perf_counter()
            tokens, logits = self.drafters[arm].draft(
                input_ids, num_tokens, logits_processor=self.logits_processor, do_sample=self.do_sample
            )
            now = time.perf_counter()
            self.stats.draft_seconds += now - start
            self._last_arm = arm
            if tokens.shape[-1] > 0:
                break
            # The drafter abstained (nothing to propose, e.g. no n-gram match). That is not a pull: nothing is
            # learnt about its drafts, so the policy is not updated; the round goes to the policy's fallback.
            self.stats.empty_drafts += 1
            abstained.add(arm)
            start = time.perf_counter()
            fallback = self.policy.fallback(abstained)
            self.stats.policy_seconds += time.perf_counter() - start
            if fallback is None:
                break
            arm = self._check_arm(fallback, "fallback")
        self.stats.catch_up_tokens.append(self.drafters[arm].last_catch_up_tokens)
        if tokens.shape[-1] == 0:
            self._pending = _Round(arm, None, None, started, now)
            return input_ids, None
        tokens = tokens.to(input_ids.device)
        self._pending = _Round(arm, tokens[0], None if logits is None else logits[0], started, now)
        return torch.cat([input_ids, tokens], dim=-1), logits

    def _apply_warm_start(self, input_ids: torch.LongTensor, model_outputs: Any) -> None:
        """Before round 2: score every drafter with logits on the prompt window against the target (see `warm_start`)."""
        start = time.perf_counter()
        window, length = self._warm_window, self._prompt_length
        self._warm_window = 0
        self.model_kwargs_overrides = {}
        logits = getattr(model_outputs, "logits", None)
        if logits is None or logits.shape[1] < window:
            return
        target = logits[0, :window].float()
        tokens = input_ids[0, length - window : length]
        rewards: dict[int, float] = {}
        for arm, drafter in enumerate(self.drafters):
            if not drafter.returns_logits:
                continue
            drafted = self._warm_logits.pop(arm, None)
            if drafted is None:  # prefill now, keeping the logits from position L - w - 1 on
                full = drafter.catch_up(input_ids, return_logits=input_ids.shape[1] - (length - window - 1))
                if full is None or full.shape[1] < window:
                    continue
                drafted = full[0, :window]
            self._seen.add(arm)  # its prompt prefill happened here (timed as warm start)
            rewards[arm] = block_divergence(target, tokens, drafted.to(target.device))
        for arm, reward in rewards.items():
            self.policy.update(arm, reward)
        self.stats.warm_start_rewards = rewards
        self.stats.warm_start_seconds += time.perf_counter() - start

    # ------------------------------------------------------------------ step 2: learn from verification
    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int) -> None:
        """Reward the drafter of this round from the target's processed logits `scores` ``(1, n + 1, V)``."""
        now = time.perf_counter()
        pending, self._pending = self._pending, None
        if pending is None:  # called without get_candidates: nothing to learn
            return
        self.stats.verify_seconds += now - pending.verify_started
        stats = self.stats
        stats.arms.append(pending.arm)
        if pending.tokens is None:
            stats.drafted.append(0)
            stats.accepted.append(0)
            stats.rewards.append(None)
            return
        drafted = pending.tokens.shape[0]
        accepted = min(int(num_matches), drafted)
        feedback = RoundFeedback(
            arm=pending.arm,
            draft_tokens=pending.tokens,
            target_logits=scores[0, :drafted],
            draft_logits=pending.logits,
            num_accepted=accepted,
            seconds=now - pending.started,
            draft_seconds=pending.verify_started - pending.started,
        )
        start = time.perf_counter()
        reward = float(self.reward(feedback))
        mid = time.perf_counter()
        self.policy.update(pending.arm, reward)
        if self.full_information:
            self._update_counterfactual(input_ids, scores, pending.arm, reward, accepted)
        end = time.perf_counter()
        stats.reward_seconds += mid - start
        stats.policy_seconds += end - mid
        stats.drafted.append(drafted)
        stats.accepted.append(accepted)
        stats.rewards.append(reward)

    def _update_counterfactual(
        self, input_ids: torch.LongTensor, scores: torch.Tensor, arm: int, reward: float, accepted: int
    ) -> None:
        """Full information: every other drafter scores ``1 - TV`` on this round's accepted positions for free-ish.

        Each other drafter catches up on the new tokens (which it must do anyway before it drafts again) and returns
        its logits there; positions ``L - accepted - 1 .. L - 1`` of the new sequence are those the target's `scores`
        cover, so BD is computed on the accepted tokens plus the bonus token.
        """
        rewards = {arm: reward}
        accepted_by = {arm: accepted}
        num = accepted + 1
        target = scores[0, :num]
        tokens = input_ids[0, -num:]
        for other, drafter in enumerate(self.drafters):
            if other == arm or not drafter.returns_logits:
                continue
            start = time.perf_counter()
            logits = drafter.catch_up(input_ids[:, :-1], return_logits=True)
            self.stats.catch_up_seconds += time.perf_counter() - start
            if logits is None or logits.shape[1] < num:
                continue
            rewards[other] = block_divergence(target, tokens, logits[0, -num:])
            # greedy drafts it would have accepted, observable only inside this round's verified window
            matches = (logits[0, -num:].argmax(-1).to(tokens.device) == tokens).long()
            accepted_by[other] = min(int(matches.cumprod(0).sum()), self.num_assistant_tokens)
        self.stats.counterfactual_rewards.append(rewards)
        self.stats.counterfactual_accepted.append(accepted_by)
        self.policy.update_all(rewards)
