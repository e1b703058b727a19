"""The call's logits processors over a batch whose rows are at different lengths, as plain batched `generate` runs them.

transformers builds some processors for the whole batch: the repetition penalty skips each row's left padding (a
``(B,)`` tensor of lengths), a prefix constraint is told the row's index. They must be called with the whole
``(B, L + t)`` batch, the row at its own index, as plain `generate` calls them. In a MetaSD batch the rows that need
scores at one time are at different lengths, so `BatchScores` calls the processors once per length, with the rows of
that length in their places and every other row a filler (its tokens so far, then padding) whose scores are dropped.
`RowProcessors` is one row's view of them for its candidate generator, whose drafters see the row without its
padding (model-free drafters propose only what the processors allow).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["BatchScores", "RowProcessors"]


class BatchScores:
    """The call's `logits_processor` applied to rows of the batch at any lengths (see the module docstring).

    Args:
        logits_processor: the call's `LogitsProcessorList`.
        filler: ``filler(length)`` -> ``(B, length)`` every row's tokens so far, padded (`PlainSteps.padded`).
    """

    def __init__(self, logits_processor: Any, filler: Any) -> None:
        self.logits_processor = logits_processor
        self.filler = filler

    def __len__(self) -> int:
        return 0 if self.logits_processor is None else len(self.logits_processor)

    def process(self, requests: list[tuple[int, torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        """The processed scores of each ``(row, ids (length,), scores (V,))`` request: row `row`'s next-token scores
        after `ids` (the row as plain `generate` sees it, padding included). One processor call per length (and per
        repeat of a row at one length)."""
        if len(self) == 0:
            return [scores for _, _, scores in requests]
        out: list[torch.Tensor | None] = [None] * len(requests)
        groups: list[tuple[int, dict[int, int]]] = []  # (length, row -> request index)
        for k, (row, ids, _) in enumerate(requests):
            group = next((g for length, g in groups if length == ids.shape[0] and row not in g), None)
            if group is None:
                groups.append((ids.shape[0], group := {}))
            group[row] = k
        for length, group in groups:
            ids = self.filler(length).clone()
            first = requests[next(iter(group.values()))][2]
            scores = torch.zeros(ids.shape[0], first.shape[-1], dtype=first.dtype, device=first.device)
            for row, k in group.items():
                ids[row] = requests[k][1].to(ids.device)
                scores[row] = requests[k][2]
            processed = self.logits_processor(ids, scores)
            for row, k in group.items():
                out[k] = processed[row]
        return out


class RowProcessors:
    """Row `row`'s view of the call's processors, for its candidate generator: called with the row without its padding
    ``(1, M + t)`` (its `prompt_length` = M unpadded prompt tokens, then `t` more), it processes the row as plain
    `generate` would (its padded prompt `padded_prompt` ``(L,)`` first) at its index in the batch."""

    def __init__(self, scores: BatchScores, row: int, padded_prompt: torch.Tensor, prompt_length: int) -> None:
        self.scores, self.row, self.padded_prompt, self.prompt_length = scores, row, padded_prompt, prompt_length

    def __len__(self) -> int:
        return len(self.scores)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[0] != 1:
            raise ValueError(f"a row's processors take one row, but got {input_ids.shape[0]}.")
        ids = torch.cat([self.padded_prompt.to(input_ids.device), input_ids[0, self.prompt_length :]])
        return self.scores.process([(self.row, ids, scores[0])])[0][None]
