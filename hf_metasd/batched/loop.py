"""The draft-and-verify loop of a MetaSD batch: per round, every row that still decodes asks its own candidate
generator for candidates, **one** target forward pass verifies all of them (`hf_metasd.batched.slots.Slots`), each
row accepts its own tokens (greedy matching, or per-row speculative sampling), learns from its round, and hands its
tokens to `hf_metasd.batched.steps.PlainSteps`, which stops every row exactly where plain batched `generate` does.

Each row's candidate generator sees the row as a single request: its tokens without the left padding. Its clock
(`RowClocks`) runs while the row's own work runs (drafting, learning, its acceptance) and, at the rate of its share
(`hf_metasd.batched.lengths.PassCosts.weight`), during the shared pass, so the costs and rewards it measures are
those its own choices cost the batch. When the pool holds drafters that read the target's features, the pass
records them and each row's generator gets those of its kept positions (`hf_metasd.decoding.observe_kept_features`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import torch

from .. import stats as stats_module
from ..decoding import accept_draft, observe_kept_features, recorded_pass
from ..feature_head import FeatureRecorder
from .lengths import DraftingGuard, PassCosts
from .processors import BatchScores
from .slots import Slots
from .steps import PlainSteps

__all__ = ["RowClocks", "batched_decoding", "verify_row"]


class RowClocks:
    """One clock per row over one real clock (`hf_metasd.stats.CLOCK`): a row's clock runs only inside `running`
    blocks that name the row, at the rate the block gives it (its share of a shared pass: `hf_metasd.batched.lengths`).

    Example:
        >>> ticks = iter([0.0, 1.0, 1.0, 3.0, 3.0, 7.0])
        >>> clocks = RowClocks(2, base=lambda: next(ticks))
        >>> with clocks.running([0, 1]):  # a shared pass: 1 s for both
        ...     pass
        >>> with clocks.running([1]):  # row 1's own work: 2 s
        ...     pass
        >>> with clocks.running([0, 1], rates=[0.25, 0.5]):  # a pass of 4 s, shared: 1 s and 2 s
        ...     pass
        >>> clocks.clock(0)(), clocks.clock(1)()
        (2.0, 5.0)
    """

    def __init__(self, rows: int, base: Callable[[], float] | None = None) -> None:
        self._base = base
        self.elapsed = [0.0] * rows
        self._active: dict[int, float] = {}  # row -> the rate its clock runs at in the current block
        self._since = 0.0

    def now(self) -> float:
        return (self._base or stats_module.CLOCK)()

    def clock(self, row: int) -> Callable[[], float]:
        """Row `row`'s clock (seconds it ran so far)."""

        def read() -> float:
            rate = self._active.get(row)
            return self.elapsed[row] + (0.0 if rate is None else (self.now() - self._since) * rate)

        return read

    @contextmanager
    def running(self, rows: Sequence[int], rates: Sequence[float] | None = None) -> Iterator[None]:
        """Run the clocks of `rows` for the block, row ``rows[i]``'s at ``rates[i]`` seconds per second (default 1);
        blocks do not nest."""
        self._since = self.now()
        self._active = dict(zip(rows, [1.0] * len(rows) if rates is None else rates))
        try:
            yield
        finally:
            spent = self.now() - self._since
            for row, rate in self._active.items():
                self.elapsed[row] += spent * rate
            self._active = {}


def verify_row(
    draft: torch.LongTensor, draft_logits: torch.Tensor | None, scores: torch.Tensor, do_sample: bool
) -> tuple[torch.LongTensor, int]:
    """One row's acceptance, as MetaSD's single-request loop does it: the target's processed `scores` ``(n + 1, V)``
    at the row's last token and its `n` drafted tokens `draft`; greedy matching, speculative sampling with the
    drafter's processed `draft_logits` ``(n, V)``, or sampled matching for a drafter without logits. Returns the
    round's tokens ``(1, a + 1)`` and the number `a` of drafted tokens accepted.

    Example:
        >>> scores = torch.tensor([[0.0, 5.0, 0.0], [0.0, 0.0, 5.0], [5.0, 0.0, 0.0]])  # the target: 1, then 2, then 0
        >>> verify_row(torch.tensor([1, 1]), None, scores, do_sample=False)  # accepts 1, rejects the second 1
        (tensor([[1, 2]]), 1)
    """
    logits = None if draft_logits is None else draft_logits[None].to(scores.device)
    return accept_draft(draft[None].to(scores.device), logits, scores[None], do_sample)


