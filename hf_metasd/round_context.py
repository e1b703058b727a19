r"""One round of a call (`Round`, the candidate generator's record of it) and what it knows before it drafts: each
model-free arm's proposal for this position, and every arm's rate.

A contextual policy (`Policy.contextual`: ``throughput``) chooses from a `~hf_metasd.policies.RoundContext`. The
candidate generator makes it with `round_context` before the round's choice:

* every **previewed** arm (a model-free drafter: `Drafter.replayable`, such as prompt lookup, a corpus or token
  recycling, whose proposal is a cheap function of the sequence) proposes for this position, the cap, under the
  call's logits processors, cut by its match class where it scores matches (`RoundLength.cut`). An empty proposal
  means it abstains this round (no rate). Its rate reads its acceptance rates *for that class*
  (`DraftLength.value`), so a long match rates high and a one-token one low, and its proposal is cut to the length
  of the best rate. The chosen arm's proposal is the round's draft: nothing is drafted twice, and the replayed
  rounds score the others' proposals (`hf_metasd.feedback.Replay`);
* every other arm (model drafters) is rated from its acceptance rates by position, its drafting seconds per token
  and the verification costs (`DraftLength.value`), at the length `RoundLength` would draft; its rates raised by the
  policy's `optimism` (:math:`b / \sqrt{T_j + 1}`, fading with the rounds measured: a model drafter must be tried
  to be known, a copier is known from every round), and, while the call has not run it (`unseen`), its predicted
  prompt prefill charged per expected token as a share of the tokens left to generate;
* the no-draft arm's rate is a plain step's, :math:`1 / \hat v(1)`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .draft_length import DraftLength, RoundLength
from .drafters import Drafter
from .policies import RoundContext

__all__ = ["Preview", "Round", "round_context"]


@dataclass
class Preview:
    """A previewed arm's draft for a round: `tokens` ``(1, n)`` (``n = 0``: it abstains), cut to the length of its
    rate, from its `proposal` (the cap, cut by its match class: what its replayed round scores), the `match_class`
    it was rated in (``None`` for a drafter that does not score matches) and the seconds proposing took."""

    tokens: torch.LongTensor
    proposal: torch.LongTensor
    match_class: int | None
    seconds: float


@dataclass
class Round:
    """One round of a call, from `get_candidates` to `update_candidate_strategy` (the candidate generator's record)."""

    first: bool  # the call's first round (its pass is the prompt's prefill)
    start: int  # sequence length at the round's start
    started: float  # the clock at the round's start
    arm: int = 0  # the arm whose draft the target verifies (after any fallback)
    num_tokens: int = 0  # the round's draft length
    tokens: torch.Tensor | None = None  # (n,) the draft; None: a plain step
    logits: torch.Tensor | None = None  # (n, V) the drafter's processed logits, if it has any
    verify_started: float = 0.0
    abstained: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0  # a drafter's first ingest of the prompt: not part of its round cost
    match_class: int | None = None  # the draft's match class (`hf_metasd.draft_length.match_class`), if it has one
    kernel: str | None = None  # the verification kernel of the round's pass (None: not chosen per pass)
    previews: dict[int, Preview] = field(default_factory=dict)  # a contextual policy's round: model-free drafts

    @property
    def drafted(self) -> int:
        return 0 if self.tokens is None else int(self.tokens.shape[0])

    @property
    def width(self) -> int:
        """Tokens of the round's verification pass."""
        return 1 + self.drafted

    def fed(self, input_ids: torch.LongTensor) -> torch.LongTensor:
        """``(1, 1 + n)``: the tokens the round's pass was fed, the last one before the round (in `input_ids`, the
        sequence after it) and the draft."""
        fed = input_ids[:, self.start - 1 : self.start]
        return fed if self.tokens is None else torch.cat([fed, self.tokens[None].to(fed.device)], dim=-1)


def round_context(
    drafters: Sequence[Drafter],
    input_ids: torch.LongTensor,
    *,
    lengths: DraftLength,
    round_length: RoundLength,
    logits_processor: Any = None,
    do_sample: bool = False,
    clock: Callable[[], float],
    optimism: float = 0.0,
    unseen: Collection[int] = (),
) -> tuple[RoundContext, dict[int, Preview]]:
    """The round's `RoundContext` after `input_ids` ``(1, L)`` and the previewed arms' drafts (see the module
    docstring): the previewed arms are the `Drafter.replayable` ones, the no-draft arm is `round_length`'s
    ``plain_arm``.

    Example:
        >>> from hf_metasd.drafters import PromptLookupDrafter
        >>> lengths = DraftLength(num_arms=2, max_tokens=3)
        >>> lengths.observe_verification(1, 0.1); lengths.observe_verification(1, 0.1)
        >>> rounds = RoundLength(lengths, "measured", plain_arm=1)
        >>> context, previews = round_context([PromptLookupDrafter()], torch.tensor([[5, 6, 7, 5, 6]]),
        ...     lengths=lengths, round_length=rounds, clock=lambda: 0.0)
        >>> previews[0].tokens.tolist(), context.lengths, round(context.rates[1], 3)   # "5 6" -> 7 5 6: 3 tokens
        ([[7, 5, 6]], (3, 0), 10.0)
    """
    previewed = [arm for arm, drafter in enumerate(drafters) if drafter.replayable]
    no_draft_arm = round_length.plain_arm
    length = input_ids.shape[1]
    cap = round_length.cap(length)
    exact = round_length.mode == "fixed"
    rates: list[float | None] = []
    sizes: list[int] = []
    matches: list[int | None] = [None] * (len(drafters) + (no_draft_arm is not None))
    previews: dict[int, Preview] = {}
    for arm, drafter in enumerate(drafters):
        if cap == 0:
            rates.append(None)
            sizes.append(0)
            continue
        if arm not in previewed:
            # a model arm this call has not run yet pays its prompt prefill first: charged per expected token, as a
            # share of what is left to generate
            left = max(1, (round_length.max_length or length + cap + 1) - length)
            per_token = lengths.prefill_seconds(arm, length) / left if arm in unseen else 0.0
            n, rate = lengths.value(arm, cap, exact=exact, bonus=optimism, per_token=per_token)
            rates.append(rate)
            sizes.append(n)
            continue
        start = clock()
        tokens, _ = drafter.draft(input_ids, cap, logits_processor=logits_processor, do_sample=do_sample)
        if drafter.scores_matches:
            matches[arm] = int(drafter.last_match_length)
        proposal, match = round_length.cut(arm, tokens, getattr(drafter, "last_match_length", 0))
        n, rate = lengths.value(arm, proposal.shape[-1], match, exact=exact) if proposal.shape[-1] else (0, None)
        tokens = proposal[:, :n]
        previews[arm] = Preview(tokens, proposal, match, clock() - start)
        rates.append(rate)
        sizes.append(int(tokens.shape[-1]))
    if no_draft_arm is not None:
        rates.append(lengths.plain_value())
        sizes.append(0)
    return RoundContext(rates=tuple(rates), lengths=tuple(sizes), match_lengths=tuple(matches)), previews
