"""The draft-and-verify loop of a MetaSD call: transformers' assisted decoding, with plain `generate`'s stopping.

It follows `GenerationMixin._assisted_decoding` step for step (transformers' own input preparation, cache handling,
logits processing and speculative sampling helpers are reused), with five differences that make the output the
one plain `generate` returns:

* **Stopping criteria are evaluated at every new position, in order, and the output is cut at the first position
  where one fires** (transformers' loop evaluates them once per round, after all accepted tokens were appended, and
  overshoots a custom criterion by up to the draft length). The criteria are called exactly once per kept token,
  with the sequence up to that token, as in plain `generate`, so stateful criteria see the same calls.
* **The streamer receives the kept tokens only**, round by round, then `end()`.
* **A round with no candidates is a plain target step** (the no-draft arm, or a drafter that abstained): one token
  through the target, nothing to verify.
* **A cache passed in is continued, as plain `generate`'s prefill does** (transformers' assisted decoding feeds the
  whole prompt again on top of it): the first round feeds the prompt positions the cache does not hold
  (`uncached_prompt_length`), and the user's cache ends holding every position but the last, as plain `generate`
  leaves it.
* **`output_hidden_states` / `output_attentions` are split per token at the rows that produced each token**
  (`_split_steps`; transformers' `_split_model_outputs` takes the first round's later tokens from the prompt's rows).
  With a left-padded prompt, the first round then verifies in two passes, the prompt alone and the candidates
  (`_prompt_then_candidates`): a masked prompt row attends to every key of its pass, so plain's prefill is the only
  pass that gives it plain's values.

The candidate generator is the one seam: ``get_candidates`` before the target's forward pass,
``update_candidate_strategy`` after acceptance. When its pool holds drafters that read the target's features
(`feature_layer_ids`, e.g. `hf_metasd.drafters.FeatureHeadDrafter`), every pass records the inputs of those layers
(`FeatureRecorder`: forward pre-hooks installed for the pass only) and, after acceptance, the features of the kept
positions go to them (``observe_target_features``); without such drafters no hook is installed.
"""

from __future__ import annotations

import copy
from contextlib import ExitStack
from typing import Any

import torch
from transformers.generation.candidate_generator import (
    _prepare_attention_mask,
    _prepare_position_ids,
    _prepare_token_type_ids,
)
from transformers.generation.utils import GenerateDecoderOnlyOutput, _speculative_sampling

from ._compat import activate_past_recording
from .errors import MetaSDConfigError
from .feature_head import FeatureRecorder

__all__ = ["assisted_decoding", "observe_kept_features", "recorded_pass", "uncached_prompt_length"]

_CACHE_NAMES = ("cache", "past_key_values")


def _first_stop(
    stopping_criteria: Any, sequence: torch.LongTensor, start: int, scores: tuple[torch.Tensor, ...] | None, new: Any
) -> int | None:
    """Index (0-based, among the ``len(new)`` new tokens at the end of `sequence`) of the first token after which a
    criterion fires, or None. `scores` are the processed scores before this round and `new` this round's."""
    for i in range(sequence.shape[1] - start):
        prefix = sequence[:, : start + i + 1]
        seen = None if scores is None else scores + tuple(new[: i + 1])
        if bool(stopping_criteria(prefix, seen).any()):
            return i
    return None


def uncached_prompt_length(input_ids: torch.LongTensor, model_kwargs: dict[str, Any], generation_config: Any) -> int:
    """How many of the last positions of `input_ids` the first forward pass feeds: those the target's cache lacks.

    As in plain `generate`'s prefill: with a cache passed in (continuing a conversation), `input_ids` is the whole
    conversation and the cache holds its first positions, so only the rest is fed; when the attention mask is longer
    than `input_ids`, `input_ids` holds only the new tokens (the mask covers the cached positions too) and all of it
    is fed. Without a cache, or with an empty one, the whole prompt is fed.

    Raises:
        MetaSDConfigError: the cache holds every position of `input_ids` (no token left to predict the next from).
    """
    length = input_ids.shape[1]
    cache = model_kwargs.get("cache")
    cached = 0 if cache is None else int(cache.get_seq_length())  # hybrid caches count in a tensor
    if cached == 0:
        return length
    mask = model_kwargs.get("attention_mask")
    # transformers drops an all-ones mask before decoding and records its length here
    mask_length = mask.shape[1] if mask is not None else getattr(generation_config, "_mask_length", None)
    if mask_length is not None and mask_length != length:
        return length
    if cached >= length:
        raise MetaSDConfigError(
            f"`cache` must hold fewer positions than `input_ids` ({length}), but holds {cached}. Pass the whole "
            "conversation as `input_ids` (the cached positions, then the new ones), or only the new tokens with an "
            "`attention_mask` over the whole conversation."
        )
    return length - cached


