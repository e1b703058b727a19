"""What differs between the transformers versions hf_metasd supports (`pyproject.toml`), in one place."""

from __future__ import annotations

import inspect
from typing import Any

from transformers.cache_utils import Cache

__all__ = ["activate_past_recording"]

#: transformers 5.25 added ``recurrent_states_to_keep`` (recurrent layers record that many past states for rollback)
_TAKES_STATES_TO_KEEP = any(
    p.kind is inspect.Parameter.VAR_KEYWORD or p.name == "recurrent_states_to_keep"
    for p in inspect.signature(Cache.activate_past_recording).parameters.values()
)


def activate_past_recording(cache: Any, recurrent_states_to_keep: int) -> None:
    """Let `cache` roll back: sliding-window layers keep what they would drop, recurrent layers record their last
    `recurrent_states_to_keep` states (on transformers versions that take the argument; older ones record without
    it)."""
    if _TAKES_STATES_TO_KEEP:
        cache.activate_past_recording(recurrent_states_to_keep=recurrent_states_to_keep)
    else:
        cache.activate_past_recording()
