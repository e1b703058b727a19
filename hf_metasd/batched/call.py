"""A MetaSD call on a batch: the settings it refuses before any compute, one candidate generator per row, the loop
(or, where rows cannot draft, plain rounds: `hf_metasd.batched.plain`).

`hf_metasd.generate` hands a call whose `input_ids` hold more than one row to `generate_batch`, with the function
that builds a candidate generator (`hf_metasd.generation.build_candidate_generator`: the target's and the drafters'
checks, per-call drafter copies, the policy and its priors). Each row is a request of its own: it gets its own
generator (its own drafter copies, its own policy, spawned from the call's settings and priors), built on the row
without its padding. What rows learn across calls (costs, verification costs, rewards for priors) is kept per target
*and batch size* (`batch_key`): a pass over eight rows costs what it costs at eight.
"""

from __future__ import annotations

import copy
import functools
import weakref
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from ..draft_length import DraftLength
from ..drafters import as_drafters
from ..errors import MetaSDConfigError
from ..policies import Policy
from .lengths import GuardMemory, PassCosts, RowLengths
from .loop import RowClocks, batched_decoding
from .plain import plain_reason, run_plain
from .processors import BatchScores, RowProcessors
from .steps import PlainSteps
from .telemetry import MetaSDBatchStats

__all__ = ["batch_key", "check_batch", "generate_batch"]


