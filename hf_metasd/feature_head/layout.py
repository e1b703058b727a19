"""Saving and loading a head: hf_metasd's layout (``feature_head_config.json`` + ``feature_head.safetensors``), and
a loader that also reads speculators' EAGLE-3 layout (`hf_metasd.feature_head.speculators`).

A float32 weight whose every value is a bfloat16 number (``t.to(bfloat16).float() == t``, e.g. a head rounded with
`round_to_bfloat16` after training) is stored as bfloat16: half the bytes, the same values once loaded (a head
loads in its target's dtype). Any other weight is stored as it is.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
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

__all__ = ["load_feature_head", "round_to_bfloat16", "save_feature_head", "save_head"]


def _stored(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` on the CPU, as bfloat16 when that loses nothing (float32 values that are all bfloat16 numbers)."""
    tensor = tensor.detach().to("cpu").contiguous()
    if tensor.dtype == torch.float32:
        compact = tensor.to(torch.bfloat16)
        if torch.equal(compact.to(torch.float32), tensor):
            return compact
    return tensor


@torch.no_grad()
def round_to_bfloat16(head: FeatureHead) -> FeatureHead:
    """Round `head`'s float weights to the nearest bfloat16 numbers, in place (they keep their dtype), so that it is
    stored in half the bytes (`save_feature_head`) and what is measured is what is stored. Returns `head`.

    Example:
        >>> import torch
        >>> from hf_metasd.feature_head import FeatureHead, FeatureHeadConfig
        >>> config = FeatureHeadConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4,
        ...                            num_key_value_heads=2, vocab_size=96, draft_vocab_size=96, layer_ids=(1,))
        >>> head = round_to_bfloat16(FeatureHead(config, torch.nn.Embedding(96, 32)))
        >>> _stored(head.fc.weight).dtype, head.fc.weight.dtype
        (torch.bfloat16, torch.float32)
    """
    for tensor in head.base_state_dict().values():
        if tensor.dtype.is_floating_point:
            tensor.copy_(tensor.to(torch.bfloat16).to(tensor.dtype))
    return head


# ======================================================================================================================
# hf_metasd's layout
# ======================================================================================================================
def save_feature_head(head: FeatureHead, folder: str | os.PathLike) -> None:
    """Write `head` to `folder` in hf_metasd's layout (the module docstring)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: _stored(t) for name, t in head.base_state_dict().items()}
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
