"""A MetaSD call on a batch: the checks it needs before any compute, one candidate generator per row, the loop.

`hf_metasd.generate` hands a call whose `input_ids` hold more than one row to `generate_batch`, with the function
that builds a candidate generator (`hf_metasd.generation.build_candidate_generator`: the target's and the drafters'
checks, per-call drafter copies, the policy and its priors). Each row is a request of its own: it gets its own
generator (its own drafter copies, its own policy, spawned from the call's settings and priors), built on the row
without its padding. What rows learn across calls (costs, verification costs, rewards for priors) is kept per target
*and batch size* (`batch_key`): a pass over eight rows costs what it costs at eight.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .._distributed import tensor_parallel_group
from ..drafters import as_drafters
from ..errors import MetaSDConfigError
from ..policies import Policy
from .lengths import PassCosts, RowLengths
from .loop import RowClocks, batched_decoding
from .processors import BatchScores, RowProcessors
from .steps import PlainSteps
from .telemetry import MetaSDBatchStats

__all__ = ["batch_key", "check_batch", "generate_batch"]

#: the model inputs a batch understands (what `generate` prepares for a decoder-only text model)
_MODEL_INPUTS = {"attention_mask", "position_ids", "cache", "use_cache", "logits_to_keep"}
#: outputs plain `generate` computes for finished rows too (on their padding), which a batch does not
_ROW_OUTPUTS = ("output_scores", "output_logits", "output_attentions", "output_hidden_states")


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


def check_batch(
    model: Any, generation_config: Any, drafters: Sequence[Any], settings: Any, model_kwargs: dict[str, Any]
) -> None:
    """Refuse, before any compute, what a batch cannot serve exactly as plain batched `generate` (see the docs page
    "Batches"). Every drafter kind is served: each row drafts with copies of its own (`Drafter.spawn`)."""
    if settings.meta_skinny_gemm:
        raise MetaSDConfigError(
            "`meta_skinny_gemm` must be None or False at batch size > 1 (the transposed product serves passes of a "
            "few tokens; a batch's pass verifies every row's), but is True. Drop it."
        )
    if tensor_parallel_group(model) is not None:
        raise MetaSDConfigError(
            "batch size must be 1 on a tensor-parallel target, but is above 1. Call `generate` once per prompt."
        )
    if generation_config.return_dict_in_generate:
        for name in _ROW_OUTPUTS:
            if getattr(generation_config, name, False):
                raise MetaSDConfigError(
                    f"`{name}` must be False at batch size > 1 (plain `generate` computes them for finished rows "
                    f"too, which a MetaSD batch never feeds again), but is True. Drop it, or call `generate` once per "
                    "prompt."
                )
    for key, value in model_kwargs.items():
        if key not in _MODEL_INPUTS and value is not None:
            raise MetaSDConfigError(
                f"the model inputs must be `input_ids` and `attention_mask` at batch size > 1, but `{key}` was given. "
                "Call `generate` once per prompt with it."
            )
    cache = model_kwargs.get("cache")
    if cache is None:
        raise MetaSDConfigError(
            "the target's cache must be prepared by `generate` at batch size > 1, but is None. Leave `use_cache` at "
            "True and let `generate` build the cache."
        )
    if cache.get_seq_length() > 0:
        raise MetaSDConfigError(
            f"`cache` must be empty at batch size > 1 (a batch starts from its prompts), but holds "
            f"{cache.get_seq_length()} positions. Pass each conversation whole as `input_ids`, or call `generate` "
            "once per prompt."
        )
    odd = [type(layer).__name__ for layer in cache.layers if not _full_attention(layer)]
    if odd:
        raise MetaSDConfigError(
            "the target's cache must hold full-attention layers only at batch size > 1 (a row's rejected slots are "
            f"masked out of its attention, which a sliding window or a recurrent state cannot do), but holds {odd[0]}. "
            "Call `generate` once per prompt for this model."
        )
    positions = model_kwargs.get("position_ids")
    if positions is not None and positions.ndim != 2:
        raise MetaSDConfigError(
            f"the target's position ids must be 2-D at batch size > 1, but are {positions.ndim}-D (several position "
            "streams). Call `generate` once per prompt for this model."
        )
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool(mask.any(dim=1).all()):
        row = int((~mask.any(dim=1)).nonzero()[0, 0])
        raise MetaSDConfigError(
            f"`attention_mask` must keep at least one token of every row, but row {row} has none. Drop that prompt."
        )


def _full_attention(layer: Any) -> bool:
    """A plain growing full-attention layer (not a sliding window, a recurrent state, a quantized or a shared one)."""
    return type(layer) is DynamicLayer


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
) -> Any:
    """Decode the batch `input_ids` ``(B, L)`` with one candidate generator per row (`build` makes each, as
    `build_candidate_generator` does). Returns what plain batched `generate` returns: the ids, or with
    ``return_dict_in_generate=True`` an `output_class` (a `GenerateDecoderOnlyOutput` with a `metasd` field) holding
    the sequences and the call's `MetaSDBatchStats` (no cache: its slots are laid out for this loop's mask)."""
    batch, length = input_ids.shape
    mask = model_kwargs.get("attention_mask")
    mask = torch.ones_like(input_ids) if mask is None else mask
    rows = [input_ids[b][mask[b].bool()][None] for b in range(batch)]
    clocks = RowClocks(batch)
    key = batch_key(model, batch)
    steps = PlainSteps(
        input_ids,
        generation_config.max_length - length,
        stopping_criteria,
        pad_token_id=generation_config._pad_token_tensor,
    )
    scores = BatchScores(logits_processor, steps.padded)

    def build_row(b: int) -> Any:
        config = copy.copy(generation_config)  # the row's own length limit, on the row without its padding
        config.max_length = generation_config.max_length - length + rows[b].shape[1]
        processors = RowProcessors(scores, b, input_ids[b], rows[b].shape[1])
        return build(model, config, processors, rows[b], drafters, settings, cost_key=key, clock=clocks.clock(b))

    if isinstance(settings.meta_policy, Policy):  # before a row's generator binds it
        raise MetaSDConfigError(
            f"`meta_policy` must be a policy name at batch size > 1 (every row learns with a policy of its own), but "
            f"is a `{type(settings.meta_policy).__name__}` object. Pass its name, and its settings as "
            "`meta_policy_kwargs`."
        )
    generators = [build_row(0)]  # the target's and the drafters' checks first, as for one request
    check_batch(model, generation_config, generators[0].drafters, settings, model_kwargs)
    generators += [build_row(b) for b in range(1, batch)]
    if streamer is None and metasd_streamer is not None:
        streamer = metasd_streamer  # transformers never saw this one: it gets the prompt here (and refuses a batch
        streamer.put(input_ids.cpu())  # as plain `generate` does, if it takes one row only)
    steps.streamer = streamer
    # the pass costs every row's draft length reads (`hf_metasd.batched.lengths`)
    passes = PassCosts(batch, generators[0].num_assistant_tokens, target=key)
    for generator in generators:
        generator.lengths = generator.round_length.lengths = RowLengths.adopt(generator.lengths, passes)
    telemetry = MetaSDBatchStats([g.stats for g in generators])
    shared = as_drafters(drafters, model)
    start = clocks.now()
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
    telemetry.wall_seconds = clocks.now() - start
    ends = telemetry.output_tokens
    for b, generator in enumerate(generators):
        stats = generator.stats
        stats.wall_seconds = clocks.elapsed[b]
        stats.draft_length = generator.draft_length
        stats.verification_costs = generator.lengths.summary()
        for drafter in shared:
            output = torch.cat([rows[b][0], sequences[b, length : length + ends[b]]])[None]
            drafter.on_generation_end(output, rows[b].shape[1])
    if generation_config.return_dict_in_generate:
        return output_class(sequences=sequences, metasd=telemetry)
    return sequences
