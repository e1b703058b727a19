"""The one seam between MetaSD and `model.generate`, and the one place for a call's defaults.

Two ways in, same result:

* ``model.generate(**inputs, custom_generate=hf_metasd.generate, assistant_models=[...])``: transformers' own hook;
  `generate` below is a decoding method with the signature transformers expects.
* ``hf_metasd.enable()`` once, then ``model.generate(**inputs, assistant_models=[...])``. `enable` wraps
  `GenerationMixin.generate`; a call without `assistant_models` (and without ``custom_generate=hf_metasd.generate``)
  goes to the original method untouched, and `disable` restores it.

Either way, transformers' single ``assistant_model=`` without `assistant_models` is a one-drafter pool (`one_pool`).

The draft-and-verify loop is `hf_metasd.decoding.assisted_decoding` (transformers' assisted decoding, stopping
where plain `generate` stops). A call never changes the user's objects: it drafts with per-call copies of the pool's
drafters (`Drafter.spawn`), so one pool can serve concurrent calls, and every drafter's modules get their training
flag and active adapter back when the call ends (`Drafter.in_use`).

**Settings**: a call's settings are one `MetaSDSettings` (`hf_metasd.settings`), built once per call with
transformers' precedence (call keyword > passed `GenerationConfig` > ``model.generation_config`` > the pool's
defaults > `DEFAULTS`) and validated once, before any forward pass.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from transformers.generation.utils import GenerateDecoderOnlyOutput, GenerationMixin

from ._call_signature import CallSignature, with_settings
from ._distributed import agreeing
from .batched import MetaSDBatchStats, generate_batch
from .call_checks import check_call_kwargs, check_drafter_device, check_stop_strings, check_target
from .candidate_generator import MetaCandidateGenerator
from .decoding import assisted_decoding, uncached_prompt_length
from .draft_length import DraftLength
from .drafters import as_drafters
from .errors import MetaSDConfigError
from .kernels import VerificationKernels
from .policies import Policy, get_policy
from .reproducible import reproducible_call, reproducible_settings
from .rewards import RoundFeedback
from .settings import (
    DEFAULTS,
    META_KWARGS,
    RETIRED_SETTINGS,
    SETTINGS,
    MetaSDSettings,
    check_setting_names,
    resolve_settings,
)
from .stats import MetaSDStats

__all__ = ["DEFAULTS", "SETTINGS", "MetaSDGenerateOutput", "disable", "enable", "generate", "is_enabled"]


@dataclass
class MetaSDGenerateOutput(GenerateDecoderOnlyOutput):
    """`GenerateDecoderOnlyOutput` plus `metasd`, the call's `MetaSDStats` (a `MetaSDBatchStats` for a batch)."""

    metasd: MetaSDStats | MetaSDBatchStats | None = None


# ---------------------------------------------------------------------- building a call
def _pool_from(assistant_models: Any) -> tuple[Any, dict[str, Any]]:
    """Split a `DrafterPool` into its drafters and its defaults; anything else is a list of drafters."""
    from .pool import DrafterPool

    if isinstance(assistant_models, DrafterPool):
        return assistant_models.drafters, assistant_models.generate_kwargs()
    return assistant_models, {}


def one_pool(assistant_models: Any, assistant_model: Any) -> Any:
    """The call's pool: `assistant_models`, or transformers' single `assistant_model` as a one-drafter pool (plain
    `generate` runs assisted decoding with it; MetaSD drafts with it, losslessly). Both given is refused."""
    if assistant_model is None:
        return assistant_models
    if assistant_models is not None:
        raise MetaSDConfigError(
            "`assistant_model` must be None when `assistant_models` is given, but both are set. "
            "Put every drafter in `assistant_models=[...]`."
        )
    return [assistant_model]