def _split_steps(
    steps: tuple,
    layers: tuple[torch.Tensor, ...],
    *,
    lead: int,
    tokens: range,
    cached: int,
    attention: bool,
    windows: tuple[int | None, ...] = (),
) -> tuple:
    """`steps` plus one tuple per kept token of `tokens`, of every layer's hidden states (or attentions) for that
    token, as plain `generate` returns them.

    `layers` come from one forward pass on a cache of `cached` positions: the round's first kept token (k = 0) was
    predicted at row `lead` (the last uncached prompt position in the first round, else 0), the k-th at row
    ``lead + k`` (`tokens` names the k this pass produced: ``range(1, kept)`` with ``lead = -1`` for a pass over the
    candidates alone). Plain `generate` produced the first kept token of the call from the whole prompt pass (rows
    ``0 .. lead``) and every other token from a pass over one row; a row's attentions reach the keys the layer held
    before the pass (all `cached` positions, or fewer on a sliding-window layer) and those of the rows up to it, and
    a one-row pass of plain `generate` at position ``p`` sees the last ``min(p, window - 1) + 1`` keys of a layer with
    a sliding window (`windows`: each attention layer's window, None for full attention; empty: all full).
    """
    for k in tokens:
        row = lead + k
        if not attention:
            steps += (tuple(layer[:, (0 if k == 0 else row) : row + 1] for layer in layers),)
            continue
        step = ()
        for i, layer in enumerate(layers):
            if layer is None:  # a layer without attentions stays None, as in plain `generate`
                step += (None,)
                continue
            held = layer.shape[-1] - layer.shape[-2]  # the keys the layer held before the pass
            window = windows[i] if i < len(windows) else None
            position = cached + row
            seen = position if window is None else min(position, window - 1)  # earlier keys plain's pass sees
            start, end = (0, lead + 1) if k == 0 else (row, row + 1)
            first_key = 0 if k == 0 else row + held - seen
            step += (layer[..., start:end, first_key : row + held + 1],)
        steps += (step,)
    return steps


def _attention_windows(cache: Any, attentions: tuple) -> tuple[int | None, ...]:
    """Each attention layer's sliding window (None: full attention), read from the cache layers that hold keys (the
    attention layers, in order; a hybrid's recurrent layers return no attentions). Empty when they do not line up."""
    layers = [layer for layer in getattr(cache, "layers", ()) if hasattr(layer, "keys")]
    if len(layers) != len(attentions):
        return ()
    return tuple(layer.sliding_window if getattr(layer, "is_sliding", False) else None for layer in layers)


def observe_kept_features(
    generator: Any,
    features: dict[tuple[int, ...], torch.Tensor],
    row: int,
    columns: torch.Tensor,
    ids: torch.LongTensor,
    start: int,
) -> None:
    """Hand `generator` the target's features of its kept positions ``start, start + 1, ...`` in its sequence `ids`
    ``(1, n)``: the `columns` of row `row` of a pass's `features` (``(R, W, k H)`` per layer ids), one per position,
    with the ids that follow those positions (``observe_target_features``). Positions past the end of `ids` (tokens
    plain's stopping criteria dropped from a finished row of a batch) are left out. The batched loop hands each row's
    features with it too."""
    columns = columns[: max(0, ids.shape[1] - 1 - start)]
    if columns.shape[0] == 0:
        return
    observed = {layer_ids: f[row : row + 1, columns.to(f.device)] for layer_ids, f in features.items()}
    generator.observe_target_features(observed, ids[:, start + 1 : start + 1 + columns.shape[0]], start)


def recorded_pass(
    model: Any, model_inputs: dict[str, Any], *, first: bool, recorders: dict[tuple[int, ...], FeatureRecorder]
) -> tuple[Any, dict[tuple[int, ...], torch.Tensor]]:
    """The target's forward pass over `model_inputs` (from ``prepare_inputs_for_generation``) as plain `generate`
    runs it (its decode-optimised path after the first pass), each of `recorders` hooked for this pass only; returns
    its outputs and what each recorder recorded, by its layer ids. The batched loop runs its passes with it too."""
    with ExitStack() as hooks:
        for recorder in recorders.values():
            hooks.enter_context(recorder)
        if first:
            outputs = model(**model_inputs)
        else:
            with model._optimize_model_for_decode():
                outputs = model(**model_inputs)
    recorded = {}
    for layer_ids, recorder in recorders.items():
        recorded[layer_ids] = recorder.features()
        recorder.clear()
    return outputs, recorded


