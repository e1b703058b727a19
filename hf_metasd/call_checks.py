"""What a MetaSD call refuses before any compute: a target it cannot serve, a drafter without weights, and the
arguments that mean another assisted-decoding method. `hf_metasd.generation` runs these checks on both entry points;
each message says what to do instead.
"""

from __future__ import annotations

import inspect
from dataclasses import fields
from typing import Any, get_args

from transformers.utils import ModelOutput

from .errors import DrafterCompatibilityError, MetaSDConfigError
from .settings import check_setting_names

__all__ = ["check_call_kwargs", "check_drafter_device", "check_stop_strings", "check_target"]


def check_target(model: Any, generation_config: Any, input_ids: Any) -> None:
    if getattr(model.config, "is_encoder_decoder", False):
        raise MetaSDConfigError(
            f"the target must be a decoder-only model, but {type(model).__name__} is encoder-decoder. "
            "Use transformers' `assistant_model=` for encoder-decoder targets."
        )
    if getattr(model, "_is_stateful", False):
        raise MetaSDConfigError(
            f"the target must be able to roll back its cache, but {type(model).__name__} is stateful. "
            "Use a transformer target."
        )
    _check_outputs_carry_cache(model)
    if generation_config.use_cache is False:
        raise MetaSDConfigError(
            "`use_cache` must be True for MetaSD (the target verifies each draft on its KV cache and rolls it back "
            "past rejected tokens), but is False. Drop `use_cache=False` (and set `generation_config.use_cache` "
            "back to True if you changed it)."
        )
    if (generation_config.num_beams or 1) > 1:
        raise MetaSDConfigError(
            f"`num_beams` must be 1 for MetaSD, but is {generation_config.num_beams}. Use greedy or sampling."
        )
    if (generation_config.num_return_sequences or 1) > 1:
        raise MetaSDConfigError(
            f"`num_return_sequences` must be 1 for MetaSD, but is {generation_config.num_return_sequences}. "
            "Call `generate` several times instead."
        )
    if getattr(generation_config, "assistant_ensemble_weight", None) is not None:
        raise MetaSDConfigError(
            f"`assistant_ensemble_weight` must be None for MetaSD (it changes the output distribution), but is "
            f"{generation_config.assistant_ensemble_weight}. Drop it: MetaSD is lossless."
        )
    for key in ("prompt_lookup_num_tokens", "assistant_early_exit"):
        if getattr(generation_config, key, None) is not None:
            raise MetaSDConfigError(
                f"`{key}` must be None when `assistant_models` is given, but is {getattr(generation_config, key)!r}. "
                "Put that drafter in the pool instead (`hf_metasd.drafters.PromptLookupDrafter()`, "
                "`hf_metasd.drafters.EarlyExitDrafter(target, k)`)."
            )


def check_drafter_device(drafter: Any) -> None:
    """Refuse a drafter on the ``meta`` device (a model built under ``torch.device("meta")``, or loaded without its
    weights): it has no weights to draft with."""
    if drafter.device.type == "meta":
        raise DrafterCompatibilityError(
            f"drafter {drafter.name!r} must hold its weights on a real device, but is on the `meta` device (built "
            'under `torch.device("meta")`, or loaded without weights). Build or load it on a real device, e.g. '
            "with `AutoModelForCausalLM.from_pretrained(...)`."
        )


def _check_outputs_carry_cache(model: Any) -> None:
    """Refuse a target whose forward pass returns no cache: MetaSD verifies on the target's cache and rolls it back
    past rejected tokens, and a model that keeps its state elsewhere (RecurrentGemma: inside its modules) cannot be
    rolled back. Read from the output class that the model class's `forward` is annotated to return; a `forward`
    without a `ModelOutput` annotation (e.g. a wrapper) is not refused here."""
    returned = inspect.signature(type(model).forward).return_annotation
    outputs = [t for t in get_args(returned) or (returned,) if isinstance(t, type) and issubclass(t, ModelOutput)]
    carry = [{f.name for f in fields(output)} & {"cache", "past_key_values", "cache_params"} for output in outputs]
    if outputs and not any(carry):
        raise MetaSDConfigError(
            f"the target's outputs must carry its cache (MetaSD rolls it back after each round), but "
            f"{type(model).__name__} returns {outputs[0].__name__}, which has none (its state lives inside the "
            "model). Call `generate` without `assistant_models` for this model (transformers' `assistant_model=` "
            "fails on it too)."
        )


def check_stop_strings(stop_strings: Any) -> None:
    """Refuse `stop_strings` that reached `generate` itself, i.e. through ``custom_generate=hf_metasd.generate``.

    transformers (5.x) takes `tokenizer` out of a call's arguments and drops it when `custom_generate` is a callable:
    neither its own stopping criteria nor this method can see it. `generate` declares `stop_strings` so that
    transformers passes them here (an argument of the method's own) instead of failing for want of a tokenizer, and
    this says what works. (`enable` reads `tokenizer` before transformers does and builds the criterion itself, so
    stop strings given through it never get here.)
    """
    if stop_strings is None:
        return
    raise MetaSDConfigError(
        "`stop_strings` must be passed through `hf_metasd.enable()` (transformers does not hand a callable "
        f"`custom_generate` the `tokenizer`), but are {stop_strings!r} with `custom_generate=hf_metasd.generate`. "
        "Call `hf_metasd.enable()` first (then `stop_strings=` with `tokenizer=` works, with or without "
        "`custom_generate`), pass `stopping_criteria=StoppingCriteriaList([StopStringCriteria(tokenizer, "
        "stop_strings)])`, or use a `custom_generate` repository folder (`hf-metasd custom-generate-repo FOLDER`, "
        "then `custom_generate=FOLDER, trust_remote_code=True`: a folder's `generate` gets the tokenizer)."
    )


def check_call_kwargs(kwargs: dict[str, Any]) -> None:
    """Arguments that mean another assisted-decoding method: refused the same way on both entry points."""
    check_setting_names(kwargs, "`generate`'s keyword arguments")
    if kwargs.get("assistant_model") is not None:
        raise MetaSDConfigError(
            "`assistant_model` must be None when `assistant_models` is given, but both are set. "
            "Put every drafter in `assistant_models=[...]`."
        )
    if kwargs.get("prompt_lookup_num_tokens") is not None:
        raise MetaSDConfigError(
            "`prompt_lookup_num_tokens` must be None when `assistant_models` is given, but is "
            f"{kwargs['prompt_lookup_num_tokens']}. Add `hf_metasd.drafters.PromptLookupDrafter()` to the pool."
        )
    if kwargs.get("assistant_tokenizer") is not None:
        raise MetaSDConfigError(
            "`assistant_tokenizer` must be None when `assistant_models` is given, but is set. A drafter with "
            "another tokenizer carries its own: build it as a drafter of the pool."
        )
