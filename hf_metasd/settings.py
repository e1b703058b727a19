"""Every setting a MetaSD call reads, its default, and the settings a pool file may still hold from older versions.

The last level of the precedence in `hf_metasd.generation` (call > `GenerationConfig` > ``model.generation_config``
> the pool's defaults > these).
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEFAULTS", "META_KWARGS", "RETIRED_SETTINGS", "SETTINGS"]

#: The library's defaults for every MetaSD setting (the last level of the precedence above).
DEFAULTS: dict[str, Any] = {
    "num_assistant_tokens": 3,
    "meta_policy": "ucb_scaled",
    "meta_policy_kwargs": None,
    "meta_reward": "speed",
    "meta_full_information": False,
    "meta_warm_start": 0,
    "meta_skinny_gemm": None,
    "meta_no_draft": None,
    "meta_replay": None,
    "meta_confidence_stop": False,
    "meta_priors": None,
    "meta_prior_weight": None,
    "meta_learned_priors": True,
    "meta_draft_length": "measured",
    "meta_match_routing": False,
    "meta_prefill_gate": False,
}
#: Every setting a MetaSD call reads, by name.
SETTINGS = tuple(DEFAULTS)
#: keyword arguments that only mean something together with `assistant_models`.
META_KWARGS = tuple(k for k in SETTINGS if k.startswith("meta_"))
#: settings that earlier versions had and this one no longer reads: a pool file that sets one loads with a warning
#: naming it, and the value is ignored
RETIRED_SETTINGS: tuple[str, ...] = ()
