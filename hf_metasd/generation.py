"""The one seam between MetaSD and `model.generate`, and the one place for a call's defaults.

Two ways in, same result:

* ``model.generate(**inputs, custom_generate=hf_metasd.generate, assistant_models=[...])``: transformers' own hook;
  `generate` below is a decoding method with the signature transformers expects.
* ``hf_metasd.enable()`` once, then ``model.generate(**inputs, assistant_models=[...])``. `enable` wraps
  `GenerationMixin.generate`; a call without `assistant_models` goes to the original method untouched, and `disable`
  restores it.

The draft-and-verify loop is `hf_metasd.decoding.assisted_decoding` (transformers' assisted decoding, stopping
where plain `generate` stops). A call never changes the user's objects: it drafts with per-call copies of the pool's
drafters (`Drafter.spawn`), so one pool can serve concurrent calls, and every drafter's modules get their training
flag and active adapter back when the call ends (`Drafter.in_use`).

**Settings and their precedence** (as in transformers): a call's keyword argument wins over the same key on the
`GenerationConfig` passed to `generate`, which wins over ``model.generation_config``, which wins over the pool's
defaults (`DrafterPool`), which win over `DEFAULTS`. The keys are `SETTINGS`: ``num_assistant_tokens`` (the
standard transformers field) and the ``meta_*`` keys; a ``meta_*`` key that is not one of them is refused.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, fields
from typing import Any, get_args

from transformers.generation.utils import GenerateDecoderOnlyOutput, GenerationMixin
from transformers.utils import ModelOutput

from ._validation import check_int
from .candidate_generator import DEFAULT_NUM_ASSISTANT_TOKENS, MetaCandidateGenerator
from .decoding import assisted_decoding, uncached_prompt_length
from .draft_length import check_draft_length_mode
from .drafters import as_drafters
from .errors import DrafterCompatibilityError, MetaSDConfigError
from .kernels import (
    DEFAULT_MAX_ROWS,
    KernelChoice,
    KernelSwitch,
    PassKernels,
    choose_verification_kernel,
    skinny_linear,
)
from .policies import Policy, get_policy
from .rewards import RoundFeedback, get_reward
from .settings import DEFAULTS, META_KWARGS, SETTINGS
from .stats import MetaSDStats

__all__ = ["DEFAULTS", "SETTINGS", "MetaSDGenerateOutput", "disable", "enable", "generate", "is_enabled"]


@dataclass
class MetaSDGenerateOutput(GenerateDecoderOnlyOutput):
    """`GenerateDecoderOnlyOutput` plus `metasd`, the call's `MetaSDStats`."""

    metasd: MetaSDStats | None = None


# ---------------------------------------------------------------------- settings
def _check_meta_keys(keys: Any, where: str) -> None:
    unknown = sorted(k for k in keys if isinstance(k, str) and k.startswith("meta_") and k not in SETTINGS)
    if unknown:
        raise MetaSDConfigError(
            f"{where} must use the MetaSD settings {sorted(META_KWARGS)}, but has unknown {unknown}. "
            "Fix the spelling or drop the key."
        )


def _config_value(generation_config: Any, key: str) -> Any:
    """A setting from the call's merged `GenerationConfig` (passed config over the model's), or None if unset.

    transformers fills `num_assistant_tokens` with its global default (20) when nothing set it; that value is
    treated as unset, so the pool's draft length applies (pass ``num_assistant_tokens=20`` to `generate` to ask for
    exactly 20).
    """
    value = getattr(generation_config, key, None)
    if key == "num_assistant_tokens" and value is not None:
        defaults = generation_config._get_default_generation_params()
        if value == defaults.get("num_assistant_tokens"):
            return None
    return value


