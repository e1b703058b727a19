"""Drafter kinds: one module per kind, one `Drafter` protocol, one registry of kinds.

Each kind owns its pool round trip (`Drafter.to_spec` / `Drafter.from_spec` / `Drafter.validate_spec`), so a new kind
is registered with one call (`register_drafter_kind`) and the pool code never names it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import MetaSDConfigError
from .base import Drafter, is_peft_model, target_vocab_size, tokenizer_fingerprint
from .model import ModelDrafter

__all__ = [
    "DRAFTER_KINDS",
    "CorpusDrafter",
    "CorpusIndex",
    "Drafter",
    "EarlyExitDrafter",
    "LoraDrafter",
    "ModelDrafter",
    "PromptLookupDrafter",
    "TokenizerBridgeDrafter",
    "as_drafters",
    "early_exit_model",
    "prompt_lookup_candidates",
    "register_drafter_kind",
    "target_vocab_size",
    "tokenizer_fingerprint",
    "unique_names",
]

#: kind name -> Drafter subclass (used by pool configs). Each kind module registers itself.
DRAFTER_KINDS: dict[str, type[Drafter]] = {}


def register_drafter_kind(cls: type[Drafter]) -> type[Drafter]:
    """Register a `Drafter` subclass under its `kind` (a class decorator)."""
    if not cls.kind:
        raise ValueError(f"`{cls.__name__}.kind` must be a non-empty string, but is {cls.kind!r}. Set `kind`.")
    DRAFTER_KINDS[cls.kind] = cls
    return cls


register_drafter_kind(ModelDrafter)

# Each kind module registers itself; they import `register_drafter_kind` from here, hence after its definition.
from .corpus import CorpusDrafter, CorpusIndex  # noqa: E402
from .early_exit import EarlyExitDrafter, early_exit_model  # noqa: E402
from .lora import LoraDrafter  # noqa: E402
from .other_tokenizer import TokenizerBridgeDrafter  # noqa: E402
from .prompt_lookup import PromptLookupDrafter, prompt_lookup_candidates  # noqa: E402


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
            from .lora import LoraDrafter

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
