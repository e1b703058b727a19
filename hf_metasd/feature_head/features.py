"""`FeatureRecorder`: the target's features at the head's layers, recorded by forward pre-hooks during a pass the
target runs anyway (its verification pass), without ``output_hidden_states``.

EAGLE-3 layer id ``i < L`` is the input of target decoder layer ``i``; id ``L`` is the input of the target's final
norm (`hf_metasd.feature_head.config`). A forward pre-hook on each of those modules keeps the ``hidden_states`` it is
called with (a reference to a tensor the target computes anyway: nothing is copied); `features` concatenates the
last pass's, ``(B, T, k H)`` for the ``T`` tokens that pass was fed.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import InvalidPoolError, MetaSDConfigError
from .config import target_shape

__all__ = ["FeatureRecorder", "feature_modules"]


def feature_modules(target: Any, layer_ids: tuple[int, ...]) -> list[nn.Module]:
    """The module of `target` whose input is the feature of each id: ``target.model.layers[i]`` for ``i < L``,
    ``target.model.norm`` for ``i == L``."""
    _, _, num_layers = target_shape(target)
    if any(not 0 <= i <= num_layers for i in layer_ids):
        raise InvalidPoolError(
            f"`layer_ids` must be in [0, {num_layers}] for a target of {num_layers} layers, but is {list(layer_ids)}. "
            "Use the target the head was trained for."
        )
    inner = target.model
    return [inner.norm if i == num_layers else inner.layers[i] for i in layer_ids]


class FeatureRecorder:
    """Records `target`'s features at `layer_ids` during every forward pass inside ``with recorder:``.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> target = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16,
        ...                           num_hidden_layers=2, num_attention_heads=2)).eval()
        >>> with FeatureRecorder(target, (1, 2)) as recorder:
        ...     _ = target(torch.tensor([[1, 2, 3]]))
        >>> recorder.features().shape
        torch.Size([1, 3, 16])
    """

    def __init__(self, target: Any, layer_ids: tuple[int, ...]) -> None:
        self.layer_ids = tuple(layer_ids)
        self._modules = feature_modules(target, self.layer_ids)
        self._seen: list[torch.Tensor | None] = [None] * len(self.layer_ids)
        self._handles: list[Any] = []

    def _hook(self, slot: int):
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            self._seen[slot] = args[0] if args else kwargs["hidden_states"]

        return hook

    def __enter__(self) -> FeatureRecorder:
        if self._handles:
            raise MetaSDConfigError("a `FeatureRecorder` must be entered once at a time, but is already entered.")
        self._handles = [
            module.register_forward_pre_hook(self._hook(slot), with_kwargs=True)
            for slot, module in enumerate(self._modules)
        ]
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def clear(self) -> None:
        """Forget what the last pass recorded."""
        self._seen = [None] * len(self.layer_ids)

    def features(self) -> torch.Tensor:
        """``(B, T, k H)``: the features of the last pass, in `layer_ids` order."""
        if any(seen is None for seen in self._seen):
            raise MetaSDConfigError(
                "`features()` must follow a forward pass of the target inside `with recorder:`, but no pass was "
                "recorded. Run the target first."
            )
        shapes = {tuple(seen.shape[:2]) for seen in self._seen}
        if len(shapes) != 1:
            raise MetaSDConfigError(f"the recorded layers must come from one pass, but have shapes {sorted(shapes)}.")
        return torch.cat(self._seen, dim=-1)
