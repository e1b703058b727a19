"""`Slots`: the target's KV cache laid out for rows that accept different numbers of tokens per round.

Every row of the cache advances by the same number of slots per pass (transformers' caches hold one length for the
whole batch). A pass feeds, per row, the token it holds that the cache lacks (the whole prompt on the first pass),
then its candidates, padded to the round's longest draft; after verification the slots of a row's rejected or unused
candidates stay in the cache, masked out of the attention mask for good, and the pass's last slots that no row kept
are cropped. Each token's position id follows the mask (plain `generate`'s ``cumsum(mask) - 1``, continued one per
token), so a row's attention sees exactly the keys plain `generate` gives it; only the slot indices differ.

The slots a row wastes per pass are bounded by the draft length: at most ``max_b kept_b - kept_row`` after the crop.
`wasted` counts them per row (telemetry). Rows that need no more tokens are dropped from the cache
(`Cache.batch_select_indices`), so a finished request costs nothing in later passes.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["RoundInputs", "Slots"]


class RoundInputs:
    """One pass's inputs over the rows the cache holds: ``ids`` ``(R, P + W)``, ``mask`` ``(R, S + P + W)`` (the
    cache's slots, then the fed ones), ``positions`` ``(R, P + W)``; `P` fed columns the rows hold (the prompt, or one
    token), `W` the round's longest draft; the logits of the last ``W + 1`` columns verify the drafts."""

    def __init__(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, lead: int, width: int) -> None:
        self.ids, self.mask, self.positions, self.lead, self.width = ids, mask, positions, lead, width

    @property
    def keep(self) -> int:
        """Logit columns the pass must return: the last fed token of each row's lead and every candidate column."""
        return self.width + 1


class Slots:
    """The cache's attention mask and positions, for the rows it holds.

    Args:
        prompt_mask: ``(B, L)`` the call's attention mask.
        prompt_positions: ``(B, L)`` the prompt's position ids (as `generate` prepared them).

    Example:
        >>> slots = Slots(torch.tensor([[0, 1, 1], [1, 1, 1]]), torch.tensor([[0, 0, 1], [0, 1, 2]]))
        >>> inputs = slots.round_inputs(torch.tensor([[0, 7, 8], [4, 5, 6]]), [[3], [3, 4]])  # the first pass
        >>> inputs.ids.tolist(), inputs.positions.tolist(), inputs.mask.tolist()
        ([[0, 7, 8, 3, 0], [4, 5, 6, 3, 4]], [[0, 0, 1, 2, 3], [0, 1, 2, 3, 4]], [[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
        >>> slots.after_round([1, 0])  # row 0 kept its candidate (and the target's token), row 1 none: crop 1 slot
        1
        >>> slots.mask.tolist(), slots.wasted
        ([[0, 1, 1, 1], [1, 1, 1, 0]], [0, 1])
    """

    def __init__(self, prompt_mask: torch.Tensor, prompt_positions: torch.Tensor) -> None:
        self.rows = list(range(prompt_mask.shape[0]))  # the call's rows the cache holds, in its order
        self.prompt_mask = prompt_mask.long()
        self.prompt_positions = prompt_positions
        self.mask: torch.Tensor | None = None  # (R, S) after the first pass
        # position of each row's token i after the prompt: start + i, as plain `generate` continues them
        self.start = (prompt_positions[:, -1] + 1).tolist()
        self.wasted = [0] * prompt_mask.shape[0]
        self._fed: torch.Tensor | None = None  # the fed columns' mask of the pass being verified
        self._lead = self._width = 0

    def round_inputs(self, lead: torch.Tensor, drafts: list[list[int]], held: list[int] | None = None) -> RoundInputs:
        """The pass's inputs: `lead` ``(R, P)`` the tokens each row holds that the cache lacks (the prompt on the first
        pass), `drafts` each row's candidates (a list per row of the cache, maybe empty), `held` the tokens each row
        holds after its prompt (None on the first pass)."""
        rows, width = len(self.rows), max((len(d) for d in drafts), default=0)
        first = self.mask is None
        ids = torch.zeros(rows, width, dtype=lead.dtype, device=lead.device)
        fed = torch.zeros(rows, width, dtype=torch.long, device=lead.device)
        offsets = torch.arange(width, device=lead.device)
        for r, draft in enumerate(drafts):
            ids[r, : len(draft)] = torch.as_tensor(draft, dtype=lead.dtype)
            fed[r, : len(draft)] = 1
        starts = torch.tensor(
            [self.start[b] + (0 if first else held[r]) for r, b in enumerate(self.rows)], device=lead.device
        )
        positions = starts[:, None] + offsets[None]
        if first:
            lead_mask, lead_positions = self.prompt_mask, self.prompt_positions
        else:  # the last token each row holds: position start + held - 1
            lead_mask = torch.ones_like(lead)
            lead_positions = starts[:, None] - 1
        fed = torch.cat([lead_mask, fed], dim=1)
        mask = fed if first else torch.cat([self.mask, fed], dim=1)
        self._fed, self._lead, self._width = fed, lead.shape[1], width
        ids = torch.cat([lead, ids], dim=1)
        return RoundInputs(ids, mask, torch.cat([lead_positions, positions], dim=1), lead.shape[1], width)

    def after_round(self, kept: list[int]) -> int:
        """Record the pass: row r (of the cache) kept ``kept[r]`` of its candidates in the cache (those accepted
        before any stop, but its new last token, which is fed next). Returns how many of the pass's last slots no
        row kept: crop them from the cache."""
        fed, lead, self._fed = self._fed, self._lead, None
        used = max(kept, default=0)
        for r, k in enumerate(kept):
            fed[r, lead + k :] = 0
            self.wasted[self.rows[r]] += used - k
        fed = fed[:, : lead + used]
        self.mask = fed if self.mask is None else torch.cat([self.mask, fed], dim=1)
        return self._width - used

    def keep_rows(self, rows: list[int], cache: Any) -> None:
        """Keep only the call's `rows` (a subset of `rows`, in order) in the cache and the mask."""
        if rows == self.rows:
            return
        index = torch.tensor([self.rows.index(b) for b in rows], device=self.mask.device)
        cache.batch_select_indices(index)
        self.mask = self.mask[index]
        self.rows = list(rows)
