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