def batched_decoding(
    model: Any,
    input_ids: torch.LongTensor,
    *,
    generators: Sequence[Any],
    clocks: RowClocks,
    steps: PlainSteps,
    scores: BatchScores,
    generation_config: Any,
    passes: PassCosts | None = None,
    guard: DraftingGuard | None = None,
    telemetry: Any = None,
    **model_kwargs: Any,
) -> torch.LongTensor:
    """Decode the batch `input_ids` ``(B, L)`` (checked by `hf_metasd.batched.call`), one candidate generator per row.

    Args:
        model: the target.
        generators: ``B`` candidate generators (`MetaCandidateGenerator`), generator `b` for row `b`.
        clocks: the rows' clocks (the generators read them).
        steps: the batch's tokens and plain `generate`'s stopping (its criteria and streamer).
        scores: the call's logits processors over the batch.
        generation_config: what `generate` prepared (``do_sample``).
        passes: the batch's pass costs, which the rows' draft lengths read (`hf_metasd.batched.lengths`; default:
            a fresh one, shared with no row).
        guard: whether the batch drafts at all (`hf_metasd.batched.lengths.DraftingGuard`: a plain round measures
            plain's cost, and drafting stops once it measures slower; default: a fresh one).
        telemetry: a `MetaSDBatchStats` to record the passes in (optional).
        model_kwargs: the target's inputs as `generate` prepared them: ``attention_mask`` (or None: no padding),
            ``position_ids`` (None: the model takes none), ``cache``, ``use_cache``, ``logits_to_keep``.

    Returns:
        ``(B, L + T)`` the ids plain batched `generate` returns.
    """
    batch, length = input_ids.shape
    mask = model_kwargs.get("attention_mask")
    mask = torch.ones_like(input_ids) if mask is None else mask
    cache = model_kwargs["cache"]
    positions = model_kwargs.get("position_ids")  # None: the model takes none (ALiBi follows the mask itself)
    takes_positions = positions is not None
    if positions is None:
        positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
    slots = Slots(mask, positions)
    prompts = [input_ids[b][mask[b].bool()] for b in range(batch)]  # each request's own tokens
    passes = PassCosts(batch, generators[0].num_assistant_tokens) if passes is None else passes
    guard = DraftingGuard() if guard is None else guard
    plain_tokens = [0] * batch  # tokens each row got in plain rounds (telemetry)
    # the layers whose inputs white-box drafters read: recorded during each pass only (`hf_metasd.decoding`)
    layers = dict.fromkeys(ids for generator in generators for ids in generator.feature_layer_ids)
    recorders = {ids: FeatureRecorder(model, ids) for ids in layers}
    do_sample = bool(generation_config.do_sample)
    takes_keep = "logits_to_keep" in model_kwargs
    types = model_kwargs.get("token_type_ids")  # (B, L); every later token takes its row's last type, as in plain
    # a row whose mask keeps no token: its first token comes from attention over no token, which only plain's own
    # prefill pass gives exactly (a pass with draft columns is wider), so the prefill round drafts nothing
    empty = (~mask.bool().any(dim=1)).nonzero()[:, 0].tolist()
    if empty and telemetry is not None:
        telemetry.plain_reason = (
            f"the prefill round: row {empty[0]}'s `attention_mask` keeps no token (its first token comes from "
            "attention over no token, as in plain's prefill pass)"
        )
    first = True
    while not steps.finished:
        if steps.stuck():
            raise RuntimeError("MetaSD's batch has no row left to decode, but the stopping criteria never fired.")
        rows = [b for b in slots.rows if steps.needs_tokens(b)]
        if not first:
            slots.keep_rows(rows, cache)
        passes.rows = len(rows)
        round_started, drafting = clocks.now(), guard.drafting(first) and not (first and empty)
        drafts: list[tuple[torch.LongTensor, torch.Tensor | None]] = []
        for b in rows:
            if not drafting:  # a plain round: the row verifies its next token only, its generator sits it out
                drafts.append((input_ids.new_empty(0), None))
                continue
            view = torch.cat([prompts[b], steps.new_tokens(b)])[None]
            with clocks.running([b]):
                candidates, logits = generators[b].get_candidates(view)
            drafts.append((candidates[0, view.shape[1] :], None if logits is None else logits[0]))
        held = [prompts[b].shape[0] + steps.produced[b] for b in rows]  # each row's length before the round

        # one pass over every row (each row's clock charged its share), and the processed scores of every row's
        # positions
        columns = 1 + max(d.shape[0] for d, _ in drafts)
        if first:  # the prompts' prefill: shared equally
            rates = [1 / len(rows)] * len(rows)
        else:
            rates = [passes.weight(len(rows), 1 + d.shape[0], columns) for d, _ in drafts]
        started = clocks.now()
        with clocks.running(rows, rates), ExitStack() as timers:
            for b in rows:
                timers.enter_context(generators[b].stats.timed("verify"))
            lead = input_ids if first else torch.stack([steps.row(b)[0, -1:] for b in rows])
            inputs = slots.round_inputs(
                lead, [d.tolist() for d, _ in drafts], None if first else [steps.produced[b] for b in rows]
            )
            extra = {"logits_to_keep": inputs.keep} if takes_keep else {}
            if takes_positions:
                extra["position_ids"] = inputs.positions
            if types is not None:
                extra["token_type_ids"] = _fed_types(types, rows, inputs, first)
            model_inputs = model.prepare_inputs_for_generation(
                inputs.ids, cache=cache, attention_mask=inputs.mask, use_cache=True, is_first_iteration=first, **extra
            )
            outputs, features = recorded_pass(model, model_inputs, first=first, recorders=recorders)
            logits = outputs.logits[:, -inputs.keep :].to(dtype=torch.float32, device=input_ids.device)
            processed = _processed(scores, steps, rows, [d for d, _ in drafts], logits)
        seconds = clocks.now() - started
        if not first:  # the prefill is no verification pass
            passes.observe(len(rows), inputs.ids.shape[1], seconds)
        if telemetry is not None:
            telemetry.record_pass(rows, inputs.ids.shape[1], seconds)

        # each row accepts its own tokens and learns from its round
        kept_slots, tokens_given = [], 0
        for r, (b, (draft, draft_logits), row_scores) in enumerate(zip(rows, drafts, processed)):
            with clocks.running([b]):
                with generators[b].stats.timed("verify"):
                    tokens, matches = verify_row(draft, draft_logits, row_scores, do_sample)
                    # a row can finish while others catch up (a step they complete fires for it): it keeps nothing
                    kept = steps.add(b, tokens[0]) if steps.needs_tokens(b) else 0
                if kept:  # a row that finished meanwhile is done learning
                    view = torch.cat([prompts[b], steps.new_tokens(b)])[None]
                    if features:  # the row's own lead columns (its prompt without padding on the first pass, else
                        # its last token), then its accepted candidates: the newest kept token's comes with the next pass
                        own = mask[b].nonzero()[:, 0].cpu() if first else torch.zeros(1, dtype=torch.long)
                        columns = torch.cat([own, inputs.lead + torch.arange(kept - 1)])
                        observe_kept_features(generators[b], features, r, columns, view, 0 if first else held[r] - 1)
                    if drafting:
                        generators[b].update_candidate_strategy(view, row_scores[None], matches, num_kept=kept)
            kept_slots.append(max(kept - 1, 0))
            tokens_given += kept
            plain_tokens[b] += 0 if drafting else kept
        crop = slots.after_round(kept_slots)
        if crop:
            cache.crop(-crop)
        if not first:
            guard.observe(
                drafted=drafting,
                seconds=clocks.now() - round_started,
                tokens=tokens_given,
                rows=len(rows),
                drafted_tokens=sum(d.shape[0] for d, _ in drafts),
            )
        first = False

    if telemetry is not None:
        telemetry.wasted_slots = list(slots.wasted)
        telemetry.output_tokens = [steps.output_length(b) for b in range(batch)]
        telemetry.pass_costs = passes.summary()
        telemetry.drafting_stopped_after = guard.stopped_after
        telemetry.drafting_rounds = guard.rounds
        telemetry.drafted_rounds = guard.drafted_rounds
        telemetry.plain_tokens = plain_tokens
    return steps.sequences()