class _BatchKey:
    """Stands for one target at one batch size in the per-target caches (`hf_metasd.costs.target_cache`)."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size

    def __repr__(self) -> str:
        return f"<target at batch size {self.batch_size}>"


_BATCH_KEYS: weakref.WeakKeyDictionary[Any, dict[int, _BatchKey]] = weakref.WeakKeyDictionary()


def batch_key(target: Any, batch_size: int) -> Any:
    """The key of `target` at `batch_size` in the per-target caches: one object per pair, alive as long as `target`.

    Example:
        >>> target = torch.nn.Linear(2, 2)
        >>> batch_key(target, 4) is batch_key(target, 4), batch_key(target, 4) is batch_key(target, 8)
        (True, False)
    """
    try:
        keys = _BATCH_KEYS.setdefault(target, {})
    except TypeError:  # not weakly referenceable: nothing is kept across calls
        return None
    return keys.setdefault(batch_size, _BatchKey(batch_size))


def check_batch(settings: Any) -> None:
    """Refuse, before any compute, the MetaSD settings a batch cannot apply (see the docs page "Batches"). What plain
    batched `generate` runs is never refused: what rows cannot draft with runs plain rounds (`plain_reason`)."""
    if isinstance(settings.meta_policy, Policy):  # before a row's generator binds it
        raise MetaSDConfigError(
            f"`meta_policy` must be a policy name at batch size > 1 (every row learns with a policy of its own), but "
            f"is a `{type(settings.meta_policy).__name__}` object. Pass its name, and its settings as "
            "`meta_policy_kwargs`."
        )
    if settings.meta_skinny_gemm:
        raise MetaSDConfigError(
            "`meta_skinny_gemm` must be None or False at batch size > 1 (the transposed product serves passes of a "
            "few tokens; a batch's pass verifies every row's), but is True. Drop it."
        )


def generate_batch(
    model: Any,
    input_ids: torch.LongTensor,
    drafters: Any,
    settings: Any,
    build: Callable[..., Any],
    *,
    output_class: type = GenerateDecoderOnlyOutput,
    logits_processor: Any,
    stopping_criteria: Any,
    generation_config: Any,
    streamer: Any = None,
    metasd_streamer: Any = None,
    model_kwargs: dict[str, Any],
    clock: Callable[[], float] | None = None,
    cost_key: Any = None,
) -> Any:
    """Decode the batch `input_ids` ``(B, L)`` with one candidate generator per row (`build` makes each, as
    `build_candidate_generator` does). Returns what plain batched `generate` returns: the ids, or with
    ``return_dict_in_generate=True`` an `output_class` (a `GenerateDecoderOnlyOutput` with a `metasd` field) holding
    the sequences and the call's `MetaSDBatchStats` (no cache: its slots are laid out for this loop's mask). `clock`
    and `cost_key` replace the wall clock the rows' clocks run on and the batch's key in the per-process caches (a
    reproducible call's: `hf_metasd.reproducible`)."""
    batch, length = input_ids.shape
    mask = model_kwargs.get("attention_mask")
    # the mask may cover positions before `input_ids` (a prompt passed as `inputs_embeds`, a cache passed in): its
    # last columns are those of `input_ids`
    mask = torch.ones_like(input_ids) if mask is None else mask[:, mask.shape[1] - length :]
    rows = [input_ids[b][mask[b].bool()][None] for b in range(batch)]
    clocks = RowClocks(batch, base=clock)
    key = batch_key(model, batch) if cost_key is None else cost_key
    steps = PlainSteps(
        input_ids,
        generation_config.max_length - length,
        stopping_criteria,
        pad_token_id=generation_config._pad_token_tensor,
    )
    scores = BatchScores(logits_processor, steps.padded)
    check_batch(settings)
    reason = plain_reason(model, generation_config, model_kwargs)
    shared = as_drafters(drafters, model)
    memory = GuardMemory(key, shared)
    if reason is None and memory.plain():  # an earlier call measured drafting slower at this batch size
        reason = (
            f"an earlier call with this pool measured drafting slower than plain rounds at batch size {batch} "
            f"(drafting is measured again after {memory.next_check} more such calls)"
        )
    # rows that draft read their verification costs from the batch's passes (`hf_metasd.batched.lengths`)
    passes = None if reason is not None else PassCosts(batch, settings.num_assistant_tokens, target=key)
    lengths = DraftLength if passes is None else functools.partial(RowLengths, passes=passes)

    def build_row(b: int) -> Any:
        config = copy.copy(generation_config)  # the row's own length limit, on the row without its padding
        config.max_length = generation_config.max_length - length + rows[b].shape[1]
        processors = RowProcessors(scores, b, input_ids[b], rows[b].shape[1])
        return build(
            model,
            config,
            processors,
            rows[b],
            drafters,
            settings,
            cost_key=key,
            clock=clocks.clock(b),
            lengths=lengths,
        )

    generators = [build_row(b) for b in range(batch)]  # row 0's first: the target's and the drafters' checks
    if streamer is None and metasd_streamer is not None:
        streamer = metasd_streamer  # transformers never saw this one: it gets the prompt here (and refuses a batch
        streamer.put(input_ids.cpu())  # as plain `generate` does, if it takes one row only)
    telemetry = MetaSDBatchStats([g.stats for g in generators])
    start = clocks.now()
    if reason is not None:  # every round plain: transformers' own loop (`hf_metasd.batched.plain`)
        telemetry.plain_reason = f"every round: {reason}"
        output, ends = run_plain(
            model,
            input_ids,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
            generation_config=generation_config,
            streamer=streamer,
            model_kwargs=model_kwargs,
        )
        sequences = output if isinstance(output, torch.Tensor) else output.sequences
        telemetry.output_tokens, telemetry.plain_tokens = ends, list(ends)
    else:
        output, sequences = (
            None,
            _drafting(
                model,
                input_ids,
                generators,
                clocks,
                steps,
                scores,
                streamer,
                shared,
                passes,
                telemetry,
                generation_config,
                model_kwargs,
            ),
        )
        ends = telemetry.output_tokens
        memory.record(
            stopped=telemetry.drafting_stopped_after is not None,
            rounds=telemetry.drafting_rounds,
            drafted_rounds=telemetry.drafted_rounds,
        )
    telemetry.wall_seconds = clocks.now() - start
    for b, generator in enumerate(generators):
        stats = generator.stats
        stats.wall_seconds = clocks.elapsed[b]
        stats.draft_length = generator.draft_length
        stats.verification_costs = generator.lengths.summary()
        for drafter in shared if not settings.meta_reproducible else ():  # a reproducible call teaches no later one
            row = torch.cat([rows[b][0], sequences[b, length : length + ends[b]]])[None]
            drafter.on_generation_end(row, rows[b].shape[1])
    if isinstance(output, GenerateDecoderOnlyOutput):  # plain's: with its scores, logits, cache, ...
        return output_class(**dict(output.items()), metasd=telemetry)
    if generation_config.return_dict_in_generate:
        return output_class(sequences=sequences, metasd=telemetry)
    return sequences


def _drafting(
    model: Any,
    input_ids: torch.LongTensor,
    generators: list[Any],
    clocks: RowClocks,
    steps: PlainSteps,
    scores: BatchScores,
    streamer: Any,
    shared: list[Any],
    passes: PassCosts,
    telemetry: MetaSDBatchStats,
    generation_config: Any,
    model_kwargs: dict[str, Any],
) -> torch.LongTensor:
    """The rounds in which rows draft (`hf_metasd.batched.loop`), each row's draft length reading the batch's pass
    costs `passes` (its generator was built on them: `RowLengths`). Returns the sequences."""
    steps.streamer = streamer
    with ExitStack() as stack:
        for drafter in shared:
            stack.enter_context(drafter.in_use())
        sequences = batched_decoding(
            model,
            input_ids,
            generators=generators,
            clocks=clocks,
            steps=steps,
            scores=scores,
            generation_config=generation_config,
            passes=passes,
            telemetry=telemetry,
            **model_kwargs,
        )
    if streamer is not None:
        streamer.end()
    return sequences