def _pass(
    model: Any,
    ids: torch.LongTensor,
    kwargs: dict[str, Any],
    *,
    fed: int | None,
    first: bool,
    logits: int,
    asked: dict[str, bool],
    recorders: dict[tuple[int, ...], FeatureRecorder],
) -> tuple[Any, dict[tuple[int, ...], torch.Tensor]]:
    """One forward pass of the target over the last `fed` positions of `ids` (None: all of them), keeping the logits
    of the last `logits` positions; returns its outputs and what each recorder recorded (`recorded_pass`)."""
    model_inputs = model.prepare_inputs_for_generation(
        ids, next_sequence_length=fed, is_first_iteration=first, **kwargs
    )
    if "logits_to_keep" in model_inputs:
        model_inputs["logits_to_keep"] = logits
    model_inputs.update({name: True for name, value in asked.items() if value})
    return recorded_pass(model, model_inputs, first=first, recorders=recorders)


def _prompt_then_candidates(
    model: Any,
    candidate_ids: torch.LongTensor,
    cur_len: int,
    prompt_kwargs: dict[str, Any],
    candidate_kwargs: dict[str, Any],
    prompt_fed: int,
    cached: int,
    **one: Any,
) -> tuple[Any, dict[tuple[int, ...], torch.Tensor], list[tuple[Any, int, int, int]], torch.Tensor]:
    """The first round of a left-padded prompt in two passes: the prompt alone, as plain's prefill (its masked rows
    attend to every key of their pass, so the candidates' keys must not be in it), then the candidates on its cache.

    Returns the second pass's outputs, the features of both passes, each pass with the row of the round's first
    token, the first token it produced and the cache length before it (for `_split_steps`), and the logits of the
    last prompt position and of the candidates.
    """
    n = candidate_ids.shape[1] - cur_len
    fed = None if prompt_fed == cur_len else prompt_fed
    first, recorded = _pass(model, candidate_ids[:, :cur_len], prompt_kwargs, fed=fed, first=True, logits=1, **one)
    after = int(first.cache.get_seq_length())
    outputs, more = _pass(model, candidate_ids, candidate_kwargs, fed=n, first=False, logits=n, **one)
    recorded = {layers: torch.cat((recorded[layers], more[layers]), dim=1) for layers in recorded}
    logits = torch.cat((first.logits[:, -1:], outputs.logits[:, -n:]), dim=1)
    return outputs, recorded, [(first, prompt_fed - 1, 0, cached), (outputs, -1, 1, after)], logits


def _padded_prompt(mask: torch.Tensor | None, prompt_fed: int) -> bool:
    """Whether the first pass feeds masked prompt positions (a left-padded prompt)."""
    return mask is not None and not bool(mask[:, mask.shape[1] - prompt_fed :].all())


def accept_draft(
    candidates: torch.LongTensor, candidate_logits: torch.Tensor | None, scores: torch.Tensor, do_sample: bool
) -> tuple[torch.LongTensor, int]:
    """One row's acceptance: the target's processed `scores` ``(1, n + 1, V)`` at the last token and the `n` drafted
    `candidates` ``(1, n)``; speculative sampling with the drafter's processed `candidate_logits` ``(1, n, V)``, else
    greedy matching, or sampled matching for a drafter without logits. Returns the round's tokens ``(1, a + 1)`` and
    the number `a` of drafted tokens accepted. The batched loop accepts each of its rows with it too.
    """
    n = candidates.shape[1]
    if do_sample and candidate_logits is not None and n > 0:
        tokens, matches = _speculative_sampling(candidates, candidate_logits, n, scores)
        return tokens, int(matches)
    if do_sample:
        selected = torch.multinomial(scores[0].softmax(dim=-1), num_samples=1).squeeze(1)[None, :]
    else:
        selected = scores.argmax(dim=-1)
    matches = int(((~(candidates.to(selected.device) == selected[:, :-1])).cumsum(dim=-1) < 1).sum())
    return selected[:, : matches + 1], matches


