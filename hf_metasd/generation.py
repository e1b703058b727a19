"""The one seam between MetaSD and `model.generate`.

Two ways in, same result:

* ``model.generate(**inputs, custom_generate=hf_metasd.generate, assistant_models=[...])``: transformers' own hook;
  `generate` below is a decoding method with the signature transformers expects.
* ``hf_metasd.enable()`` once, then ``model.generate(**inputs, assistant_models=[...])``. `enable` wraps
  `GenerationMixin.generate`; a call without `assistant_models` goes to the original method untouched, and `disable`
  restores it.

The draft-and-verify loop itself is transformers' assisted-decoding loop (`GenerationMixin._assisted_decoding`), so
stopping criteria, logits processors, speculative sampling, streamers and `return_dict_in_generate` behave as in
transformers; MetaSD only provides the candidate generator for that loop.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from transformers.generation.utils import GenerateDecoderOnlyOutput, GenerationMixin

from .candidate_generator import DEFAULT_NUM_ASSISTANT_TOKENS, MetaCandidateGenerator
from .drafters import as_drafters
from .errors import MetaSDConfigError
from .kernels import skinny_linear
from .policies import Policy, get_policy
from .rewards import RoundFeedback, get_reward
from .stats import MetaSDStats

__all__ = ["MetaSDGenerateOutput", "disable", "enable", "generate", "is_enabled"]

#: keyword arguments that only mean something together with `assistant_models`.
META_KWARGS = (
    "meta_policy",
    "meta_policy_kwargs",
    "meta_reward",
    "meta_full_information",
    "meta_warm_start",
    "meta_skinny_gemm",
)


@dataclass
class MetaSDGenerateOutput(GenerateDecoderOnlyOutput):
    """`GenerateDecoderOnlyOutput` plus `metasd`, the call's `MetaSDStats`."""

    metasd: MetaSDStats | None = None


def _pool_from(assistant_models: Any) -> tuple[Any, dict[str, Any]]:
    """Split a pool object (anything with `drafters` and `generate_kwargs()`) into drafters and its defaults."""
    if hasattr(assistant_models, "drafters") and hasattr(assistant_models, "generate_kwargs"):
        return assistant_models.drafters, dict(assistant_models.generate_kwargs())
    return assistant_models, {}


def build_candidate_generator(
    model: Any,
    generation_config: Any,
    logits_processor: Any,
    input_ids: Any,
    *,
    assistant_models: Any,
    meta_policy: str | Policy,
    meta_policy_kwargs: dict[str, Any] | None,
    meta_reward: str | Callable[[RoundFeedback], float],
    num_assistant_tokens: int | None,
    meta_full_information: bool,
    meta_warm_start: int = 0,
) -> MetaCandidateGenerator:
    """Validate everything a MetaSD call needs, before any forward pass, and build its candidate generator."""
    if assistant_models is None:
        raise MetaSDConfigError(
            "`assistant_models` must be given to `hf_metasd.generate`, but is None. "
            "Pass e.g. `assistant_models=[drafter]`, or drop `custom_generate` for plain `generate`."
        )
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
    if (generation_config.num_beams or 1) > 1:
        raise MetaSDConfigError(
            f"`num_beams` must be 1 for MetaSD, but is {generation_config.num_beams}. Use greedy or sampling."
        )
    if (generation_config.num_return_sequences or 1) > 1:
        raise MetaSDConfigError(
            f"`num_return_sequences` must be 1 for MetaSD, but is {generation_config.num_return_sequences}. "
            "Call `generate` several times instead."
        )
    if input_ids.shape[0] != 1:  # after the beam checks: transformers expands the batch by `num_beams`
        raise MetaSDConfigError(
            f"batch size must be 1 for MetaSD (batched drafting is not supported yet), but is {input_ids.shape[0]}. "
            "Call `generate` once per prompt."
        )
    if getattr(generation_config, "assistant_ensemble_weight", None) is not None:
        raise MetaSDConfigError(
            f"`assistant_ensemble_weight` must be None for MetaSD (it changes the output distribution), but is "
            f"{generation_config.assistant_ensemble_weight}. Drop it: MetaSD is lossless."
        )
    drafters, pool_defaults = _pool_from(assistant_models)
    drafters = as_drafters(drafters, model)
    for drafter in drafters:
        drafter.check_compatible(model)
    if meta_policy is None:
        meta_policy = pool_defaults.get("meta_policy", "ucb")
        meta_policy_kwargs = meta_policy_kwargs or pool_defaults.get("meta_policy_kwargs")
    if meta_reward is None:
        meta_reward = pool_defaults.get("meta_reward", "bd")
    if num_assistant_tokens is None:
        num_assistant_tokens = pool_defaults.get("num_assistant_tokens", DEFAULT_NUM_ASSISTANT_TOKENS)
    policy = get_policy(meta_policy, **(meta_policy_kwargs or {}))
    get_reward(meta_reward)  # validate the name before any compute
    return MetaCandidateGenerator(
        drafters,
        policy,
        reward=meta_reward,
        num_assistant_tokens=num_assistant_tokens,
        logits_processor=logits_processor,
        generation_config=generation_config,
        full_information=meta_full_information,
        warm_start=meta_warm_start,
    )


