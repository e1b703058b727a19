"""`generate`'s signature as transformers reads it (`CallSignature`): what makes a removed or misspelt ``meta_*``
setting reach `hf_metasd.generate`'s own check instead of transformers' generic message."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterable, Mapping
from types import MappingProxyType

__all__ = ["CallSignature", "with_settings"]


def with_settings(signature: inspect.Signature, names: Iterable[str]) -> list[inspect.Parameter]:
    """`signature`'s parameters with `names` as keyword-only parameters (default None) before its ``**kwargs``."""
    params = list(signature.parameters.values())
    added = [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None) for k in names]
    return [*params[:-1], *added, params[-1]]


class CallSignature(inspect.Signature):
    """`generate`'s signature (`__signature__`): its parameters and every removed setting (`RETIRED_SETTINGS`), plus,
    when transformers reads it to choose what to hand the method, each ``meta_*`` keyword of that call that names no
    setting (a misspelt one).

    transformers hands a `custom_generate` callable only the keyword arguments its signature names and refuses the
    others as unused model kwargs with its generic message ("The following `model_kwargs` are not used by the
    model"). Named here, a removed or misspelt setting reaches `generate` (in its ``**model_kwargs``), which refuses
    it as `enable()` does (`check_setting_names`): why a removed one was removed, and for a misspelt one the valid
    settings and the closest.

    The misspelt keys are read from the call's keyword arguments, the local ``kwargs`` of transformers'
    `GenerationMixin._extract_generation_mode_kwargs`, which reads ``inspect.signature(custom_generate).parameters``
    and pops the keys it names from those ``kwargs`` for the decoding method (transformers 5.24.0 and 5.25.0,
    ``transformers/generation/utils.py``, 5.24 line 2576, 5.25 line 2579). Read from anywhere else (`help`, the docs),
    the signature is the declared one; a transformers whose method differs gets its own message for a misspelt key.
    """

    __slots__ = ()

    @property
    def parameters(self) -> Mapping[str, inspect.Parameter]:
        declared = super().parameters
        frame = sys._getframe(1)  # who reads the signature: transformers' choice of keyword arguments, or anyone
        if (
            frame.f_code.co_name != "_extract_generation_mode_kwargs"
            or frame.f_globals.get("__name__") != "transformers.generation.utils"
            or not isinstance(frame.f_locals.get("kwargs"), Mapping)
        ):
            return declared
        misspelt = [k for k in frame.f_locals["kwargs"] if isinstance(k, str) and k.startswith("meta_")]
        misspelt = [k for k in misspelt if k not in declared]
        if not misspelt:
            return declared
        return MappingProxyType({p.name: p for p in with_settings(self, misspelt)})