def _fed_types(types: torch.Tensor, rows: list[int], inputs: Any, first: bool) -> torch.Tensor:
    """The token types of the pass's columns: the prompt's own on the first pass, then each row's last prompt type
    (plain `generate` extends `token_type_ids` with each row's last one)."""
    last = types[rows, -1:]
    if first:
        return torch.cat([types, last.expand(-1, inputs.width)], dim=1)
    return last.expand(-1, inputs.ids.shape[1])


def _processed(
    scores: BatchScores, steps: PlainSteps, rows: list[int], drafts: list[torch.Tensor], logits: torch.Tensor
) -> list[torch.Tensor]:
    """Every row's processed scores ``(n + 1, V)`` at its last token and its `n` drafted tokens (the row as plain
    `generate` sees it, then its draft), from the pass's `logits` ``(R, W + 1, V)``."""
    requests = []
    for r, (b, draft) in enumerate(zip(rows, drafts)):
        sequence = torch.cat([steps.row(b)[0], draft.to(logits.device)])
        start = sequence.shape[0] - draft.shape[0]
        requests += [(b, sequence[: start + i], logits[r, i]) for i in range(draft.shape[0] + 1)]
    out = scores.process(requests)
    rows_scores, k = [], 0
    for draft in drafts:
        rows_scores.append(torch.stack(out[k : k + draft.shape[0] + 1]))
        k += draft.shape[0] + 1
    return rows_scores
