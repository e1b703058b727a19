"""Drafter kinds: one module per kind, one `Drafter` protocol, one registry of kinds, the pool entry each kind owns.

Each kind owns its pool round trip (`Drafter.to_spec` / `Drafter.from_spec` / `Drafter.validate_spec`, through a
`DrafterSpec` and the `SaveContext` / `LoadContext` of `hf_metasd.drafters.save` and `hf_metasd.drafters.load`), so a
new kind is registered with one call (`register_drafter_kind`) and the pool code never names it. Nothing here imports
the pool: `hf_metasd.pool` builds on these modules.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._peft import is_peft_model
from ..errors import MetaSDConfigError
from .base import Drafter
from .corpus import CorpusDrafter
from .corpus_index import CorpusIndex
from .early_exit import EarlyExitDrafter, early_exit_model
from .feature_head_drafter import FeatureHeadDrafter
from .load import LoadContext
from .lora import LoraDrafter
from .model import ModelDrafter
from .other_tokenizer import TokenizerBridgeDrafter
from .prompt_lookup import PromptLookupDrafter, prompt_lookup_candidates
from .registry import DRAFTER_KINDS, register_drafter_kind
from .save import SaveContext
from .spec import DrafterSpec
from .token_recycling import RecyclingTable, TokenRecyclingDrafter
from .vocab import target_vocab_size, tokenizer_fingerprint

__all__ = [
    "DRAFTER_KINDS",
    "CorpusDrafter",
    "CorpusIndex",
    "Drafter",
    "DrafterSpec",
    "EarlyExitDrafter",
    "FeatureHeadDrafter",
    "LoadContext",
    "LoraDrafter",
    "ModelDrafter",
    "PromptLookupDrafter",
    "RecyclingTable",
    "SaveContext",
    "TokenRecyclingDrafter",
    "TokenizerBridgeDrafter",
    "as_drafters",
    "early_exit_model",
    "prompt_lookup_candidates",
    "register_drafter_kind",
    "target_vocab_size",
    "tokenizer_fingerprint",
    "unique_names",
]


def unique_names(drafters: Sequence[Drafter | str]) -> list[str]:
    """Drafter names for telemetry, with ``#k`` appended to repeated names (the drafters are not modified).

    The arm names a call knows its drafters by (``meta_priors`` keys, `MetaSDStats.drafter_names`). Names may be
    given instead of drafters.

    Example:
        >>> from hf_metasd.drafters import PromptLookupDrafter
        >>> unique_names([PromptLookupDrafter(), PromptLookupDrafter(name="pl"), PromptLookupDrafter()])
        ['prompt_lookup#0', 'pl', 'prompt_lookup#1']
        >>> unique_names(["a", "b"])
        ['a', 'b']
    """
    names = [d if isinstance(d, str) else d.name for d in drafters]
    seen: dict[str, int] = {}
    out = []
    for name in names:
        if names.count(name) > 1:
            out.append(f"{name}#{seen.get(name, 0)}")
            seen[name] = seen.get(name, 0) + 1
        else:
            out.append(name)
    return out


def as_drafters(assistant_models: Any, target: Any = None) -> list[Drafter]:
    """Normalise `assistant_models` into a list of drafters (one per arm).

    Accepts a sequence mixing `Drafter` objects, transformers causal LMs (wrapped in `ModelDrafter`) and peft models
    with several adapters (one arm per adapter).
    """
    if isinstance(assistant_models, Drafter) or hasattr(assistant_models, "config") or is_peft_model(assistant_models):
        assistant_models = [assistant_models]
    if not isinstance(assistant_models, Sequence) or isinstance(assistant_models, (str, bytes)):
        raise TypeError(
            f"`assistant_models` must be a list of drafters or models, but is {type(assistant_models).__name__}. "
            "Pass e.g. `assistant_models=[drafter_a, drafter_b]`."
        )
    drafters: list[Drafter] = []
    for i, item in enumerate(assistant_models):
        if isinstance(item, Drafter):
            drafters.append(item)
        elif is_peft_model(item):
            drafters.extend(LoraDrafter.from_peft_model(item))
        elif hasattr(item, "config") and hasattr(item, "forward"):
            drafters.append(ModelDrafter(item))
        else:
            raise TypeError(
                f"`assistant_models[{i}]` must be a `Drafter`, a transformers causal LM or a peft model, but is "
                f"{type(item).__name__}. Wrap custom drafters in a `hf_metasd.drafters.Drafter` subclass."
            )
    if not drafters:
        raise MetaSDConfigError(
            "`assistant_models` must hold at least one drafter, but is empty. "
            "Pass e.g. `assistant_models=[drafter]`, or drop it for plain `generate`."
        )
    return drafters