@contextmanager
def _candidate_generator_seam(model: Any, candidate_generator: MetaCandidateGenerator) -> Iterator[None]:
    """Make `model._get_candidate_generator` return ours for the duration of one call."""

    def _get_candidate_generator(*args: Any, **kwargs: Any) -> MetaCandidateGenerator:
        return candidate_generator

    model.__dict__["_get_candidate_generator"] = _get_candidate_generator
    try:
        yield
    finally:
        model.__dict__.pop("_get_candidate_generator", None)


def generate(
    model: Any,
    input_ids: Any,
    logits_processor: Any,
    stopping_criteria: Any,
    generation_config: Any,
    synced_gpus: bool = False,
    streamer: Any = None,
    assistant_models: Any = None,
    meta_policy: str | Policy | None = None,
    meta_policy_kwargs: dict[str, Any] | None = None,
    meta_reward: str | Callable[[RoundFeedback], float] | None = None,
    num_assistant_tokens: int | None = None,
    meta_full_information: bool = False,
    meta_warm_start: int = 0,
    meta_skinny_gemm: bool | None = None,
    metasd_streamer: Any = None,
    **model_kwargs: Any,
) -> Any:
    """MetaSD decoding method, for ``model.generate(..., custom_generate=hf_metasd.generate)``.

    Args:
        assistant_models: the pool: a list mixing transformers causal LMs, peft models (one arm per adapter) and
            `Drafter` objects, or a `DrafterPool` (which brings its own policy, reward and draft length defaults).
        meta_policy: a registered policy name (a fresh policy per call, as in the paper) or a `Policy` instance
            (keeps learning across calls). Default ``"ucb"``.
        meta_policy_kwargs: settings for a policy given by name, e.g. ``{"beta": 0.5}``.
        meta_reward: ``"bd"`` (default), ``"be"``, ``"cost"`` or a callable ``f(RoundFeedback) -> float``.
        num_assistant_tokens: tokens drafted per round (default 5).
        meta_full_information: also score the drafters that did not draft (see `MetaCandidateGenerator`).
        meta_warm_start: prompt warm start over this many last prompt positions (0: off; see
            `MetaCandidateGenerator`).
        meta_skinny_gemm: compute the target's float32 CPU linear layers as ``(W @ x.T).T`` during the call when 2
            to 8 tokens go through (the verification passes; see `hf_metasd.kernels`). ``None`` (default): on when
            the target has such layers; ``False``: transformers' kernels throughout.
        metasd_streamer: a streamer; transformers does not forward `streamer` to custom decoding methods, so pass it
            under this name with `custom_generate` (with `hf_metasd.enable()`, `streamer=` works as usual).

    Returns:
        What `generate` returns; with ``return_dict_in_generate=True`` a `MetaSDGenerateOutput` whose `metasd` holds
        the per-round telemetry.
    """
    if meta_skinny_gemm is not None and not isinstance(meta_skinny_gemm, bool):
        raise MetaSDConfigError(
            f"`meta_skinny_gemm` must be True, False or None (automatic), but is {meta_skinny_gemm!r}. "
            "Pass a bool, or leave it out."
        )
    candidate_generator = build_candidate_generator(
        model,
        generation_config,
        logits_processor,
        input_ids,
        assistant_models=assistant_models,
        meta_policy=meta_policy,
        meta_policy_kwargs=meta_policy_kwargs,
        meta_reward=meta_reward,
        num_assistant_tokens=num_assistant_tokens,
        meta_full_information=meta_full_information,
        meta_warm_start=meta_warm_start,
    )
    if streamer is None and metasd_streamer is not None:
        # transformers put the prompt into `streamer` before decoding; it never saw this one, so do it here
        streamer = metasd_streamer
        streamer.put(input_ids.cpu())
    # None (automatic) and True: `skinny_linear` changes the eligible layers, and nothing when there are none
    kernels = nullcontext() if meta_skinny_gemm is False else skinny_linear(model)
    try:
        with _candidate_generator_seam(model, candidate_generator), kernels:
            output = GenerationMixin._assisted_decoding(
                model,
                input_ids,
                logits_processor=logits_processor,
                stopping_criteria=stopping_criteria,
                generation_config=generation_config,
                synced_gpus=synced_gpus,
                streamer=streamer,
                **model_kwargs,
            )
    finally:
        for drafter in candidate_generator.drafters:
            drafter.reset()  # free the drafters' KV caches
    if isinstance(output, GenerateDecoderOnlyOutput):
        return MetaSDGenerateOutput(**dict(output.items()), metasd=candidate_generator.stats)
    return output


