r"""Rewards: the alignment feedback a policy learns from, computed from what verification already produced.

The built-in rewards lie in ``[0, 1]``:

* **BE** (block efficiency): :math:`n_{acc} / N`, accepted drafted tokens over drafted tokens.
* **cost** (cost-aware): tokens gained per second of round wall time, normalised by the best a free drafter could
  do, :math:`\frac{n_{acc} + 1}{N + 1} \cdot \frac{T_{verify}}{T_{draft} + T_{verify}}`, so a slower drafter with
  higher acceptance competes fairly with a faster one.
* **EAL** (expected accepted length, normalised): :math:`\frac1N \sum_{k=1}^{N} \prod_{j \le k} a_j`, with
  :math:`a_j` the probability that drafted position :math:`j` is accepted given the positions before it were:
  greedy decoding accepts a token iff it is the target's argmax, :math:`a_j = [x_j = \arg\max p_j]` (then EAL is
  exactly BE); speculative sampling accepts with probability :math:`\min(1, p_j(x_j) / q_j(x_j))`, whose expectation
  over the drafter's choice is :math:`1 - \mathrm{TV}(p_j, q_j)` (used when the drafter has logits), and a drafter
  without logits is accepted iff the target samples its token, :math:`a_j = p_j(x_j)`. See `acceptance_rates`.
* **speed** (the default): accepted tokens per second of the round, in units of the best a round could do,
  :math:`\frac{E + 1}{N + 1} \cdot \frac{\hat c_{plain}}{\hat c_{arm}}`, with :math:`E = N \cdot \mathrm{EAL}`
  the expected accepted length, :math:`N` the call's draft length (`num_assistant_tokens`), :math:`\hat c_{arm}` the
  smoothed seconds of a round of this arm and :math:`\hat c_{plain}` those of a plain target step (both from
  `hf_metasd.costs.CostModel`). The no-draft arm (a plain target step) scores :math:`1 / (N + 1)`, so a drafter
  scores above it exactly when its rounds produce tokens faster than the target alone: rewards of drafters and of
  the no-draft arm are comparable. Clipped to ``[0, 1]`` (timing noise).
* **BD** (block divergence): :math:`\frac1N \sum_{j=1}^{N} \bigl(1 - \mathrm{TV}(p_j, q_j)\bigr)` with
  :math:`\mathrm{TV}(p, q) = \tfrac12 \lVert p - q \rVert_1`, over **all** drafted positions :math:`j` (after the first
  rejection too: the target's logits there come from the same verification pass, conditioned on the drafted prefix).
  :math:`p_j` and :math:`q_j` are the softmax of the target's and the drafter's *processed* logits. A drafter without
  logits (prompt lookup) is one-hot, :math:`q_j = \delta_{x_j}`, so its term is :math:`p_j(x_j)`.

A reward is any callable ``reward(feedback: RoundFeedback) -> float``; `get_reward` resolves names.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .errors import MetaSDConfigError, MetaSDTypeError, UnknownRewardError

__all__ = [
    "COST_AWARE_REWARDS",
    "REPLAYABLE_REWARDS",
    "REWARDS",
    "RoundFeedback",
    "acceptance_rates",
    "block_divergence",
    "block_efficiency",
    "cost_aware",
    "expected_accepted_length",
    "get_reward",
    "is_cost_aware",
    "is_replayable",
    "register_reward",
    "reward_value",
    "reward_name",
    "speed",
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
        do_sample: whether the call samples (speculative sampling) or decodes greedily.
        num_assistant_tokens: the call's draft length ``N`` (a round may draft fewer: abstention, length budget).
        arm_seconds: smoothed seconds of a round of this arm (`hf_metasd.costs.CostModel`), or ``None`` if unknown.
        plain_seconds: smoothed seconds of a plain target step, or ``None`` if unknown.
        target_tokens: ``(N,)`` the target's greedy tokens at the drafted positions when they are known without its
            logits (a replayed round, `hf_metasd.feedback.replayed_feedback`), else ``None``. Greedy acceptance needs
            only them, so a round that has them may carry empty ``(N, 0)`` `target_logits`; the rewards of
            `REPLAYABLE_REWARDS` read them first.
    """

    arm: int
    draft_tokens: torch.Tensor
    target_logits: torch.Tensor
    draft_logits: torch.Tensor | None
    num_accepted: int
    seconds: float = 0.0
    draft_seconds: float = 0.0
    do_sample: bool = False
    num_assistant_tokens: int = 0
    arm_seconds: float | None = None
    plain_seconds: float | None = None
    target_tokens: torch.Tensor | None = None

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


