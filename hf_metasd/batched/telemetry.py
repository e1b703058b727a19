"""`MetaSDBatchStats`: the telemetry of a MetaSD batch, one `MetaSDStats` per row and the batch's passes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..stats import MetaSDStats

__all__ = ["MetaSDBatchStats"]


@dataclass
class MetaSDBatchStats:
    """What a batched call did.

    ``rows[b]`` is row `b`'s `MetaSDStats`, as a single-request call reports it (its arms, drafts, rewards, and its
    seconds: its own drafting and learning plus its share of every pass it was verified in, `hf_metasd.batched.lengths`;
    its `verification_costs` are its share of a pass of the whole batch by tokens per row). A row's ``new_tokens``
    count the tokens each of its rounds verified; the output may end earlier, where plain `generate`'s stopping
    criteria fired once the other rows caught up (``output_tokens[b]``: the row's tokens in the output before any
    padding).

    Per pass (one target forward over the rows that still decode): ``pass_rows[p]`` those rows, ``pass_columns[p]``
    the columns each was fed (its tokens the cache lacked, then the round's longest draft), ``pass_seconds[p]`` its
    time. ``wasted_slots[b]``: the cache slots of row `b`'s that hold no token of its output (its candidates that were
    rejected or shorter than the round's longest kept draft), masked out of its attention; bounded per pass by the
    draft length (`hf_metasd.batched.slots`). ``pass_costs``: the smoothed seconds of a pass by its total width
    (rows x columns) as measured so far at this batch size, from which each row's draft length and its share of each
    pass follow (`hf_metasd.batched.lengths`).

    ``drafting_stopped_after``: after how many drafting rounds the drafting guard stopped drafting (``None``: it did
    not), ``drafting_rounds``: the drafting rounds it measured (over the rows its plain round measured),
    ``drafted_rounds``: those in which some row drafted at least one token,
    ``plain_tokens[b]``: row `b`'s tokens from plain rounds (one target step for the batch, no draft; its
    generator sat those out). ``plain_reason``: why rounds ran plain other than the guard's, said once:
    ``"every round: ..."`` when rows could not draft at all (`hf_metasd.batched.plain`: the call ran plain
    `generate`'s own loop, so no pass is recorded and every row's tokens are plain), ``"the prefill round: ..."`` when
    a row's attention mask keeps no token; ``None`` otherwise.
    """

    rows: list[MetaSDStats]
    pass_rows: list[list[int]] = field(default_factory=list)
    pass_columns: list[int] = field(default_factory=list)
    pass_seconds: list[float] = field(default_factory=list)
    wasted_slots: list[int] = field(default_factory=list)
    output_tokens: list[int] = field(default_factory=list)
    pass_costs: dict[int, float] = field(default_factory=dict)
    drafting_stopped_after: int | None = None
    drafting_rounds: int = 0
    drafted_rounds: int = 0
    plain_tokens: list[int] = field(default_factory=list)
    plain_reason: str | None = None
    wall_seconds: float = 0.0

    def record_pass(self, rows: list[int], columns: int, seconds: float) -> None:
        """Record one pass."""
        self.pass_rows.append(list(rows))
        self.pass_columns.append(int(columns))
        self.pass_seconds.append(float(seconds))

    @property
    def batch_size(self) -> int:
        return len(self.rows)

    @property
    def rounds(self) -> int:
        """Target forward passes of the call."""
        return len(self.pass_rows)

    @property
    def verified_rows(self) -> int:
        """Token rows the passes verified (rows x columns, summed over passes): what the batch cost the target."""
        return sum(len(rows) * columns for rows, columns in zip(self.pass_rows, self.pass_columns))

    def to_dict(self) -> dict[str, Any]:
        """Every field (each row's `MetaSDStats.to_dict`) and the derived numbers, JSON-serialisable."""
        return {
            "rows": [row.to_dict() for row in self.rows],
            "pass_rows": self.pass_rows,
            "pass_columns": self.pass_columns,
            "pass_seconds": self.pass_seconds,
            "wasted_slots": self.wasted_slots,
            "output_tokens": self.output_tokens,
            "pass_costs": self.pass_costs,
            "drafting_stopped_after": self.drafting_stopped_after,
            "plain_tokens": self.plain_tokens,
            "plain_reason": self.plain_reason,
            "wall_seconds": self.wall_seconds,
            "rounds": self.rounds,
            "verified_rows": self.verified_rows,
        }

    def summary(self) -> str:
        """A small text summary: the passes, then one line per row."""
        lines = [
            f"MetaSD batch of {self.batch_size}: {self.rounds} passes, {sum(self.output_tokens)} tokens, "
            f"{self.verified_rows} token rows verified, {self.wall_seconds:.3f}s"
        ]
        if self.plain_reason is not None:
            lines.append(f"  plain rounds: {self.plain_reason}")
        for b, row in enumerate(self.rows):
            arms = [row.drafter_names[a] for a in row.arms]
            counts = {name: arms.count(name) for name in dict.fromkeys(arms)}
            lines.append(
                f"  row {b}: {self.output_tokens[b] if self.output_tokens else row.tokens} tokens in "
                f"{row.rounds} rounds, accepted/round={row.mean_accepted:.2f}, "
                f"wasted slots={self.wasted_slots[b] if self.wasted_slots else 0}, arms={counts}"
            )
        return "\n".join(lines)