def build_candidate_generator(
    model: Any,
    generation_config: Any,
    logits_processor: Any,
    input_ids: Any,
    drafters: Any,
    settings: MetaSDSettings,
    *,
    pool_defaults: Mapping[str, Any] | None = None,
    priors_from_call: bool = False,
    cost_key: Any = None,
    clock: Callable[[], float] | None = None,
    choose_kernels: Callable[[], VerificationKernels] | None = None,
    lengths: Callable[..., DraftLength] = DraftLength,
) -> MetaCandidateGenerator:
    """Check the target and the drafters before any forward pass, and build the call's candidate generator: per-call
    copies of the drafters (`Drafter.spawn`), the policy `settings` name, its priors (`hf_metasd.priors`; a pool's
    priors apply only under the pool's reward, `pool_defaults`). `cost_key` stands for the target in the per-target
    caches (default: the target; a batch's rows use `hf_metasd.batched.batch_key`); `clock`, `choose_kernels` and
    `lengths` are the generator's (`MetaCandidateGenerator`)."""
    if drafters is None:
        raise MetaSDConfigError(
            "`assistant_models` must be given to `hf_metasd.generate`, but is None. "
            "Pass e.g. `assistant_models=[drafter]`, or drop `custom_generate` for plain `generate`."
        )
    check_target(model, generation_config, input_ids)
    drafters = as_drafters(drafters, model)
    for drafter in drafters:
        check_drafter_device(drafter)
        drafter.check_compatible(model)
    return MetaCandidateGenerator(
        [d.spawn(model) for d in drafters],
        get_policy(settings.meta_policy, settings.meta_policy_kwargs or {}),
        settings,
        logits_processor=logits_processor,
        generation_config=generation_config,
        target=model if cost_key is None else cost_key,
        pool_defaults=pool_defaults,
        priors_from_call=priors_from_call,
        choose_kernels=choose_kernels,
        clock=clock,
        lengths=lengths,
    )


#: True while `generate_with_pool` runs transformers' `generate`: it took `streamer` and `assistant_model` as
#: arguments, so the decoding method reads no frame for them.
_THROUGH_POOL_CALL: ContextVar[bool] = ContextVar("hf_metasd_through_pool_call", default=False)


def _bare_call_arguments() -> dict[str, Any]:
    """`streamer` and `assistant_model` of a bare ``model.generate(..., custom_generate=hf_metasd.generate)`` call
    (each None when not given).

    Every other way in passes both explicitly: `generate_with_pool` (`enable`, a ``custom_generate`` repository
    folder) takes them as keyword arguments and hands this method ``metasd_streamer=`` and ``assistant_models=``,
    leaving None in transformers' call. A bare call cannot: transformers 5.24 / 5.25 hand a callable `custom_generate`
    only what its signature names beyond `GenerationMixin._sample`'s, popped from `generate`'s ``**kwargs``
    (`GenerationMixin._extract_generation_mode_kwargs`), and `streamer` / `assistant_model` are named parameters of
    `generate`, never in those. So they are read here, from that `generate` call's frame: one of the two places
    hf_metasd reads a frame, the other being `_CallSignature` (a call's misspelt settings). Without it, a bare call
    would drop a streamer after transformers put the prompt into it, and `end()` would never come.

    Checked in transformers 5.24.0 and 5.25.0, ``transformers/generation/utils.py``: in
    `GenerationMixin._extract_generation_mode_kwargs` (5.24 line 2548, 5.25 line 2551) a callable `custom_generate`
    replaces the dict that held ``assistant_model`` and ``streamer`` with
    ``{k: kwargs.pop(k) for k in new_custom_keys if k in kwargs}`` (5.24 line 2578, 5.25 line 2581), and
    `GenerationMixin.generate` calls the decoding method with that dict and the model kwargs only (step "9. Call
    generation mode", 5.24 line 3008, 5.25 line 3011), after ``streamer.put(input_ids.cpu())`` (5.24 line 2939, 5.25
    line 2942). Only a *string* `custom_generate` (a repository folder) gets every argument of `generate` (its
    ``locals()``, step "0.a"): that way in is `generate_with_pool`. No other hook hands them over.
    """
    # not a choice: transformers hands a callable decoding method neither argument (see the docstring for where)
    frame = sys._getframe(1)
    for _ in range(8):
        frame = frame.f_back
        if frame is None:
            return {}
        if frame.f_code.co_name == "generate" and frame.f_globals.get("__name__") == "transformers.generation.utils":
            return {key: frame.f_locals.get(key) for key in ("streamer", "assistant_model")}
    return {}


