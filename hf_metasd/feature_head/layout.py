"""Saving and loading a head: hf_metasd's layout (``feature_head_config.json`` + ``feature_head.safetensors``), and
a loader that also reads speculators' EAGLE-3 layout (`hf_metasd.feature_head.speculators`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from ..errors import InvalidPoolError, MetaSDConfigError
from .config import FeatureHeadConfig
from .head import FeatureHead
from .io import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    expected_state,
    load_state,
    new_head,
    read_json,
    read_tensors,
    weight_files,
)
from .speculators import load_speculators, save_speculators

__all__ = ["load_feature_head", "save_feature_head", "save_head"]


# ======================================================================================================================
# hf_metasd's layout
# ======================================================================================================================
def save_feature_head(head: FeatureHead, folder: str | os.PathLike) -> None:
    """Write `head` to `folder` in hf_metasd's layout (the module docstring)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in head.base_state_dict().items()}
    save_file(tensors, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
    (folder / CONFIG_NAME).write_text(head.config.to_json())


def load_feature_head(folder: str | os.PathLike, target: Any) -> FeatureHead:
    """The head saved in `folder` (hf_metasd's layout, or speculators' EAGLE-3 layout: a ``config.json`` with
    ``speculators_model_type``), for `target`, in eval mode, on the target's device and dtype."""
    folder = Path(folder)
    if (folder / CONFIG_NAME).is_file():
        fix = "Re-save the head with `save_head`."
        where = f"the feature head at {str(folder)!r}"
        config = FeatureHeadConfig.from_dict(read_json(folder / CONFIG_NAME, fix), f"{str(folder / CONFIG_NAME)!r}")
        expected = expected_state(config, target, where)
        tensors = read_tensors(weight_files(folder, WEIGHTS_NAME, fix), expected, optional=frozenset(), skipped={})
        return load_state(new_head(config, target), tensors, where)
    if (folder / "config.json").is_file():
        return load_speculators(folder, target)
    raise InvalidPoolError(
        f"the feature head folder {str(folder)!r} must hold {CONFIG_NAME} (hf_metasd's layout) or config.json "
        "(speculators' EAGLE-3 layout), but holds neither. Pass the folder a head was saved to."
    )


def save_head(head: FeatureHead, folder: str | os.PathLike, *, layout: str = "hf_metasd", **kwargs: Any) -> None:
    """Save `head` to `folder` in hf_metasd's layout, or with ``layout="speculators"`` in speculators' EAGLE-3 layout
    (`hf_metasd.feature_head.speculators.save_speculators`, which takes `kwargs`); `load_feature_head` reads both."""
    if layout == "speculators":
        save_speculators(head, folder, **kwargs)
    elif layout == "hf_metasd" and not kwargs:
        save_feature_head(head, folder)
    else:
        raise MetaSDConfigError(
            f'`layout` must be "hf_metasd" (no keyword arguments) or "speculators", but is {layout!r} with '
            f"{sorted(kwargs)}. Pick one."
        )
