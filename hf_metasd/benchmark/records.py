"""`BenchRecord`: one (method, prompt) run of the benchmark, what `run` writes and `report` reads."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["BenchRecord"]


@dataclass
class BenchRecord:
    """One (method, prompt) run."""

    method: str
    task: str
    prompt_id: str
    seconds: float
    new_tokens: int
    target_forwards: int
    identical: bool
    arms: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    time_split: dict[str, float] = field(default_factory=dict)
    trace: list[dict] = field(default_factory=list)
    kernel: str | None = None
    #: seconds of a verification pass by number of tokens, as the call's draft-length choice read them at its end
    verification_costs: dict[int, float] = field(default_factory=dict)
    #: the reward of each round's pulled arm (`MetaSDStats.rewards`; ``None``: a round not rewarded)
    rewards: list[float | None] = field(default_factory=list)
    #: the prior means the call took from earlier calls of its method (`MetaSDStats.learned_priors`)
    learned_priors: dict[str, float] = field(default_factory=dict)
    #: where the output first left plain greedy output (`hf_metasd.lossless.Divergence.to_dict`), ``None``: identical
    divergence: dict | None = None

    @property
    def near_tie(self) -> bool:
        """The output left plain greedy output only at a near-tie (`hf_metasd.lossless`)."""
        return self.divergence is not None and bool(self.divergence["near_tie"])

    @property
    def lossless(self) -> bool:
        """The output keeps the contract of its dtype: identical, or left plain greedy output at a near-tie."""
        return self.identical or self.near_tie