@contextmanager
def _in_use(drafters: Any) -> Iterator[None]:
    with ExitStack() as stack:
        for drafter in drafters:
            stack.enter_context(drafter.in_use())
        yield


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
    meta_skinny_gemm: bool | None = None,
    meta_no_draft: bool | None = None,
    meta_replay: bool | None = None,
    meta_priors: dict[str, float] | None = None,
    meta_prior_weight: float | None = None,
    meta_learned_priors: bool | None = None,
    meta_draft_length: str | None = None,
    meta_reproducible: bool | None = None,
    metasd_streamer: Any = None,
    stop_strings: str | list[str] | None = None,
    **model_kwargs: Any,
) -> Any:
    """MetaSD decoding method, for ``model.generate(..., custom_generate=hf_metasd.generate)``.

    ``num_assistant_tokens`` and the ``meta_*`` arguments are the call's settings, the fields of `MetaSDSettings`
    (what each does, its default and its valid values: ``print(MetaSDSettings.describe())``). A setting left at None
    takes the next level of the precedence (module docstring): ``meta_policy`` the pool's, else ``"ucb_scaled"``;
    ``meta_reward`` the pool's, else ``"speed"``; ``num_assistant_tokens`` the pool's, else 3.

    Args:
        assistant_models: the pool: a list mixing transformers causal LMs, peft models (one arm per adapter) and
            `Drafter` objects, or a `DrafterPool` (which brings its own defaults).
        metasd_streamer: the streamer as this method receives it explicitly (`generate_with_pool` passes the call's
            ``streamer=`` here; it gets the prompt, then the kept tokens, then ``end()``). ``streamer=`` works on every
            way in; a bare ``custom_generate=hf_metasd.generate`` call's, and its lone ``assistant_model=`` (a
            one-drafter pool), are read by `_bare_call_arguments`, since transformers hands a callable neither.
        stop_strings: refused here, before any compute (`hf_metasd.call_checks.check_stop_strings`): declared so
            that transformers hands them to this method instead of failing on them for want of a tokenizer (it does
            not hand a callable `custom_generate` the `tokenizer`). Through `hf_metasd.enable()`, ``stop_strings=``
            with ``tokenizer=`` works as in plain `generate`.

    Returns:
        What `generate` returns; with ``return_dict_in_generate=True`` a `MetaSDGenerateOutput` whose `metasd` holds
        the per-round telemetry.
    """
    given = {  # the settings as passed to this call (`resolve_settings` applies the precedence)
        "num_assistant_tokens": num_assistant_tokens,
        "meta_policy": meta_policy,
        "meta_policy_kwargs": meta_policy_kwargs,
        "meta_reward": meta_reward,
        "meta_skinny_gemm": meta_skinny_gemm,
        "meta_no_draft": meta_no_draft,
        "meta_replay": meta_replay,
        "meta_priors": meta_priors,
        "meta_prior_weight": meta_prior_weight,
        "meta_learned_priors": meta_learned_priors,
        "meta_draft_length": meta_draft_length,
        "meta_reproducible": meta_reproducible,
    }
    if synced_gpus:
        raise MetaSDConfigError(
            "`synced_gpus` must be False for MetaSD (one process drafts and verifies), but is True. "
            "Run the target on one process; place it across devices with `device_map` instead."
        )
    check_stop_strings(stop_strings)
    check_setting_names(model_kwargs, "`generate`'s keyword arguments")
    bare = {} if _THROUGH_POOL_CALL.get() else _bare_call_arguments()  # a bare `custom_generate=` call's only
    assistant_models = one_pool(assistant_models, bare.get("assistant_model"))
    if streamer is None:
        streamer = bare.get("streamer")  # transformers already put the prompt into it
    drafters, pool_defaults = _pool_from(assistant_models)
    settings = resolve_settings(given, generation_config, pool_defaults)
    call = {
        "drafters": drafters,
        "settings": settings,
        "pool_defaults": pool_defaults,
        "priors_from_call": given["meta_priors"] is not None,
        "logits_processor": logits_processor,
        "stopping_criteria": stopping_criteria,
        "generation_config": generation_config,
        "streamer": streamer,
        "metasd_streamer": metasd_streamer,
        "model_kwargs": model_kwargs,
    }
    if not settings.meta_reproducible:
        return _decode(model, input_ids, **call)
    call["settings"] = reproducible_settings(settings, given)  # refuses what cannot repeat, before any compute
    with reproducible_call(model) as (clock, key):  # time in target passes, nothing shared with other calls
        return _decode(model, input_ids, **call, clock=clock, cost_key=key)