# ---------------------------------------------------------------------- enable / disable
_ORIGINAL_GENERATE: Callable[..., Any] | None = None


def is_enabled() -> bool:
    """Whether `enable()` is in effect."""
    return _ORIGINAL_GENERATE is not None


def enable() -> None:
    """Let every transformers model's `generate` accept `assistant_models=` (idempotent; undo with `disable`).

    Importing hf_metasd changes nothing; this call wraps `GenerationMixin.generate`. Calls without
    `assistant_models` reach the original method unchanged.
    """
    global _ORIGINAL_GENERATE
    if _ORIGINAL_GENERATE is not None:
        return
    original = GenerationMixin.generate

    @functools.wraps(original)
    def generate_with_metasd(self: Any, *args: Any, assistant_models: Any = None, **kwargs: Any) -> Any:
        if assistant_models is None:
            given = [k for k in META_KWARGS if k in kwargs]
            if given:
                raise MetaSDConfigError(
                    f"`{given[0]}` needs `assistant_models`, but `assistant_models` is None. "
                    "Pass the drafters with `assistant_models=[...]`, or drop the `meta_*` arguments."
                )
            return original(self, *args, **kwargs)
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
        custom = kwargs.pop("custom_generate", None)
        if custom is not None and custom is not generate:
            raise MetaSDConfigError(
                f"`custom_generate` must be None or `hf_metasd.generate` with `assistant_models`, but is {custom!r}. "
                "Drop one of them."
            )
        streamer = kwargs.pop("streamer", None)
        if streamer is not None:
            kwargs["metasd_streamer"] = streamer
        return original(self, *args, custom_generate=generate, assistant_models=assistant_models, **kwargs)

    _ORIGINAL_GENERATE = original
    GenerationMixin.generate = generate_with_metasd


def disable() -> None:
    """Restore transformers' own `GenerationMixin.generate` (idempotent)."""
    global _ORIGINAL_GENERATE
    if _ORIGINAL_GENERATE is None:
        return
    GenerationMixin.generate = _ORIGINAL_GENERATE
    _ORIGINAL_GENERATE = None
