"""The methods a benchmark compares: plain decoding, transformers' assisted generation, single drafters, policies.

A `Method` is a name, a kind and the `generate` keyword arguments it adds for a prompt. `build_methods` lays out a
run over a pool: autoregressive decoding (the baseline every speedup divides), MetaSD with the pool's own defaults
(``metasd``: what a user gets), each drafter alone (``fixed[<name>]``; the per-task hindsight oracle is the best of
them, see `hf_metasd.benchmark.report`), other policies and rewards, and transformers' assisted generation with the
same drafters, both with MetaSD's draft length and verification kernel (like for like) and with transformers' own
defaults.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..drafters import Drafter, ModelDrafter, PromptLookupDrafter
from ..generation import generate as metasd_generate
from ..policies import get_policy
from ..settings import DEFAULTS
from .prompts import BenchPrompt

__all__ = [
    "DEFAULT_POLICIES",
    "Method",
    "build_methods",
    "precedence_arms",
    "transformers_assisted_kwargs",
    "untrained_drafters",
]

#: Policies compared besides the pool's defaults: (method name, policy, reward, extra `generate` kwargs).
DEFAULT_POLICIES: tuple[tuple[str, str, str, dict[str, Any]], ...] = (
    ("ucb-speed", "ucb", "speed", {}),
    ("ucb_scaled-speed", "ucb_scaled", "speed", {}),
    ("throughput-speed", "throughput", "speed", {}),
    ("ucb_v-speed", "ucb_v", "speed", {}),
    ("ucb-bd", "ucb", "bd", {}),
    ("ucb-be", "ucb", "be", {}),
    ("exp3", "exp3", "speed", {}),
    ("thompson", "thompson", "speed", {}),
    ("successive_halving", "successive_halving", "speed", {}),
    ("random", "random", "speed", {}),
    # the serving engines' fixed rule: the pool's first copier (a drafter scoring its matches) when its match is at
    # least 4 tokens, else its first model drafter (arms filled in by `build_methods`; left out without them)
    ("precedence", "precedence", "speed", {}),
    ("metasd (stock kernels)", None, None, {"meta_skinny_gemm": False}),
    ("metasd (fixed draft length)", None, None, {"meta_draft_length": "fixed"}),
)


@dataclass
class Method:
    """One way to generate: `kind` is ``"autoregressive"``, ``"transformers"`` or ``"metasd"``.

    `kwargs(prompt)` returns the extra `generate` keyword arguments for a prompt. `kernel` is ``"metasd"`` when the
    method runs under the verification kernel MetaSD chose for the target (transformers' assisted generation, like
    for like), else ``None``. `arm_map` maps a sub-pool method's arms to pool indices.
    """

    name: str
    kind: str
    kwargs: Callable[[BenchPrompt], dict[str, Any]]
    arm_map: list[int] | None = None
    kernel: str | None = None


def transformers_assisted_kwargs(
    drafter: Drafter, num_assistant_tokens: int | None, *, target: Any = None
) -> dict[str, Any] | None:
    """The stock transformers `generate` arguments that draft like `drafter` (None if transformers has none).

    With `num_assistant_tokens`, transformers drafts exactly that many tokens per round (constant schedule, no
    confidence threshold), as MetaSD does; with None, it runs with its own defaults (the assistant's generation
    config: heuristic schedule, confidence threshold; prompt lookup: 10 tokens). LoRA arms are merged into a private
    copy of their base (transformers cannot switch adapters); a restricted LM head is not available to transformers,
    so its assistant computes the full head. Drafter kinds transformers has no equivalent of return None.
    """
    kind = drafter.kind
    if kind == "prompt_lookup":
        return {
            "prompt_lookup_num_tokens": num_assistant_tokens or 10,
            "max_matching_ngram_size": drafter.max_matching_ngram_size,
        }
    if kind == "early_exit":
        out = {"assistant_early_exit": drafter.num_layers}
        return out if num_assistant_tokens is None else {**out, "num_assistant_tokens": num_assistant_tokens}
    if kind == "lora":
        model = copy.deepcopy(drafter.peft_model)
        model.set_adapter(drafter.adapter_name)
        model = model.merge_and_unload()
    elif kind == "assistant_model":
        model = copy.copy(drafter.model)  # a shallow copy: its own generation config, the same weights
        if target is not None and model.dtype != target.dtype:
            model = copy.deepcopy(drafter.model).to(target.dtype)  # transformers compares logits in one dtype
    else:
        return None
    config = copy.deepcopy(model.generation_config)
    if num_assistant_tokens is not None:
        config.num_assistant_tokens = num_assistant_tokens
        config.num_assistant_tokens_schedule = "constant"  # draft exactly N tokens, as MetaSD does
        config.assistant_confidence_threshold = 0.0
    model.generation_config = config
    out: dict[str, Any] = {"assistant_model": model}
    return out if num_assistant_tokens is None else {**out, "num_assistant_tokens": num_assistant_tokens}


def untrained_drafters(target: Any, count: int, *, num_layers: int = 2, seed: int = 0) -> list[ModelDrafter]:
    """`count` randomly initialised drafters with the target's vocabulary: a pool of drafters that never help.

    Each is the target's architecture cut to `num_layers` layers, with fresh random weights (seeds ``seed + i``), in
    the target's dtype and on its device. MetaSD over such a pool must fall back to plain decoding speed.
    """
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(target.config)
    config.num_hidden_layers = num_layers
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    drafters = []
    for i in range(count):
        torch.manual_seed(seed + i)
        model = AutoModelForCausalLM.from_config(config, dtype=target.dtype).to(target.device).eval()
        drafters.append(ModelDrafter(model, name=f"untrained_{i}"))
    return drafters


def precedence_arms(drafters: Sequence[Drafter], priors: dict[str, float] | None = None) -> dict[str, int] | None:
    """The ``precedence`` policy's arms over `drafters`: the first copier (a drafter that scores its matches, such as
    a corpus drafter) and the model drafter with the highest prior in `priors` (a pool's measured speed of each arm
    alone: the rule gets the pool's best model drafter), else the first one; None without a copier or a model drafter.

    Example:
        >>> from hf_metasd.drafters import CorpusDrafter, PromptLookupDrafter
        >>> precedence_arms([PromptLookupDrafter(), CorpusDrafter.from_sequences([[1, 2, 3]])]) is None
        True
    """
    copier = next((i for i, d in enumerate(drafters) if d.scores_matches), None)
    models = [i for i, d in enumerate(drafters) if isinstance(d, ModelDrafter)]
    if copier is None or not models:
        return None
    known = priors or {}
    model = max(models, key=lambda i: (known.get(drafters[i].name, float("-inf")), -i))
    return {"copier": copier, "model": model}


def build_methods(
    pool: Any,
    *,
    num_assistant_tokens: int | None = None,
    policies: Sequence[tuple] = DEFAULT_POLICIES,
    transformers_baselines: bool | str = "kinds",
    transformers_defaults: bool = True,
    fixed_baselines: bool = True,
    stream_policy: bool = False,
    full_information: bool = False,
    sub_pools: Sequence[Sequence[str]] = (),
    target: Any = None,
) -> list[Method]:
    """The methods of a benchmark run over `pool` (a `DrafterPool`, or a list of drafters).

    Args:
        pool: the pool; the ``metasd`` method passes it as is, so that it brings its defaults (policy, reward,
            draft length, priors).
        num_assistant_tokens: the draft length of every method (default: the pool's).
        policies: `DEFAULT_POLICIES`-style rows; a row's None policy or reward keeps the pool's.
        transformers_baselines: transformers' assisted generation with ``"all"`` drafters, the first drafter of
            each kind (``"kinds"``, default: LoRA arms of one base differ only by their adapter), every drafter
            with transformers' own defaults only (``"defaults"``: its dynamic draft length, prompt lookup's 10 tokens;
            transformers' prompt lookup joins them when the pool has none) or ``"none"``.
            When no drafter of the pool has a transformers equivalent (a pool of corpora), transformers' prompt
            lookup stands in, so that the run still compares with stock transformers.
        transformers_defaults: also run each of those with transformers' own default settings.
        fixed_baselines: each drafter alone (``fixed[<name>]``).
        stream_policy: one policy instance shared by every call of the run (learning over the stream).
        full_information: Hedge (a full-information policy: it scores every drafter by itself) fed with every
            drafter's BD each round; its per-round rewards are saved as traces
            (`traces.json`) that `hf_metasd.benchmark.simulate.replay` reads.
        sub_pools: for each list of drafter names, MetaSD with the pool's defaults over those drafters only (named
            e.g. ``metasd[general+prompt_lookup]``).
        target: the target (to give transformers' assistants the target's dtype).
    """
    drafters: list[Drafter] = list(getattr(pool, "drafters", pool))
    names = [d.name for d in drafters]
    n = num_assistant_tokens if num_assistant_tokens is not None else getattr(pool, "num_assistant_tokens", None)

    def metasd(members: Any = pool, **extra: Any) -> Callable[[BenchPrompt], dict[str, Any]]:
        length = {} if n is None else {"num_assistant_tokens": n}
        return lambda prompt: {
            "custom_generate": metasd_generate,
            "assistant_models": members,
            "return_dict_in_generate": True,
            **length,
            **extra,
        }

    methods = [Method("autoregressive", "autoregressive", lambda prompt: {})]
    methods.append(Method("metasd", "metasd", metasd()))
    if transformers_baselines is True or transformers_baselines == "all":
        baseline_drafters = list(drafters)
    elif transformers_baselines == "kinds":  # the first drafter of each kind (LoRA arms: the first adapter)
        baseline_drafters = list({d.kind: d for d in reversed(drafters)}.values())[::-1]
    elif transformers_baselines == "defaults":  # every drafter, with transformers' defaults only
        baseline_drafters = list(drafters)
        transformers_defaults = True
    elif transformers_baselines in (False, "none"):
        baseline_drafters = []
    else:
        raise ValueError(
            f"`transformers_baselines` must be 'all', 'kinds', 'defaults' or 'none', but is {transformers_baselines!r}. "
            "Pick one."
        )
    before = len(methods)
    like_for_like = transformers_baselines != "defaults"
    for drafter in baseline_drafters:
        kwargs = transformers_assisted_kwargs(drafter, n, target=target) if like_for_like else None
        if kwargs is not None:
            methods.append(
                Method(f"hf-assisted[{drafter.name}]", "transformers", lambda prompt, k=kwargs: k, kernel="metasd")
            )
        defaults = transformers_assisted_kwargs(drafter, None, target=target) if transformers_defaults else None
        if defaults is not None:
            methods.append(
                Method(f"hf-assisted[{drafter.name}] (hf defaults)", "transformers", lambda prompt, k=defaults: k)
            )
    lookup_missing = not any(d.kind == "prompt_lookup" for d in baseline_drafters)
    if transformers_baselines == "defaults" and lookup_missing:  # transformers' own model-free method, as it runs it
        defaults = transformers_assisted_kwargs(PromptLookupDrafter(), None)
        methods.append(Method("hf-assisted[prompt_lookup] (hf defaults)", "transformers", lambda p, k=defaults: k))
    elif baseline_drafters and len(methods) == before:  # no drafter has a transformers equivalent
        lookup = PromptLookupDrafter()
        kwargs, defaults = transformers_assisted_kwargs(lookup, n), transformers_assisted_kwargs(lookup, None)
        if like_for_like:
            methods.append(
                Method(f"hf-assisted[{lookup.name}]", "transformers", lambda p, k=kwargs: k, kernel="metasd")
            )
        if transformers_defaults:
            methods.append(
                Method(f"hf-assisted[{lookup.name}] (hf defaults)", "transformers", lambda p, k=defaults: k)
            )
    if fixed_baselines:  # the per-task oracle is derived from these (`report.summarize`)
        for i, name in enumerate(names):
            methods.append(
                Method(f"fixed[{name}]", "metasd", metasd(meta_policy="fixed", meta_policy_kwargs={"arm": i}))
            )
    for method_name, policy, reward, *extra in policies:
        kwargs = dict(extra[0]) if extra else {}
        if policy == "precedence":
            arms = precedence_arms(drafters, getattr(pool, "priors", None))
            if arms is None:
                continue
            kwargs["meta_policy_kwargs"] = arms
        if policy is not None:
            kwargs["meta_policy"] = policy
        if reward is not None:
            kwargs["meta_reward"] = reward
        methods.append(Method(method_name, "metasd", metasd(**kwargs)))
    for sub in sub_pools:
        unknown = [name for name in sub if name not in names]
        if unknown or not sub:
            raise ValueError(
                f"`sub_pools` entries must name drafters of the pool {names}, but {list(sub)} has {unknown or 'none'}. "
                "Fix the names."
            )
        index = [names.index(name) for name in sub]
        members = [drafters[i] for i in index]
        defaults = pool.generate_kwargs() if hasattr(pool, "generate_kwargs") else {}
        settings = {k: v for k, v in defaults.items() if k in ("meta_policy", "meta_policy_kwargs", "meta_reward")}
        # the sub-pool's no-draft arm (after its drafters) is the pool's (after all of them)
        methods.append(
            Method(f"metasd[{'+'.join(sub)}]", "metasd", metasd(members, **settings), arm_map=[*index, len(names)])
        )
    if full_information:
        methods.append(Method("hedge (full info)", "metasd", metasd(meta_policy="hedge", meta_reward="bd")))
    if stream_policy:
        defaults = pool.generate_kwargs() if hasattr(pool, "generate_kwargs") else {}
        shared = get_policy(
            defaults.get("meta_policy", DEFAULTS["meta_policy"]), **(defaults.get("meta_policy_kwargs") or {})
        )
        methods.append(Method("metasd (stream)", "metasd", metasd(meta_policy=shared)))
    return methods