def _decode(
    model: Any,
    input_ids: Any,
    *,
    drafters: Any,
    settings: MetaSDSettings,
    pool_defaults: Mapping[str, Any],
    priors_from_call: bool,
    logits_processor: Any,
    stopping_criteria: Any,
    generation_config: Any,
    streamer: Any,
    metasd_streamer: Any,
    model_kwargs: dict[str, Any],
    clock: Callable[[], float] | None = None,
    cost_key: Any = None,
) -> Any:
    """`generate` once its settings are resolved: a batch (`generate_batch`) or one request; `clock` and `cost_key`
    are a reproducible call's (`hf_metasd.reproducible`)."""
    if input_ids.shape[0] > 1:  # a batch: one candidate generator per row (`hf_metasd.batched`)
        build = functools.partial(
            build_candidate_generator, pool_defaults=pool_defaults, priors_from_call=priors_from_call
        )
        return generate_batch(
            model,
            input_ids,
            drafters,
            settings,
            build,
            output_class=MetaSDGenerateOutput,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
            generation_config=generation_config,
            streamer=streamer,
            metasd_streamer=metasd_streamer,
            model_kwargs=model_kwargs,
            clock=clock,
            cost_key=cost_key,
        )

    def choose_kernels() -> VerificationKernels:
        # run by the generator after the target's and the drafters' checks (a recurrent target's cache may not even
        # report its length), and before the first compute: a cache passed in is checked, then the kernel chosen
        uncached_prompt_length(input_ids, model_kwargs, generation_config)
        return VerificationKernels.for_call(model, settings.meta_skinny_gemm, settings.num_assistant_tokens)

    candidate_generator = build_candidate_generator(
        model,
        generation_config,
        logits_processor,
        input_ids,
        drafters,
        settings,
        pool_defaults=pool_defaults,
        priors_from_call=priors_from_call,
        choose_kernels=choose_kernels,
        clock=clock,
        cost_key=cost_key,
    )
    if streamer is None and metasd_streamer is not None:
        streamer = metasd_streamer  # transformers never saw this one: it gets the prompt here
        streamer.put(input_ids.cpu())
    stats = candidate_generator.stats
    shared = as_drafters(drafters, model)
    kernels = candidate_generator.kernels
    start = stats.clock() - stats.kernel_choice_seconds  # the call's wall time counts its kernel choice
    # on a tensor-parallel target every rank makes rank 0's decisions (`hf_metasd._distributed`)
    with _in_use(shared), kernels.applied(), agreeing(model, candidate_generator.policy):
        output = assisted_decoding(
            model,
            input_ids,
            candidate_generator=candidate_generator,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
            generation_config=generation_config,
            streamer=streamer,
            **model_kwargs,
        )
    stats.wall_seconds = stats.clock() - start
    stats.draft_length = candidate_generator.draft_length
    stats.kernel, stats.kernel_timings, stats.kernel_pass_costs = kernels.summary(stats.kernels)
    stats.verification_costs = candidate_generator.lengths.summary()
    sequence = output.sequences if isinstance(output, GenerateDecoderOnlyOutput) else output
    for drafter in shared if not settings.meta_reproducible else ():  # a reproducible call teaches no later call
        drafter.on_generation_end(sequence, input_ids.shape[1])
    if isinstance(output, GenerateDecoderOnlyOutput):
        return MetaSDGenerateOutput(**dict(output.items()), metasd=stats)
    return output


generate.__signature__ = CallSignature(  # type: ignore[attr-defined]
    with_settings(inspect.signature(generate), RETIRED_SETTINGS)
)


# ---------------------------------------------------------------------- enable / disable
_ORIGINAL_GENERATE: Callable[..., Any] | None = None


def is_enabled() -> bool:
    """Whether `enable()` is in effect."""
    return _ORIGINAL_GENERATE is not None


