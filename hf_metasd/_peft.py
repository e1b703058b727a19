"""peft, the optional dependency both adapter kinds build on: importing it, its file names, and the lock an arm holds
while it switches a shared module's adapter.

A LoRA drafter (`hf_metasd.drafters.lora`: adapters on a peft model) and a feature-head arm
(`hf_metasd.feature_head.adapters`: adapters on a `FeatureHead`) both switch which adapter a module shared by
concurrent calls computes with. Each such module has one re-entrant lock (`adapter_lock`), created on first use and
dropped with the module; an arm holds it while it activates its adapter and computes, so no concurrent call computes
with another arm's adapter.

peft is installed with ``pip install hf-metasd[peft]`` and imported only where an adapter is built or loaded.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

__all__ = ["ADAPTER_CONFIG_NAME", "ADAPTER_WEIGHTS_NAME", "adapter_lock", "is_peft_model", "require_peft"]

#: A stored adapter is peft's ``adapter_config.json`` + ``adapter_model.safetensors``.
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
ADAPTER_CONFIG_NAME = "adapter_config.json"

#: module -> the lock its arms hold while they switch its adapter and compute (concurrent calls share it).
_LOCKS: weakref.WeakKeyDictionary[Any, threading.RLock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def require_peft(what: str) -> Any:
    """Import peft, or raise an `ImportError` saying that `what` needs it and which extra to install."""
    try:
        import peft
    except ImportError as err:  # pragma: no cover - peft is installed in the test environment
        raise ImportError(
            f"{what} `peft`, but it is not installed. Install it with `pip install hf-metasd[peft]`."
        ) from err
    return peft


def is_peft_model(obj: Any) -> bool:
    """Whether `obj` is a peft model (checked without importing peft)."""
    return type(obj).__module__.startswith("peft.") and hasattr(obj, "peft_config")


def adapter_lock(module: Any) -> threading.RLock:
    """The lock every arm on `module` (a peft model, a feature head) holds while it switches `module`'s adapter and
    computes with it: one per module, the same for every call.

    Example:
        >>> import torch
        >>> layer = torch.nn.Linear(2, 2)
        >>> adapter_lock(layer) is adapter_lock(layer), adapter_lock(layer) is adapter_lock(torch.nn.Linear(2, 2))
        (True, False)
    """
    with _LOCKS_GUARD:
        lock = _LOCKS.get(module)
        if lock is None:
            lock = _LOCKS[module] = threading.RLock()
        return lock
