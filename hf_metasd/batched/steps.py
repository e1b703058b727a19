"""`PlainSteps`: the output of plain batched `generate`, rebuilt step by step from rows that advance at their own pace.

Plain batched `generate` adds one token to every row per step, then calls the stopping criteria once with the whole
batch; a row they fire for is finished for good, and when the criteria include an EOS criterion (an object with
`eos_token_id`) every later token of a finished row is `pad_token_id`. It stops when every row is finished.

In a MetaSD batch each row accepts its own number of tokens per round, so rows run ahead of one another. The tokens
are exactly plain's (the target verifies each one), only known earlier for some rows. `PlainSteps` keeps them and
evaluates a step only once every row has its token for that step (a finished row's is the pad), so the criteria are
called exactly as plain `generate` calls them: once per step, in order, with the whole ``(B, L + t)`` batch (stateful
criteria see the same calls), and the streamer gets each step's ``(B,)`` tokens, as from plain `generate`.

A row needs no more tokens once it holds `max_new_tokens` of them, once it is finished (with an EOS criterion), or,
with transformers' `EosTokenCriteria`, once it produced an EOS token (that criterion fires at it: the tokens after
it are never plain's and are dropped). Without an EOS criterion a finished row keeps decoding, as plain's does, until
every row is finished.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.generation.stopping_criteria import EosTokenCriteria

__all__ = ["PlainSteps"]


class PlainSteps:
    """The tokens of every row and plain `generate`'s step-wise stopping over them.

    Args:
        input_ids: ``(B, L)`` the (padded) prompts.
        max_new_tokens: plain's step limit (``max_length - L``).
        stopping_criteria: the call's `StoppingCriteriaList` (called with ``scores=None``).
        pad_token_id: what plain puts after a finished row's last token (with an EOS criterion).
        streamer: optional; gets each evaluated step's ``(B,)`` tokens, as from plain `generate`.

    Example:
        >>> from transformers import StoppingCriteriaList
        >>> from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria
        >>> criteria = StoppingCriteriaList([MaxLengthCriteria(6), EosTokenCriteria(9)])
        >>> steps = PlainSteps(torch.tensor([[1, 2], [3, 4]]), 4, criteria, pad_token_id=0)
        >>> steps.add(0, [5, 9, 7])  # row 0 runs ahead; its EOS ends it (the 7 is never plain's)
        2
        >>> steps.needs_tokens(0), steps.steps  # step 1 waits for row 1
        (False, 0)
        >>> steps.add(1, [6, 6, 6, 6]), steps.steps, steps.finished
        (4, 4, True)
        >>> steps.sequences()
        tensor([[1, 2, 5, 9, 0, 0],
                [3, 4, 6, 6, 6, 6]])
    """

    def __init__(
        self,
        input_ids: torch.LongTensor,
        max_new_tokens: int,
        stopping_criteria: Any,
        *,
        pad_token_id: Any = None,
        streamer: Any = None,
    ) -> None:
        self.batch_size, self.prompt_length = input_ids.shape
        self.max_new_tokens = max(int(max_new_tokens), 1)
        self.criteria = stopping_criteria
        self.streamer = streamer
        #: with an EOS criterion, plain pads finished rows (transformers' `has_eos_stopping_criteria`)
        self.pads = any(hasattr(criterion, "eos_token_id") for criterion in stopping_criteria)
        self.eos = {
            int(i) for c in stopping_criteria if isinstance(c, EosTokenCriteria) for i in c.eos_token_id.flatten()
        }
        pad = 0 if pad_token_id is None else int(pad_token_id)
        # int64 whatever the prompt's dtype, as plain's output (its new tokens, argmax ids, promote the sequence)
        self._tokens = input_ids.new_full(
            (self.batch_size, self.prompt_length + self.max_new_tokens), pad, dtype=torch.long
        )
        self._tokens[:, : self.prompt_length] = input_ids
        self.pad = pad
        self.produced = [0] * self.batch_size  # tokens each row holds after the prompt
        self.ended_at: list[int | None] = [None] * self.batch_size  # the step at which each row finished
        self._eos_at: list[int | None] = [None] * self.batch_size  # tokens held up to an EOS token (dropped after)
        self.steps = 0  # steps evaluated (the criteria called for them)
        self.finished = False

    # ------------------------------------------------------------------ rows
    def row(self, b: int) -> torch.LongTensor:
        """``(1, L + n)`` row `b` as plain `generate` sees it: its padded prompt and the `n` tokens it holds."""
        return self._tokens[b : b + 1, : self.prompt_length + self.produced[b]]

    def new_tokens(self, b: int) -> torch.LongTensor:
        """``(n,)`` the tokens row `b` holds after the prompt."""
        return self._tokens[b, self.prompt_length : self.prompt_length + self.produced[b]]

    def output_length(self, b: int) -> int:
        """Tokens of row `b` in the output before any pad: up to its finishing step with an EOS criterion."""
        ended = self.ended_at[b]
        return self.steps if ended is None or not self.pads else ended

    def needs_tokens(self, b: int) -> bool:
        """Whether row `b` still decodes (see the module docstring)."""
        if self.finished or self.produced[b] >= self.max_new_tokens:
            return False
        if self.pads:
            return self.ended_at[b] is None and self._eos_at[b] is None
        return True

    def add(self, b: int, tokens: Any) -> int:
        """Append `tokens` to row `b`, up to `max_new_tokens` and an EOS token (`EosTokenCriteria`); evaluate every
        step that all rows now hold. Returns how many were kept."""
        if not self.needs_tokens(b):
            raise RuntimeError(f"row {b} needs no more tokens, but was given {len(tokens)}.")
        tokens = torch.as_tensor(tokens, dtype=self._tokens.dtype).flatten()
        kept = min(int(tokens.shape[0]), self.max_new_tokens - self.produced[b])
        if self.eos:
            for i, token in enumerate(tokens[:kept].tolist()):
                if token in self.eos:
                    kept = i + 1
                    self._eos_at[b] = self.produced[b] + kept
                    break
        start = self.prompt_length + self.produced[b]
        self._tokens[b, start : start + kept] = tokens[:kept].to(self._tokens.device)
        self.produced[b] += kept
        self._advance()
        return kept

    # ------------------------------------------------------------------ plain generate's steps
    def _ready(self, b: int) -> bool:
        return self.produced[b] > self.steps or (self.pads and self.ended_at[b] is not None)

    def _advance(self) -> None:
        """Evaluate every step that all rows hold, as plain `generate` does after each of its steps."""
        while not self.finished and all(self._ready(b) for b in range(self.batch_size)):
            self.steps += 1
            end = self.prompt_length + self.steps
            fired = self.criteria(self._tokens[:, :end], None)
            for b in range(self.batch_size):
                if self.ended_at[b] is None and bool(fired[b]):
                    self.ended_at[b] = self.steps
                    if self.pads:  # plain pads every later step of a finished row
                        self._tokens[b, end:] = self.pad
                        self.produced[b] = self.steps
            if self.streamer is not None:
                self.streamer.put(self._tokens[:, end - 1].cpu())
            self.finished = all(ended is not None for ended in self.ended_at)

    def stuck(self) -> bool:
        """No row needs tokens, yet the batch is not finished (a criterion that never fires past `max_new_tokens`):
        the loop cannot go on."""
        return not self.finished and not any(self.needs_tokens(b) for b in range(self.batch_size))

    def padded(self, length: int) -> torch.LongTensor:
        """``(B, length)`` every row's tokens so far, then padding (a view when it fits)."""
        if length <= self._tokens.shape[1]:
            return self._tokens[:, :length]
        extra = self._tokens.new_full((self.batch_size, length - self._tokens.shape[1]), self.pad)
        return torch.cat([self._tokens, extra], dim=1)

    def sequences(self) -> torch.LongTensor:
        """``(B, L + T)`` plain's output, `T` the evaluated steps."""
        return self._tokens[:, : self.prompt_length + self.steps]