def _stop_string_criteria(model: Any, kwargs: dict[str, Any]) -> None:
    """transformers drops `tokenizer` for a callable `custom_generate`, so `stop_strings` would find none: build the
    `StopStringCriteria` here from the tokenizer the user passed, and hand transformers no stop strings."""
    from transformers import GenerationConfig, StoppingCriteriaList
    from transformers.generation.stopping_criteria import StopStringCriteria

    tokenizer = kwargs.pop("tokenizer", None)
    config = kwargs.get("generation_config")
    stop = kwargs.pop("stop_strings", None)
    if stop is None and config is not None:
        stop = config.stop_strings
    if stop is None:
        if getattr(model.generation_config, "stop_strings", None) is not None:
            raise MetaSDConfigError(
                "`stop_strings` must be given per call with `assistant_models` (transformers does not hand a "
                "callable decoding method the tokenizer), but they are set on `model.generation_config`. Pass "
                "`stop_strings=[...], tokenizer=tokenizer` to `generate`, or a `StopStringCriteria` in "
                "`stopping_criteria`."
            )
        return
    if tokenizer is None:
        raise MetaSDConfigError(
            "`tokenizer` must be passed to `generate` with `stop_strings`, but is None. "
            "Pass `tokenizer=your_tokenizer`."
        )
    criteria = StoppingCriteriaList(kwargs.pop("stopping_criteria", None) or [])
    criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=stop))
    kwargs["stopping_criteria"] = criteria
    if config is not None:
        config = GenerationConfig(**config.to_dict())
        config.stop_strings = None
        kwargs["generation_config"] = config


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
        if assistant_models is None and kwargs.get("custom_generate") is not generate:
            check_setting_names(kwargs, "`generate`'s keyword arguments", unknown=False)
            given = [k for k in META_KWARGS if k in kwargs]
            if given:
                raise MetaSDConfigError(
                    f"`{given[0]}` needs `assistant_models`, but `assistant_models` is None. "
                    "Pass the drafters with `assistant_models=[...]`, or drop the `meta_*` arguments."
                )
            return original(self, *args, **kwargs)
        return generate_with_pool(self, *args, assistant_models=assistant_models, original=original, **kwargs)

    _ORIGINAL_GENERATE = original
    GenerationMixin.generate = generate_with_metasd


def generate_with_pool(
    model: Any,
    *args: Any,
    assistant_models: Any = None,
    assistant_model: Any = None,
    streamer: Any = None,
    original: Callable[..., Any] | None = None,
    **kwargs: Any,
) -> Any:
    """``model.generate(*args, assistant_models=..., **kwargs)`` as `enable` serves it, without patching anything:
    the checks of both entry points, `stop_strings` with the `tokenizer` read before transformers drops it, then
    transformers' own `generate` (`original`; default: the unpatched `GenerationMixin.generate`) with this module's
    `generate` as its decoding method. What `enable()` and a ``custom_generate`` repository folder call.

    `assistant_model` and `streamer` are taken here, explicitly (transformers would not hand them to a callable
    decoding method): a lone `assistant_model` is a one-drafter pool (`one_pool`), and the streamer reaches
    `generate` as ``metasd_streamer``, which puts the prompt into it as transformers would have.
    """
    if original is None:
        original = _ORIGINAL_GENERATE or GenerationMixin.generate
    check_call_kwargs(kwargs)
    assistant_models = one_pool(assistant_models, assistant_model)
    custom = kwargs.pop("custom_generate", None)
    if custom is not None and custom is not generate:
        raise MetaSDConfigError(
            f"`custom_generate` must be None or `hf_metasd.generate` with `assistant_models`, but is {custom!r}. "
            "Drop one of them."
        )
    if streamer is not None:
        if kwargs.get("metasd_streamer") is not None:
            raise MetaSDConfigError(
                "`metasd_streamer` must be None when `streamer` is given, but both are set. Pass the streamer once, "
                "as `streamer=`."
            )
        kwargs["metasd_streamer"] = streamer
    _stop_string_criteria(model, kwargs)
    token = _THROUGH_POOL_CALL.set(True)
    try:
        return original(model, *args, custom_generate=generate, assistant_models=assistant_models, **kwargs)
    finally:
        _THROUGH_POOL_CALL.reset(token)


def disable() -> None:
    """Restore transformers' own `GenerationMixin.generate` (idempotent)."""
    global _ORIGINAL_GENERATE
    if _ORIGINAL_GENERATE is None:
        return
    GenerationMixin.generate = _ORIGINAL_GENERATE
    _ORIGINAL_GENERATE = None