def resolve_settings(
    call: dict[str, Any], generation_config: Any, pool_defaults: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Every setting of `SETTINGS` with the precedence of the module docstring (call > configs > pool > defaults).

    Example:
        >>> from transformers import GenerationConfig
        >>> settings = resolve_settings({"meta_reward": "be"}, GenerationConfig(meta_policy="exp3"),
        ...                             {"num_assistant_tokens": 4, "meta_policy": "ucb"})
        >>> settings["meta_reward"], settings["meta_policy"], settings["num_assistant_tokens"]
        ('be', 'exp3', 4)
    """
    _check_meta_keys(vars(generation_config), "the `GenerationConfig`")
    pool_defaults = pool_defaults or {}
    out: dict[str, Any] = {}
    for key in SETTINGS:
        for source in (call.get(key), _config_value(generation_config, key), pool_defaults.get(key)):
            if source is not None:
                out[key] = source
                break
        else:
            out[key] = DEFAULTS[key]
    # settings belong to the policy they came with: the policy's level also gives its settings (a call that names a
    # policy without settings gets that policy's defaults, not the pool's settings for another policy)
    levels = (
        (call.get("meta_policy"), call.get("meta_policy_kwargs")),
        (_config_value(generation_config, "meta_policy"), _config_value(generation_config, "meta_policy_kwargs")),
        (pool_defaults.get("meta_policy"), pool_defaults.get("meta_policy_kwargs")),
    )
    for policy, kwargs in levels:
        if policy is not None:
            out["meta_policy_kwargs"] = kwargs if kwargs is not None else call.get("meta_policy_kwargs")
            break
    return out


def _check_settings(settings: dict[str, Any]) -> None:
    for key in (
        "meta_full_information",
        "meta_confidence_stop",
        "meta_learned_priors",
        "meta_match_routing",
        "meta_prefill_gate",
    ):
        if not isinstance(settings[key], bool):
            raise MetaSDConfigError(f"`{key}` must be True or False, but is {settings[key]!r}. Pass a bool.")
    for key in ("meta_skinny_gemm", "meta_no_draft", "meta_replay"):
        if settings[key] is not None and not isinstance(settings[key], bool):
            raise MetaSDConfigError(
                f"`{key}` must be True, False or None (automatic), but is {settings[key]!r}. Pass a bool, or leave it out."
            )
    check_int(
        "num_assistant_tokens",
        settings["num_assistant_tokens"],
        low=1,
        hint=f"Use e.g. {DEFAULT_NUM_ASSISTANT_TOKENS}.",
        error=MetaSDConfigError,
    )
    check_draft_length_mode(settings["meta_draft_length"])
    warm = settings["meta_warm_start"]
    if not isinstance(warm, int) or isinstance(warm, bool) or warm < 0:
        raise MetaSDConfigError(
            f"`meta_warm_start` must be an int >= 0 (prompt positions), but is {warm!r}. Use e.g. 16, or 0 for off."
        )


# ---------------------------------------------------------------------- building a call
def _pool_from(assistant_models: Any) -> tuple[Any, dict[str, Any]]:
    """Split a `DrafterPool` into its drafters and its defaults; anything else is a list of drafters."""
    from .pool import DrafterPool

    if isinstance(assistant_models, DrafterPool):
        return assistant_models.drafters, assistant_models.generate_kwargs()
    return assistant_models, {}


def _check_target(model: Any, generation_config: Any, input_ids: Any) -> None:
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
    for key in ("prompt_lookup_num_tokens", "assistant_early_exit"):
        if getattr(generation_config, key, None) is not None:
            raise MetaSDConfigError(
                f"`{key}` must be None when `assistant_models` is given, but is {getattr(generation_config, key)!r}. "
                "Put that drafter in the pool instead (`hf_metasd.drafters.PromptLookupDrafter()`, "
                "`hf_metasd.drafters.EarlyExitDrafter(target, k)`)."
            )


def _check_drafter_device(drafter: Any) -> None:
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


def build_candidate_generator(
    model: Any,
    generation_config: Any,
    logits_processor: Any,
    input_ids: Any,
    *,
    assistant_models: Any,
    settings: dict[str, Any] | None = None,
    **call: Any,
) -> MetaCandidateGenerator:
    """Validate everything a MetaSD call needs, before any forward pass, and build its candidate generator.

    The drafters are per-call copies (`Drafter.spawn`) of the pool's; `settings` are resolved with
    `resolve_settings` from `call` when not given.
    """
    if assistant_models is None:
        raise MetaSDConfigError(
            "`assistant_models` must be given to `hf_metasd.generate`, but is None. "
            "Pass e.g. `assistant_models=[drafter]`, or drop `custom_generate` for plain `generate`."
        )
    _check_target(model, generation_config, input_ids)
    drafters, pool_defaults = _pool_from(assistant_models)
    drafters = as_drafters(drafters, model)
    for drafter in drafters:
        _check_drafter_device(drafter)
        drafter.check_compatible(model)
    if settings is None:
        settings = resolve_settings(call, generation_config, pool_defaults)
    _check_settings(settings)
    policy = get_policy(settings["meta_policy"], **_policy_kwargs(settings["meta_policy_kwargs"]))
    reward = settings["meta_reward"]
    get_reward(reward)  # validate the name before any compute
    priors, from_pool = _priors(settings, policy, pool_defaults, call)
    generator = MetaCandidateGenerator(
        [d.spawn(model) for d in drafters],
        policy,
        reward=reward,
        num_assistant_tokens=settings["num_assistant_tokens"],
        logits_processor=logits_processor,
        generation_config=generation_config,
        full_information=settings["meta_full_information"] or policy.full_information,
        warm_start=settings["meta_warm_start"],
        no_draft=settings["meta_no_draft"],
        replay=settings["meta_replay"],
        confidence_stop=settings["meta_confidence_stop"],
        learned_priors=settings["meta_learned_priors"],
        draft_length=settings["meta_draft_length"],
        match_routing=settings["meta_match_routing"],
        prefill_gate=settings["meta_prefill_gate"],
        target=model,
    )
    names = generator.stats.drafter_names
    if priors is not None:
        unknown = sorted(set(priors) - set(names))
        if unknown:
            raise MetaSDConfigError(
                f"`meta_priors` must name arms of this call {names}, but names {unknown}. Fix the names."
            )
    means = [None if priors is None else priors.get(name) for name in names]
    if generator.memory is not None and _fresh_policy_takes_priors(settings, policy):
        # arms start from what earlier calls of this process learnt (`reward_memory`) unless the call gave a prior;
        # that also replaces a pool's prior, which was measured when the pool was built, on the builder's machine
        # (the `speed` reward is in units of that machine's costs)
        for arm, learned in enumerate(generator.memory.means()):
            if learned is not None and (means[arm] is None or from_pool):
                means[arm] = learned
                generator.stats.learned_priors[names[arm]] = learned
    if any(mean is not None for mean in means):
        weight = settings["meta_prior_weight"]
        generator.policy.set_prior(means, **({} if weight is None else {"weight": weight}))
    return generator


def _priors(
    settings: dict[str, Any], policy: Policy, pool_defaults: dict[str, Any], call: dict[str, Any]
) -> tuple[Any, bool]:
    """The priors this call applies, and whether they are the pool's: given per call, or the pool's when its reward
    is the call's reward (a pool's priors are means of its own reward) and the policy is a fresh one that takes
    priors. A pool's priors give way to learned ones (they were measured on the pool builder's machine)."""
    priors = settings.get("meta_priors")
    if priors is None:
        return None, False
    if not isinstance(priors, dict):
        raise TypeError(
            f"`meta_priors` must be a dict of arm name -> prior mean reward, but is {type(priors).__name__}. "
            'Pass e.g. `{"prompt_lookup": 0.4}`.'
        )
    from_call = call.get("meta_priors") is not None
    if not from_call:
        if pool_defaults.get("meta_reward", settings["meta_reward"]) != settings["meta_reward"]:
            return None, False
        if not _fresh_policy_takes_priors(settings, policy):
            return None, False
    return priors, not from_call and priors == pool_defaults.get("meta_priors")


def _fresh_policy_takes_priors(settings: dict[str, Any], policy: Policy) -> bool:
    """Whether the call's policy is a fresh one (given by name) that takes priors: the pool's priors and the learned
    ones apply only to such a policy (a `Policy` instance keeps what it learnt)."""
    return isinstance(settings["meta_policy"], str) and policy.supports_prior


def _policy_kwargs(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(
            f"`meta_policy_kwargs` must be a dict of policy settings, but is {type(value).__name__} {value!r}. "
            'Pass e.g. `meta_policy_kwargs={"beta": 0.5}`.'
        )
    return value


def _kernel_choice(model: Any, skinny: bool | None, num_assistant_tokens: int) -> KernelChoice:
    """The verification kernel: forced by the user, else measured once per process (see `hf_metasd.kernels`).

    The layers are timed at the call's longest pass, ``num_assistant_tokens + 1`` rows, or at `DEFAULT_MAX_ROWS`
    when that is longer: a draft length is a cap and most passes are shorter, and passes beyond `DEFAULT_MAX_ROWS`
    run the stock product whatever the choice. (Answering "stock" for a cap above it, as before, put every pass of
    such a call on the stock kernel: with ``num_assistant_tokens=12`` the embedded pool ran at 1.18x plain on dev
    prompts against 2.00x with 3, `recipes/benchmarks/untrained_pool_probe.py`.)
    """
    if skinny is not None:
        return KernelChoice("skinny" if skinny else "stock")
    return choose_verification_kernel(model, [min(num_assistant_tokens + 1, DEFAULT_MAX_ROWS)])


def _caller_locals() -> dict[str, Any]:
    """The local variables of the transformers `generate` call that called us (or an empty dict).

    transformers (5.x) hands a callable `custom_generate` neither the `streamer` nor the `assistant_model` given to
    `generate`; both are still that call's arguments, so they are read from its frame.
    """
    frame = sys._getframe(1)
    for _ in range(8):
        frame = frame.f_back
        if frame is None:
            return {}
        if frame.f_code.co_name == "generate" and frame.f_globals.get("__name__") == "transformers.generation.utils":
            return frame.f_locals
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
    meta_full_information: bool | None = None,
    meta_warm_start: int | None = None,
    meta_skinny_gemm: bool | None = None,
    meta_no_draft: bool | None = None,
    meta_replay: bool | None = None,
    meta_confidence_stop: bool | None = None,
    meta_priors: dict[str, float] | None = None,
    meta_prior_weight: float | None = None,
    meta_learned_priors: bool | None = None,
    meta_draft_length: str | None = None,
    meta_match_routing: bool | None = None,
    meta_prefill_gate: bool | None = None,
    metasd_streamer: Any = None,
    stop_strings: str | list[str] | None = None,
    **model_kwargs: Any,
) -> Any:
    """MetaSD decoding method, for ``model.generate(..., custom_generate=hf_metasd.generate)``.

    Every setting left at None takes the next level of the precedence in the module docstring.

    Args:
        assistant_models: the pool: a list mixing transformers causal LMs, peft models (one arm per adapter) and
            `Drafter` objects, or a `DrafterPool` (which brings its own defaults).
        meta_policy: a registered policy name (a fresh policy per call, as in the paper) or a `Policy` instance
            (keeps learning across calls: the serving pattern). Default: the pool's, else ``"ucb_scaled"``.
        meta_policy_kwargs: settings for a policy given by name, e.g. ``{"beta": 0.5}``.
        meta_reward: ``"speed"`` (default: tokens per second of the round, comparable with plain decoding), ``"bd"``,
            ``"be"``, ``"eal"``, ``"cost"`` or a callable ``f(RoundFeedback) -> float``.
        num_assistant_tokens: tokens drafted per round (default 3); with ``meta_draft_length="measured"`` the most
            a round drafts.
        meta_full_information: also score the drafters that did not draft (see `MetaCandidateGenerator`); on by
            itself for full-information policies (``hedge``).
        meta_warm_start: prompt warm start over this many last prompt positions (0: off).
        meta_skinny_gemm: the CPU verification kernel (see `hf_metasd.kernels`): ``None`` (default) measures which
            is faster on this machine, once per process on the target's layers, then checks that choice on the
            verification passes themselves, per pass length (`PassKernels`); ``True`` / ``False`` force the
            transposed / stock product.
        meta_no_draft: whether the policy may give a round to the target alone (``None``: when the reward is
            cost-aware, as the default ``speed``).
        meta_replay: replayed rounds (see `MetaCandidateGenerator`): after each round, the model-free drafters that
            did not draft it are scored in hindsight on it, exactly, and the policy learns from that too
            (`Policy.observe`). ``None`` (default): on under greedy decoding with a reward that can score them
            (``speed``, ``be``, ``eal``) and a policy that learns side observations; ``True`` where it cannot
            apply is refused.
        meta_confidence_stop: model drafters stop drafting once the product of their drafted tokens' probabilities
            falls below their measured cost per drafting step over a plain target step's (see
            `MetaCandidateGenerator`); needs the no-draft arm. Default False: on dev prompts it changed nothing
            measurable (docs/concepts.md).
        meta_priors: prior mean rewards by arm name (``"no_draft"`` for the no-draft arm), given to the policy as
            pseudo-observations (`Policy.set_prior`). A pool brings the priors measured when it was built; they
            apply when the call uses the pool's reward and a fresh policy that takes priors.
        meta_prior_weight: pseudo-observations each prior counts as (default: the policy's, 2).
        meta_learned_priors: every arm without a prior from the call starts from the mean reward it earned in
            earlier calls of this process with the same target (`hf_metasd.reward_memory`), when the policy is given
            by name and takes priors; this replaces a pool's prior for that arm (measured when the pool was built, on
            another machine). Default True; False starts every call from nothing but the call's or pool's priors.
        meta_draft_length: ``"measured"`` (default): each round drafts the length, at most `num_assistant_tokens`,
            that maximises expected tokens per second, from verification costs by length measured in the call's own
            rounds and each arm's acceptance by position (`hf_metasd.draft_length`); ``"fixed"``: always
            `num_assistant_tokens` (as transformers' constant schedule).
        meta_match_routing: when the policy picks a corpus drafter, the round goes to the corpus drafter whose
            proposal continues the longest match of the context (`MetaCandidateGenerator`, "Match routing").
            Default False: with the embedded pool it changed nothing measurable on dev prompts.
        meta_prefill_gate: under the `speed` reward, skip a drafter whose prompt prefill (predicted from its
            earlier prefills in this process) would cost more than it can save over the rest of the call
            (`MetaCandidateGenerator`, "Prefill gate"). Default False: on the ``--models qwen`` bench it saved the
            long prompts' prefills but kept the 0.5B drafter out where it was the best arm (docs/concepts.md).
        metasd_streamer: another way to pass a streamer (kept for compatibility; ``streamer=`` works).
        stop_strings: refused here, before any compute (`_check_stop_strings`): declared so that transformers hands
            them to this method instead of failing on them for want of a tokenizer (it does not hand a callable
            `custom_generate` the `tokenizer`). Through `hf_metasd.enable()`, ``stop_strings=`` with ``tokenizer=``
            works as in plain `generate`.

    Returns:
        What `generate` returns; with ``return_dict_in_generate=True`` a `MetaSDGenerateOutput` whose `metasd` holds
        the per-round telemetry.
    """
    if synced_gpus:
        raise MetaSDConfigError(
            "`synced_gpus` must be False for MetaSD (one process drafts and verifies), but is True. "
            "Run the target on one process; place it across devices with `device_map` instead."
        )
    _check_stop_strings(stop_strings)
    call = {
        "meta_policy": meta_policy,
        "meta_policy_kwargs": meta_policy_kwargs,
        "meta_reward": meta_reward,
        "num_assistant_tokens": num_assistant_tokens,
        "meta_full_information": meta_full_information,
        "meta_warm_start": meta_warm_start,
        "meta_skinny_gemm": meta_skinny_gemm,
        "meta_no_draft": meta_no_draft,
        "meta_replay": meta_replay,
        "meta_confidence_stop": meta_confidence_stop,
        "meta_priors": meta_priors,
        "meta_prior_weight": meta_prior_weight,
        "meta_learned_priors": meta_learned_priors,
        "meta_draft_length": meta_draft_length,
        "meta_match_routing": meta_match_routing,
        "meta_prefill_gate": meta_prefill_gate,
    }
    _check_meta_keys(model_kwargs, "`generate`'s keyword arguments")
    caller = _caller_locals()
    if caller.get("assistant_model") is not None:
        raise MetaSDConfigError(
            "`assistant_model` must be None when `assistant_models` is given, but both are set. "
            "Put every drafter in `assistant_models=[...]`."
        )
    drafters, pool_defaults = _pool_from(assistant_models)
    settings = resolve_settings(call, generation_config, pool_defaults)
    candidate_generator = build_candidate_generator(
        model,
        generation_config,
        logits_processor,
        input_ids,
        assistant_models=assistant_models,
        settings=settings,
        **call,
    )
    uncached_prompt_length(input_ids, model_kwargs, generation_config)  # a cache passed in: checked before compute
    if streamer is None:
        streamer = caller.get("streamer")  # transformers already put the prompt into it
    if streamer is None and metasd_streamer is not None:
        streamer = metasd_streamer  # transformers never saw this one: it gets the prompt here
        streamer.put(input_ids.cpu())
    stats = candidate_generator.stats
    shared = as_drafters(drafters, model)
    start = stats.clock()
    with stats.timed("kernel_choice"):
        choice = _kernel_choice(model, settings["meta_skinny_gemm"], candidate_generator.num_assistant_tokens)
    stats.kernel = choice.kernel
    if choice.measured:
        stats.kernel_timings = {"stock_seconds": choice.stock_seconds, "skinny_seconds": choice.skinny_seconds}
    if choice.measured:  # the first choice, checked on the call's own passes (`PassKernels`)
        switch = KernelSwitch(choice.kernel == "skinny")
        pass_kernels = PassKernels(model, choice.kernel)
        candidate_generator.use_kernels(pass_kernels, switch)
        kernels = skinny_linear(model, switch=switch)
    else:
        pass_kernels = None
        kernels = skinny_linear(model) if choice.kernel == "skinny" else nullcontext()
    with _in_use(shared), kernels:
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
    chosen = [kernel for kernel in stats.kernels if kernel is not None]
    if chosen:
        stats.kernel = max(("skinny", "stock"), key=chosen.count)
    if pass_kernels is not None:
        stats.kernel_pass_costs = pass_kernels.summary()
    stats.verification_costs = candidate_generator.lengths.summary()
    sequence = output.sequences if isinstance(output, GenerateDecoderOnlyOutput) else output
    for drafter in shared:
        drafter.on_generation_end(sequence, input_ids.shape[1])
    if isinstance(output, GenerateDecoderOnlyOutput):
        return MetaSDGenerateOutput(**dict(output.items()), metasd=stats)
    return output


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


def _check_stop_strings(stop_strings: Any) -> None:
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
        "`custom_generate`), or pass `stopping_criteria=StoppingCriteriaList([StopStringCriteria(tokenizer, "
        "stop_strings)])`."
    )


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
        return generate_with_pool(self, *args, assistant_models=assistant_models, original=original, **kwargs)

    _ORIGINAL_GENERATE = original
    GenerationMixin.generate = generate_with_metasd


def generate_with_pool(
    model: Any, *args: Any, assistant_models: Any, original: Callable[..., Any] | None = None, **kwargs: Any
) -> Any:
    """``model.generate(*args, assistant_models=..., **kwargs)`` as `enable` serves it, without patching anything:
    the checks of both entry points, `stop_strings` with the `tokenizer` read before transformers drops it, then
    transformers' own `generate` (`original`; default: the unpatched `GenerationMixin.generate`) with this module's
    `generate` as its decoding method. What `enable()` and a ``custom_generate`` repository folder call."""
    if original is None:
        original = _ORIGINAL_GENERATE or GenerationMixin.generate
    _check_call_kwargs(kwargs)
    custom = kwargs.pop("custom_generate", None)
    if custom is not None and custom is not generate:
        raise MetaSDConfigError(
            f"`custom_generate` must be None or `hf_metasd.generate` with `assistant_models`, but is {custom!r}. "
            "Drop one of them."
        )
    _stop_string_criteria(model, kwargs)
    return original(model, *args, custom_generate=generate, assistant_models=assistant_models, **kwargs)


def _check_call_kwargs(kwargs: dict[str, Any]) -> None:
    """Arguments that mean another assisted-decoding method: refused the same way on both entry points."""
    _check_meta_keys(kwargs, "`generate`'s keyword arguments")
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


def disable() -> None:
    """Restore transformers' own `GenerationMixin.generate` (idempotent)."""
    global _ORIGINAL_GENERATE
    if _ORIGINAL_GENERATE is None:
        return
    GenerationMixin.generate = _ORIGINAL_GENERATE
    _ORIGINAL_GENERATE = None