def acceptance_rates(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_logits: torch.Tensor | None = None,
    *,
    do_sample: bool = False,
) -> torch.Tensor:
    """Per-position acceptance probabilities ``a_j`` ``(N,)`` of a draft (see the module docstring for each mode).

    Args:
        target_logits: ``(N, V)`` processed target logits at the drafted positions.
        draft_tokens: ``(N,)`` drafted tokens.
        draft_logits: ``(N, V)`` processed drafter logits, or ``None`` (deterministic drafter).
        do_sample: speculative sampling (``True``) or greedy decoding (``False``).

    Example:
        >>> import torch
        >>> p = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.7, 0.1]]))
        >>> acceptance_rates(p, torch.tensor([0, 2])).tolist()                 # greedy: argmax or not
        [1.0, 0.0]
        >>> [round(a, 3) for a in acceptance_rates(p, torch.tensor([0, 2]), do_sample=True).tolist()]
        [0.5, 0.1]
    """
    num = target_logits.shape[0]
    tokens = draft_tokens.reshape(num).to(target_logits.device)
    if not do_sample:
        return (target_logits.argmax(-1) == tokens).float()
    p = torch.softmax(target_logits.float(), dim=-1)
    if draft_logits is None:
        return p.gather(-1, tokens.reshape(num, 1)).squeeze(-1)
    q = torch.softmax(draft_logits.float().to(p.device), dim=-1)
    return (1.0 - 0.5 * (p - q).abs().sum(-1)).clamp(0.0, 1.0)


def expected_accepted_length(rates: torch.Tensor) -> float:
    """``E = sum_k prod_{j<=k} a_j``: expected accepted drafted tokens when position ``j`` is accepted with ``a_j``.

    Example:
        >>> import torch
        >>> expected_accepted_length(torch.tensor([1.0, 0.5, 0.5]))   # 1 + 0.5 + 0.25
        1.75
    """
    return float(torch.cumprod(rates.float(), dim=0).sum())


def speed(expected_accepted: float, num_assistant_tokens: int, arm_seconds: float, plain_seconds: float) -> float:
    """Tokens per second of a round over the best a round could do: ``(E + 1) / (N + 1) * c_plain / c_arm``.

    Example:
        >>> speed(3.0, 3, arm_seconds=0.1, plain_seconds=0.05)   # 4 tokens in two plain steps' time: 2x
        0.5
        >>> speed(0.0, 3, arm_seconds=0.05, plain_seconds=0.05)  # the no-draft arm: 1 / (N + 1)
        0.25
    """
    if arm_seconds <= 0 or plain_seconds <= 0:
        raise ValueError(
            f"`arm_seconds` and `plain_seconds` must be > 0, but are {arm_seconds} and {plain_seconds}. "
            "Pass measured (smoothed) round costs."
        )
    value = (expected_accepted + 1.0) / (num_assistant_tokens + 1.0) * plain_seconds / arm_seconds
    return min(1.0, max(0.0, value))


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


def _eal_tokens(feedback: RoundFeedback) -> float:
    if feedback.num_drafted == 0:
        return 0.0
    if feedback.target_tokens is not None and not feedback.do_sample:  # greedy: a_j = [x_j = the target's token]
        rates = (feedback.target_tokens.reshape(-1) == feedback.draft_tokens.reshape(-1)).float()
        return expected_accepted_length(rates)
    rates = acceptance_rates(
        feedback.target_logits, feedback.draft_tokens, feedback.draft_logits, do_sample=feedback.do_sample
    )
    return expected_accepted_length(rates)


def _eal(feedback: RoundFeedback) -> float:
    return _eal_tokens(feedback) / feedback.num_drafted


def _speed(feedback: RoundFeedback) -> float:
    if feedback.arm_seconds is None or feedback.plain_seconds is None:
        raise ValueError(
            "the `speed` reward needs `arm_seconds` and `plain_seconds` in its `RoundFeedback`, but they are None. "
            "Build the feedback with the call's `CostModel` estimates."
        )
    n = max(feedback.num_assistant_tokens, feedback.num_drafted)
    return speed(_eal_tokens(feedback), n, feedback.arm_seconds, feedback.plain_seconds)


#: name -> reward callable taking a `RoundFeedback`. Starts with the built-ins; extend with `register_reward`.
REWARDS: dict[str, Callable[[RoundFeedback], float]] = {}
#: names of the rewards that need the call's smoothed costs (`RoundFeedback.arm_seconds` / `plain_seconds`); only
#: these can compare drafters with the no-draft arm.
COST_AWARE_REWARDS: set[str] = set()


