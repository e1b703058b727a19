"""`MetaSDStats`: per-round telemetry of one MetaSD `generate` call, and the one stopwatch that fills it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from ._distributed import agree

__all__ = ["TIME_PARTS", "MetaSDStats"]

#: The clock every MetaSD call reads (seconds). Tests replace it with a fake one to make wall-clock rewards exact.
CLOCK: Callable[[], float] = time.perf_counter


def _now() -> float:
    """`CLOCK`; rank 0's reading on every rank during a call on a tensor-parallel target (`hf_metasd._distributed`)."""
    return agree([CLOCK()])[0]


#: The parts of a call's wall time, in the order `summary` prints them (each has a ``<part>_seconds`` field).
TIME_PARTS = (
    "draft",
    "prefill",
    "catch_up",
    "verify",
    "policy",
    "reward",
    "replay",
    "kernel_choice",
)

#: The derived numbers (properties) `MetaSDStats.to_dict` writes after the fields, in this order.
_SAVED_PROPERTIES = ("rounds", "pulls", "tokens", "mean_accepted", "total_seconds", "other_seconds")


@dataclass
class MetaSDStats:
    """What happened in each round, and where the wall time went.

    Per-round lists have one entry per round (one target forward pass): ``arms[r]`` is the arm whose draft the target
    verified (an index into `drafter_names`; the last name is ``"no_draft"`` when the pool has the no-draft arm, a
    round the target decodes alone), ``drafted[r]`` the tokens it drafted, ``accepted[r]`` the drafted tokens kept
    (accepted by the target and before any stopping criterion fired), ``new_tokens[r]`` the tokens the round added to
    the output, ``rewards[r]`` the reward given to the policy (``None``: the policy was not updated for this round),
    ``abstained[r]`` the arms the policy chose first that had nothing to propose (not pulls: the round went to the
    policy's `fallback`), ``match_classes[r]`` the match class a corpus drafter's draft was cut by (``None``: a
    round of another kind, or a fixed length; `hf_metasd.draft_length`, "Match classes").

    Seconds (all from one clock, `clock`): ``draft_seconds`` (drafters' drafting steps, and catch-up of a drafter that
    also drafted the round before: the tokens it is bound to ingest), ``prefill_seconds`` (each drafter's first ingest
    of the sequence: its prompt prefill), ``catch_up_seconds`` (drafters ingesting tokens they missed while other arms
    ran: the price of switching, also the counterfactual scoring of a full-information policy), ``verify_seconds``
    (the target's forward pass, acceptance and stopping checks), ``policy_seconds`` (`select`, `fallback`,
    `update`), ``reward_seconds`` (computing rewards), ``replay_seconds`` (replayed rounds: the model-free drafters
    that did not draft a round proposing for its position, scored in hindsight; see `MetaCandidateGenerator`),
    ``kernel_choice_seconds`` (timing the CPU verification kernels, first call only). ``wall_seconds`` is the whole
    decoding loop; `other_seconds` the part no stopwatch covered (transformers' input preparation between rounds).
    `kernel` is the verification kernel that most of the call's verification passes ran (``"stock"``,
    ``"skinny"``), ``kernels[r]`` the kernel of round ``r``'s pass when it was chosen per pass (``None``: a pass the
    transposed product does not apply to, or a kernel forced for the call; `hf_metasd.kernels.VerificationKernels`),
    `kernel_timings` what the layer-level measurement found and `kernel_pass_costs` the smoothed seconds of a pass by
    its tokens and kernel, as timed so far in this process. `learned_priors` holds the prior means the call took
    from earlier calls (arm name -> mean; `hf_metasd.priors`). `draft_length` is how each round's length was chosen
    (``"measured"`` or ``"fixed"``; `hf_metasd.draft_length`) and `verification_costs` the smoothed seconds of a
    target verification pass by its number of tokens, as measured so far in this process.
    """

    drafter_names: list[str]
    policy: str
    reward: str
    num_assistant_tokens: int
    arms: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    new_tokens: list[int] = field(default_factory=list)
    rewards: list[float | None] = field(default_factory=list)
    catch_up_tokens: list[int] = field(default_factory=list)
    abstained: list[list[int]] = field(default_factory=list)
    kernels: list[str | None] = field(default_factory=list)
    match_classes: list[int | None] = field(default_factory=list)
    draft_seconds: float = 0.0
    prefill_seconds: float = 0.0
    catch_up_seconds: float = 0.0
    verify_seconds: float = 0.0
    policy_seconds: float = 0.0
    reward_seconds: float = 0.0
    replay_seconds: float = 0.0
    kernel_choice_seconds: float = 0.0
    wall_seconds: float = 0.0
    kernel: str = "stock"
    kernel_timings: dict[str, float] = field(default_factory=dict)
    kernel_pass_costs: dict[int, dict[str, float]] = field(default_factory=dict)
    counterfactual_rewards: list[dict[int, float]] = field(default_factory=list)
    counterfactual_accepted: list[dict[int, int]] = field(default_factory=list)
    learned_priors: dict[str, float] = field(default_factory=dict)
    draft_length: str = "fixed"
    verification_costs: dict[int, float] = field(default_factory=dict)
    replay_rewards: list[list[tuple[int, float]]] = field(default_factory=list)
    clock: Callable[[], float] = field(default=_now, repr=False, compare=False)

    @contextmanager
    def timed(self, part: str) -> Iterator[None]:
        """Add the time spent in the ``with`` block to ``<part>_seconds`` (one of `TIME_PARTS`).

        Example:
            >>> ticks = iter([1.0, 1.25])
            >>> stats = MetaSDStats(["d"], "ucb", "bd", 3, clock=lambda: next(ticks))
            >>> with stats.timed("draft"):
            ...     pass
            >>> stats.draft_seconds
            0.25
        """
        if part not in TIME_PARTS:
            raise ValueError(f"`part` must be one of {list(TIME_PARTS)}, but is {part!r}. Time a known part.")
        start = self.clock()
        try:
            yield
        finally:
            setattr(self, f"{part}_seconds", getattr(self, f"{part}_seconds") + self.clock() - start)

    # ------------------------------------------------------------------ derived numbers
    @property
    def rounds(self) -> int:
        """Draft-and-verify rounds (target forward passes) of the call."""
        return len(self.arms)

    @property
    def pulls(self) -> list[int]:
        """Rounds each arm drafted and was rewarded for (abstentions are not pulls)."""
        counts = [0] * len(self.drafter_names)
        for arm, reward in zip(self.arms, self.rewards):
            if reward is not None:
                counts[arm] += 1
        return counts

    @property
    def empty_drafts(self) -> int:
        """How many times an arm the policy asked had nothing to propose (abstentions, over all rounds)."""
        return sum(len(a) for a in self.abstained)

    @property
    def tokens(self) -> int:
        """Tokens added to the output (accepted drafts plus the target's own token of each round, as kept)."""
        return sum(self.new_tokens)

    @property
    def mean_accepted(self) -> float:
        """Mean accepted drafted tokens per round (Spec-Bench's τ counts the target's token too: τ = this + 1)."""
        return sum(self.accepted) / self.rounds if self.rounds else 0.0

    @property
    def total_seconds(self) -> float:
        """Sum of the measured parts (`TIME_PARTS`: drafting, prefill, catch-up, verification, policy, reward, replay,
        kernel choice)."""
        return sum(getattr(self, f"{part}_seconds") for part in TIME_PARTS)

    @property
    def other_seconds(self) -> float:
        """Wall time of the loop that no part covers (transformers' input preparation between rounds)."""
        return max(0.0, self.wall_seconds - self.total_seconds)

    @property
    def overhead_seconds(self) -> float:
        """Time MetaSD adds on top of draft-and-verify: policy, reward, replayed rounds, catch-up and the kernel choice."""
        return (
            self.policy_seconds
            + self.reward_seconds
            + self.replay_seconds
            + self.catch_up_seconds
            + self.kernel_choice_seconds
        )

    def to_dict(self) -> dict[str, Any]:
        """Every field and derived number, JSON-serialisable."""
        out = asdict(self)
        out.pop("clock")
        out.update({name: getattr(self, name) for name in _SAVED_PROPERTIES})
        return out

    def to_trace(self) -> list[dict[str, dict[int, float]]]:
        """Full-information rounds as a trace for `hf_metasd.benchmark.simulate.replay` (rounds covering every drafter).

        Counterfactual accepted counts are observable only within each round's verified window (accepted + 1
        tokens), so they under-count for drafters that would have gone further: replay is a conservative estimate.
        """
        arms = {i for i, name in enumerate(self.drafter_names) if name != "no_draft"}
        return [
            {"arm_rewards": dict(rewards), "arm_accepted": dict(accepted)}
            for rewards, accepted in zip(self.counterfactual_rewards, self.counterfactual_accepted)
            if set(rewards) == arms and set(accepted) == arms
        ]

    def summary(self) -> str:
        """A small text table: one line per arm, then the time split."""
        lines = [f"MetaSD: {self.rounds} rounds, {self.tokens} tokens, policy={self.policy}, reward={self.reward}"]
        pulls = self.pulls
        for i, name in enumerate(self.drafter_names):
            idx = [r for r, a in enumerate(self.arms) if a == i]
            acc = sum(self.accepted[r] for r in idx) / len(idx) if idx else 0.0
            rew = [self.rewards[r] for r in idx if self.rewards[r] is not None]
            mean_rew = sum(rew) / len(rew) if rew else float("nan")
            skipped = sum(i in a for a in self.abstained)
            lines.append(
                f"  [{i}] {name:<24} pulls={pulls[i]:>4}  abstained={skipped:>3}  accepted/round={acc:5.2f}  "
                f"reward={mean_rew:5.3f}"
            )
        by_class: dict[int, list[int]] = {}
        for match, drafted in zip(self.match_classes, self.drafted):
            if match is not None:
                by_class.setdefault(match, []).append(drafted)
        if by_class:
            lines.append(
                "  corpus drafts by match length in tokens (rounds, mean drafted): "
                + "; ".join(
                    f"{_match_lengths(c)}: {len(d)}, {sum(d) / len(d):.2f}" for c, d in sorted(by_class.items())
                )
            )
        wall = self.wall_seconds or self.total_seconds or 1.0
        parts = [*TIME_PARTS, "other"]
        lines.append(
            f"  time ({wall:.3f}s, kernel={self.kernel}): "
            + ", ".join(
                f"{k}={getattr(self, k + '_seconds'):.3f}s ({100 * getattr(self, k + '_seconds') / wall:.1f}%)"
                for k in parts
                if getattr(self, k + "_seconds") > 0 or k in ("draft", "verify")
            )
        )
        if self.kernel_pass_costs:
            costs = "; ".join(
                f"{k}: " + ", ".join(f"{name} {1000 * v:.1f}" for name, v in sorted(by.items()))
                for k, by in sorted(self.kernel_pass_costs.items())
            )
            lines.append(f"  ms per verification pass by tokens and kernel: {costs}")
        if self.verification_costs:
            costs = ", ".join(f"{k}: {1000 * v:.1f}" for k, v in sorted(self.verification_costs.items()))
            lines.append(f"  draft length {self.draft_length}; ms per verification pass by tokens: {costs}")
        return "\n".join(lines)


def _match_lengths(match_class: int) -> str:
    """The match lengths of `match_class` (`hf_metasd.draft_length.match_class`) as text: ``"1"``, ``"3-4"``."""
    low, high = (1, 1) if match_class == 0 else (2 ** (match_class - 1) + 1, 2**match_class)
    return str(low) if low == high else f"{low}-{high}"