def assisted_decoding(
    model: Any,
    input_ids: torch.LongTensor,
    *,
    candidate_generator: Any,
    logits_processor: Any,
    stopping_criteria: Any,
    generation_config: Any,
    streamer: Any = None,
    **model_kwargs: Any,
) -> GenerateDecoderOnlyOutput | torch.LongTensor:
    """Decode with `candidate_generator` proposing tokens and `model` verifying them (batch size 1).

    Args:
        model: the target (a transformers causal LM).
        input_ids: ``(1, L)`` the prompt.
        candidate_generator: a transformers `CandidateGenerator` (here `MetaCandidateGenerator`).
        logits_processor / stopping_criteria / generation_config: what `generate` prepared.
        streamer: optional; receives the kept tokens of each round, then `end()`.
        model_kwargs: the target's inputs as `generate` prepared them (its cache among them).

    Returns:
        ``(1, L + n)`` ids, or a `GenerateDecoderOnlyOutput` with ``return_dict_in_generate=True``.
    """
    cache = model_kwargs.get("cache")
    if cache is None:
        raise RuntimeError("MetaSD decoding needs the target's cache, but `generate` prepared none.")
    # Recurrent layers (mamba, hybrids) record the states a rollback needs: a pass feeds the last kept token and up
    # to `num_assistant_tokens` candidates, and recording all N + 1 positions runs them one by one, exactly as plain
    # decoding does (with fewer, the first positions go through the chunked scan, which on some models ignores the
    # cached state, and a rollback of all N candidates lands on the state before the pass).
    activate_past_recording(cache, candidate_generator.num_assistant_tokens + 1)
    # the first pass feeds only the prompt positions a cache passed in lacks; the attention mask may also cover
    # cached positions before `input_ids` (only the new tokens passed): that part is kept as it is
    prompt_fed = uncached_prompt_length(input_ids, model_kwargs, generation_config)
    mask = model_kwargs.get("attention_mask")
    mask_offset = 0 if mask is None else mask.shape[1] - input_ids.shape[1]
    stats = candidate_generator.stats
    do_sample = generation_config.do_sample
    return_dict = generation_config.return_dict_in_generate
    output_scores = return_dict and generation_config.output_scores
    output_logits = return_dict and generation_config.output_logits
    output_attentions = return_dict and generation_config.output_attentions
    output_hidden_states = return_dict and generation_config.output_hidden_states
    # the processed scores so far: returned with `output_scores`, and what a stopping criterion sees, as in plain
    # generate (there: the same tuple, or None without `output_scores`)
    scores: tuple[torch.Tensor, ...] | None = () if output_scores else None
    raw_logits: tuple[torch.Tensor, ...] | None = () if output_logits else None
    attentions: tuple | None = () if output_attentions else None
    hidden_states: tuple | None = () if output_hidden_states else None

    # the layers whose inputs white-box drafters read: recorded during each verification pass only
    recorders = {
        layer_ids: FeatureRecorder(model, layer_ids)
        for layer_ids in getattr(candidate_generator, "feature_layer_ids", ())
    }

    asked = {"output_attentions": output_attentions, "output_hidden_states": output_hidden_states}
    one = {"asked": asked, "recorders": recorders}
    # a left-padded prompt's masked rows attend to every key of their pass (no key is visible to them): with
    # attentions or hidden states returned, the first round feeds the prompt alone, as plain's prefill, and then the
    # candidates, so that those rows are plain's
    split_prompt = (output_attentions or output_hidden_states) and _padded_prompt(mask, prompt_fed)

    is_first_iteration = True
    finished = False
    while not finished:
        cur_len = input_ids.shape[1]
        # 1. candidates from the pool (none: a plain target step)
        candidate_ids, candidate_logits = candidate_generator.get_candidates(input_ids)
        with stats.timed("verify"):
            candidate_ids = candidate_ids.to(model.device)
            if candidate_logits is not None:
                candidate_logits = candidate_logits.to(model.device)
            candidate_length = candidate_ids.shape[1] - cur_len

            # 2. the target's forward pass over the last token and the candidates
            candidate_kwargs = copy.copy(model_kwargs)
            candidate_kwargs = _prepare_attention_mask(candidate_kwargs, mask_offset + candidate_ids.shape[1], False)
            candidate_kwargs = _prepare_token_type_ids(candidate_kwargs, candidate_ids.shape[1])
            if (position_ids := candidate_kwargs.get("position_ids")) is not None and candidate_length > 0:
                new_length = candidate_length + position_ids.shape[-1]
                candidate_kwargs = _prepare_position_ids(candidate_kwargs, new_length, False)
            # a Python int: on hybrid caches `get_seq_length` returns a tensor that this very pass updates in place
            cached = int(model_kwargs["cache"].get_seq_length())
            if is_first_iteration and candidate_length > 0 and split_prompt:
                prompt_kwargs = _prepare_attention_mask(copy.copy(model_kwargs), mask_offset + cur_len, False)
                outputs, recorded, passes, logits = _prompt_then_candidates(
                    model, candidate_ids, cur_len, prompt_kwargs, candidate_kwargs, prompt_fed, cached, **one
                )
            else:
                if is_first_iteration:
                    fed = None if prompt_fed == cur_len else prompt_fed + candidate_length
                else:
                    fed = candidate_length + 1
                outputs, recorded = _pass(
                    model,
                    candidate_ids,
                    candidate_kwargs,
                    fed=fed,
                    first=is_first_iteration,
                    logits=candidate_length + 1,
                    **one,
                )
                passes = [(outputs, prompt_fed - 1 if is_first_iteration else 0, 0, cached)]
                logits = outputs.logits
            if is_first_iteration and not outputs.cache.is_croppable:
                raise ValueError("MetaSD needs a target cache that can be cropped after verification.")

            # 3. processed logits at the candidate positions and the bonus position
            new_logits = logits[:, -candidate_length - 1 :].to(dtype=torch.float32, device=input_ids.device)
            next_token_logits = new_logits.clone() if output_logits else None
            if len(logits_processor) > 0:
                for i in range(candidate_length + 1):
                    new_logits[:, i, :] = logits_processor(candidate_ids[:, : cur_len + i], new_logits[:, i, :])

            # 4. acceptance: speculative sampling with drafter logits, else token matching
            valid_tokens, n_matches = accept_draft(candidate_ids[:, cur_len:], candidate_logits, new_logits, do_sample)
            budget = generation_config.max_length - cur_len
            valid_tokens = valid_tokens[:, :budget]

            # 5. stop exactly where plain generate stops: the first position where a criterion fires
            sequence = torch.cat((input_ids, valid_tokens.to(input_ids.device)), dim=-1)
            round_scores = [new_logits[:, i, :] for i in range(valid_tokens.shape[1])]
            stop = _first_stop(stopping_criteria, sequence, cur_len, scores, round_scores)
            kept = valid_tokens.shape[1] if stop is None else stop + 1
            finished = stop is not None or kept == 0
            input_ids = sequence[:, : cur_len + kept]
            if streamer is not None and kept:
                streamer.put(input_ids[:, cur_len:].cpu())
            # the cache holds every position fed; keep all but the last kept token (fed next round)
            outputs.cache.crop(-(candidate_length + 1 - kept))
            if recorders and kept:  # the positions fed (the prompt's uncached ones, or the last kept token), then the
                # accepted candidates: the bonus token is not fed yet, its feature comes with the next pass
                start = cur_len - prompt_fed if is_first_iteration else cur_len - 1
                columns = torch.arange(cur_len + kept - 1 - start)
                observe_kept_features(candidate_generator, recorded, 0, columns, input_ids, start)
        candidate_generator.update_candidate_strategy(input_ids, new_logits, n_matches, num_kept=kept)

        model_kwargs = model._update_model_kwargs_for_generation(
            outputs, model_kwargs, is_encoder_decoder=False, num_new_tokens=kept
        )
        if return_dict:
            if output_scores:
                scores += tuple(round_scores[:kept])
            if output_logits:
                raw_logits += tuple(next_token_logits[:, i, :] for i in range(kept))
            for i, (out, lead, first_token, held) in enumerate(passes):
                last = passes[i + 1][2] if i + 1 < len(passes) else kept
                split = {"lead": lead, "tokens": range(first_token, min(last, kept)), "cached": held}
                if output_attentions and out.attentions is not None:  # () per step under sdpa, as plain's
                    windows = _attention_windows(out.cache, out.attentions)
                    attentions = _split_steps(attentions, out.attentions, **split, attention=True, windows=windows)
                if output_hidden_states and out.hidden_states is not None:
                    hidden_states = _split_steps(hidden_states, out.hidden_states, **split, attention=False)
        is_first_iteration = False

    if streamer is not None:
        streamer.end()
    if not return_dict:
        return input_ids
    cache = next((model_kwargs[name] for name in _CACHE_NAMES if name in model_kwargs), None)
    return GenerateDecoderOnlyOutput(
        sequences=input_ids,
        scores=scores,
        logits=raw_logits,
        attentions=attentions,
        hidden_states=hidden_states,
        cache=cache,
    )