def register_reward(name: str, reward: Callable[[RoundFeedback], float], *, cost_aware: bool = False) -> None:
    """Register `reward` under `name` for ``meta_reward=name`` (refuses a name already taken).

    Args:
        name: the name.
        reward: ``f(RoundFeedback) -> float``.
        cost_aware: whether it reads the smoothed costs and scores the no-draft arm (``num_drafted == 0``).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"`name` must be a non-empty string, but is {name!r}. Pass the reward's name.")
    if not callable(reward):
        raise TypeError(f"`reward` must be callable as f(RoundFeedback) -> float, but is {type(reward).__name__}.")
    if name in REWARDS and REWARDS[name] is not reward:
        raise ValueError(f"`name` must be unused, but {name!r} is already a reward. Choose another name.")
    REWARDS[name] = reward
    if cost_aware:
        COST_AWARE_REWARDS.add(name)


for _name, _fn, _costs in (
    ("be", _be, False),
    ("bd", _bd, False),
    ("cost", _cost, False),
    ("eal", _eal, False),
    ("speed", _speed, True),
):
    _fn.__name__ = _fn.__qualname__ = _name
    register_reward(_name, _fn, cost_aware=_costs)


def get_reward(reward: str | Callable[[RoundFeedback], float]) -> Callable[[RoundFeedback], float]:
    """Resolve `meta_reward`: a name in `REWARDS` or a callable ``f(feedback) -> float``."""
    if callable(reward):
        return reward
    if isinstance(reward, str) and reward in REWARDS:
        return REWARDS[reward]
    raise UnknownRewardError(
        f"`meta_reward` must be one of {sorted(REWARDS)} or a callable `f(RoundFeedback) -> float`, but is {reward!r}. "
        'Use "speed" (the default), "bd", "be" or "eal".'
    )


def reward_value(reward: Callable[[RoundFeedback], float], feedback: RoundFeedback) -> float:
    """``reward(feedback)`` as a float, or a `MetaSDTypeError` (not a number) / `MetaSDConfigError` (NaN or
    infinite) naming `meta_reward` and what it returned: a float that is no reward would reach the policy's
    arithmetic.

    Example:
        >>> reward_value(lambda feedback: "0.5", None)
        Traceback (most recent call last):
        ...
        hf_metasd.errors.MetaSDTypeError: `meta_reward` must return a finite float, but <lambda> returned str '0.5'. Return the round's reward as a number, e.g. `float(...)`.
    """
    value = reward(feedback)
    number = (isinstance(value, numbers.Real) and not isinstance(value, bool)) or (
        isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype.is_floating_point
    )
    if number and math.isfinite(float(value)):
        return float(value)
    name = getattr(reward, "__name__", type(reward).__name__)
    raise (MetaSDConfigError if number else MetaSDTypeError)(
        f"`meta_reward` must return a finite float, but {name} returned {type(value).__name__} {value!r}. Return "
        "the round's reward as a number, e.g. `float(...)`."
    )


def is_cost_aware(reward: str | Callable[[RoundFeedback], float]) -> bool:
    """Whether `reward` reads the smoothed costs (a registered cost-aware name, or a callable with a true
    ``cost_aware`` attribute): only such a reward can score the no-draft arm."""
    if isinstance(reward, str):
        return reward in COST_AWARE_REWARDS
    return bool(getattr(reward, "cost_aware", False)) or any(
        fn is reward for name, fn in REWARDS.items() if name in COST_AWARE_REWARDS
    )


#: The built-in rewards that, under greedy decoding, read a round only through its accepted count and the costs
#: (BE, EAL, speed): they can score a round replayed in hindsight, whose target logits are known only as the greedy
#: tokens (see `hf_metasd.feedback.replayed_feedback`). BD (soft target probabilities) and cost (the round's own
#: wall time) cannot.
REPLAYABLE_REWARDS = frozenset({"be", "eal", "speed"})


def is_replayable(reward: str | Callable[[RoundFeedback], float]) -> bool:
    """Whether `reward` can score a replayed round: a name in `REPLAYABLE_REWARDS`, or that reward's callable."""
    if isinstance(reward, str):
        return reward in REPLAYABLE_REWARDS
    return any(fn is reward for name, fn in REWARDS.items() if name in REPLAYABLE_REWARDS)


def reward_name(reward: str | Callable[[RoundFeedback], float]) -> str:
    """A printable name for a reward."""
    return reward if isinstance(reward, str) else getattr(reward, "__name__", type(reward).__name__)
