"""`MetaSDStats`: per-round telemetry of one MetaSD `generate` call."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["MetaSDStats"]


@dataclass
class MetaSDStats:
    """What happened in each round, and where the wall time went.

    Per-round lists have one entry per round: ``arms[r]`` is the drafter index of round ``r``, ``drafted[r]`` the
    number of tokens it drafted, ``accepted[r]`` how many the target accepted, ``rewards[r]`` the reward given to the
    policy (``None`` when nothing was drafted, e.g. at the length limit, and the policy was not updated).

    Seconds: ``draft_seconds`` (drafters' single-token steps), ``prefill_seconds`` (each drafter's first ingest of
    the sequence: its prompt prefill), ``catch_up_seconds`` (drafters ingesting tokens they missed while other
    drafters drafted: the price of switching), ``verify_seconds`` (from the end of drafting to the reward: the
    target's forward pass and transformers' acceptance step), ``policy_seconds`` (`select` + `update`),
    ``reward_seconds`` (computing the reward), ``warm_start_seconds`` (prompt warm start: drafters' prefill with
    logits on the window, and scoring). ``warm_start_rewards`` maps drafters to their warm-start reward, and
    ``counterfactual_rewards`` holds one dict per round in full-information mode. ``empty_drafts`` counts drafters
    that abstained (had nothing to propose when picked): not a pull, no reward; the round went to the policy's
    `fallback`.
    """

    drafter_names: list[str]
    policy: str
    reward: str
    num_assistant_tokens: int
    arms: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    rewards: list[float | None] = field(default_factory=list)
    catch_up_tokens: list[int] = field(default_factory=list)
    draft_seconds: float = 0.0
    prefill_seconds: float = 0.0
    catch_up_seconds: float = 0.0
    verify_seconds: float = 0.0
    policy_seconds: float = 0.0
    reward_seconds: float = 0.0
    warm_start_seconds: float = 0.0
    empty_drafts: int = 0
    counterfactual_rewards: list[dict[int, float]] = field(default_factory=list)
    counterfactual_accepted: list[dict[int, int]] = field(default_factory=list)
    warm_start_rewards: dict[int, float] = field(default_factory=dict)

    @property
    def rounds(self) -> int:
        """Draft-and-verify rounds (target forward passes) of the call."""
        return len(self.arms)

    @property
    def pulls(self) -> list[int]:
        """Rounds drafted by each drafter."""
        counts = [0] * len(self.drafter_names)
        for arm in self.arms:
            counts[arm] += 1
        return counts

    @property
    def tokens(self) -> int:
        """Tokens produced: accepted drafts plus one target token per round."""
        return sum(self.accepted) + self.rounds

    @property
    def mean_accepted(self) -> float:
        """Mean accepted tokens per round (Spec-Bench's τ counts the bonus token too: τ = this + 1)."""
        return sum(self.accepted) / self.rounds if self.rounds else 0.0

    @property
    def total_seconds(self) -> float:
        """Sum of the measured parts (drafting, prefill, catch-up, verification, policy, reward, warm start)."""
        return (
            self.draft_seconds
            + self.prefill_seconds
            + self.catch_up_seconds
            + self.verify_seconds
            + self.policy_seconds
            + self.reward_seconds
        )

    @property
    def overhead_seconds(self) -> float:
        """Time MetaSD adds on top of draft-and-verify: policy, reward and catch-up."""
        return self.policy_seconds + self.reward_seconds + self.catch_up_seconds

    def to_dict(self) -> dict[str, Any]:
        """Every field and derived number, JSON-serialisable."""
        out = asdict(self)
        out.update(rounds=self.rounds, pulls=self.pulls, tokens=self.tokens, mean_accepted=self.mean_accepted)
        return out

    def to_trace(self) -> list[dict[str, dict[int, float]]]:
        """Full-information rounds as a trace for `hf_metasd.simulate.replay` (rounds covering every drafter).

        Counterfactual accepted counts are observable only within each round's verified window (accepted + 1
        tokens), so they under-count for drafters that would have gone further: replay is a conservative estimate.
        """
        arms = set(range(len(self.drafter_names)))
        return [
            {"arm_rewards": dict(rewards), "arm_accepted": dict(accepted)}
            for rewards, accepted in zip(self.counterfactual_rewards, self.counterfactual_accepted)
            if set(rewards) == arms and set(accepted) == arms
        ]

    def summary(self) -> str:
        """A small text table: one line per drafter, then the time split."""
        lines = [f"MetaSD: {self.rounds} rounds, {self.tokens} tokens, policy={self.policy}, reward={self.reward}"]
        for i, name in enumerate(self.drafter_names):
            idx = [r for r, a in enumerate(self.arms) if a == i]
            acc = sum(self.accepted[r] for r in idx) / len(idx) if idx else 0.0
            rew = [self.rewards[r] for r in idx if self.rewards[r] is not None]
            mean_rew = sum(rew) / len(rew) if rew else float("nan")
            lines.append(f"  [{i}] {name:<24} pulls={len(idx):>4}  accepted/round={acc:5.2f}  reward={mean_rew:5.3f}")
        total = self.total_seconds or 1.0
        lines.append(
            "  time: "
            + ", ".join(
                f"{k}={getattr(self, k + '_seconds'):.3f}s ({100 * getattr(self, k + '_seconds') / total:.1f}%)"
                for k in ("draft", "prefill", "catch_up", "verify", "policy", "reward")
            )
        )
        return "\n".join(lines)
