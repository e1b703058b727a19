"""Plain rounds for a whole batch: what a batch cannot draft with, and transformers' own loop for it.

A batch never refuses what plain batched `generate` runs. Rows draft where the output stays exactly plain's; where
the target or the call rules drafting out (`plain_reason`), every round is a plain round (one target step for the
whole batch, no draft): the call runs the loop plain `generate` runs for greedy search and sampling
(`GenerationMixin._sample`) on what `generate` prepared, so the sequences, the scores, logits, attentions and hidden
states asked for, the cache returned, the streamer's steps and the stopping criteria's calls are plain's, bit for bit.
The call's `MetaSDBatchStats.plain_reason` says why.

Why each case runs plain:

* per-step outputs (`output_scores`, `output_logits`, `output_attentions`, `output_hidden_states`): plain's come
  from one-token steps, and a verification pass over several tokens computes the same numbers in another order (they
  differ in the last bits); plain also computes them for finished rows, on their padding, which a batch never feeds;
* sliding-window, recurrent, hybrid or other non-growing cache layers: a row's rejected slots are masked out of its
  attention (`hf_metasd.batched.slots`), which a window that counts slots or a recurrent state cannot do;
* a cache passed in that holds positions: a batch lays out its cache from the prompts;
* a tensor-parallel target: every rank would have to agree on every row's drafts;
* model inputs other than ``attention_mask`` and ``token_type_ids`` (``inputs_embeds``, images, ...), several
  position streams (3-D ``position_ids``), no cache prepared.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import StoppingCriteriaList
from transformers.cache_utils import DynamicLayer

from .._distributed import tensor_parallel_group

__all__ = ["plain_reason", "run_plain"]

#: the model inputs rows draft with (what `generate` prepares for a decoder-only text model)
_MODEL_INPUTS = {"attention_mask", "position_ids", "cache", "use_cache", "logits_to_keep", "token_type_ids"}
#: outputs plain `generate` computes per one-token step, for finished rows too (on their padding)
_ROW_OUTPUTS = ("output_scores", "output_logits", "output_attentions", "output_hidden_states")


def plain_reason(model: Any, generation_config: Any, model_kwargs: dict[str, Any]) -> str | None:
    """Why the batch must run plain rounds only (see the module docstring), or ``None`` when its rows can draft.

    Example:
        >>> from types import SimpleNamespace
        >>> config = SimpleNamespace(return_dict_in_generate=True, output_scores=True)
        >>> plain_reason(torch.nn.Linear(2, 2), config, {})
        '`output_scores` is True (plain computes them in one-token steps, for finished rows too)'
    """
    if tensor_parallel_group(model) is not None:
        return "the target is tensor-parallel (every rank would have to agree on every row's drafts)"
    if generation_config.return_dict_in_generate:
        for name in _ROW_OUTPUTS:
            if getattr(generation_config, name, False):
                return f"`{name}` is True (plain computes them in one-token steps, for finished rows too)"
    for key, value in model_kwargs.items():
        if key not in _MODEL_INPUTS and value is not None:
            return f"`{key}` is a model input (rows draft with `input_ids`, `attention_mask` and `token_type_ids`)"
    positions = model_kwargs.get("position_ids")
    if positions is not None and positions.ndim != 2:
        return f"the target takes {positions.ndim}-D `position_ids` (several position streams)"
    types = model_kwargs.get("token_type_ids")
    if types is not None and types.ndim != 2:
        return f"`token_type_ids` is {types.ndim}-D (rows draft with one type per token)"
    return _cache_reason(model_kwargs.get("cache"))


def _cache_reason(cache: Any) -> str | None:
    """Why rows cannot draft on `cache` (``None``: they can)."""
    if cache is None:
        return "`generate` prepared no cache"
    layers = getattr(cache, "layers", None)
    if layers is None:
        return f"the target's cache is a `{type(cache).__name__}` without layers"
    odd = [type(layer).__name__ for layer in layers if type(layer) is not DynamicLayer]
    if odd:  # a plain growing full-attention layer only: not a sliding window, a recurrent state, a quantized one
        return (
            f"the target's cache holds `{odd[0]}` layers (a row's rejected slots are masked out of its attention, "
            "which a sliding window or a recurrent state cannot do)"
        )
    held = int(cache.get_seq_length())
    if held > 0:
        return f"the cache passed in holds {held} positions (a batch lays out its cache from its prompts)"
    return None


class _RecordedCriteria(StoppingCriteriaList):
    """The call's stopping criteria, unchanged, recording the step at which each row first finished."""

    def __init__(self, criteria: Any, prompt_length: int, rows: int) -> None:
        super().__init__(criteria)
        self.prompt_length = prompt_length
        self.ended_at: list[int | None] = [None] * rows

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        done = super().__call__(input_ids, scores, **kwargs)
        step = input_ids.shape[1] - self.prompt_length
        for b in done.nonzero()[:, 0].tolist():
            if self.ended_at[b] is None:
                self.ended_at[b] = step
        return done


def run_plain(
    model: Any,
    input_ids: torch.LongTensor,
    *,
    logits_processor: Any,
    stopping_criteria: Any,
    generation_config: Any,
    streamer: Any,
    model_kwargs: dict[str, Any],
) -> tuple[Any, list[int]]:
    """Decode the batch as plain `generate` does (transformers' `_sample`, the decoding method of greedy search and
    sampling). Returns its output and each row's tokens in it before any padding (up to the step at which the row
    finished when finished rows are padded, as `hf_metasd.batched.steps.PlainSteps.output_length` counts them)."""
    criteria = _RecordedCriteria(stopping_criteria, input_ids.shape[1], input_ids.shape[0])
    output = type(model)._sample(
        model,
        input_ids,
        logits_processor=logits_processor,
        stopping_criteria=criteria,
        generation_config=generation_config,
        synced_gpus=False,
        streamer=streamer,
        **model_kwargs,
    )
    sequences = output if isinstance(output, torch.Tensor) else output.sequences
    steps = sequences.shape[1] - input_ids.shape[1]
    pads = any(hasattr(criterion, "eos_token_id") for criterion in stopping_criteria)
    ends = [steps if ended is None or not pads else min(ended, steps) for ended in criteria.ended_at]
    return output, ends
