"""Early-exit self-drafting: the target's own first ``k`` layers, final norm and LM head, with their own KV cache.

No weight is copied. `early_exit_model` builds a *view* of the target: a model object of the target's class whose
modules are structural clones of the target's (new module objects, so that the view can be given its own config and
peft adapters without touching the target) holding the **same** parameter and buffer tensors. Only its decoder stack
is cut after ``k`` layers. Because the view is an ordinary transformers model, the drafter is a `ModelDrafter` (cache
cropping, one-pass catch-up, restricted head) and gets everything the target's architecture does (rotary embeddings,
masks, embedding scaling) for free.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch
from torch import nn

from .._peft import require_peft
from ..errors import DrafterCompatibilityError
from .base import Drafter, int_error
from .load import LoadContext
from .model import ModelDrafter
from .registry import register_drafter_kind
from .save import SaveContext
from .spec import ADAPTER_WEIGHTS_NAME, DrafterSpec

__all__ = ["EarlyExitDrafter", "early_exit_model"]


def _clone_structure(module: nn.Module) -> nn.Module:
    """A new module tree with the same classes and attributes that shares every parameter and buffer tensor.

    Containers (`_modules`, `_parameters`, `_buffers`, hook dicts) are copied, so replacing a submodule in the clone
    (as peft does when it injects adapters) leaves the original untouched.
    """
    clone = module.__class__.__new__(module.__class__)
    state = dict(module.__dict__)
    for key, value in state.items():
        if key.startswith("_") and isinstance(value, (dict, set)):
            state[key] = copy.copy(value)
    state["_modules"] = {
        name: None if child is None else _clone_structure(child) for name, child in module._modules.items()
    }
    clone.__dict__.update(state)
    return clone


def _decoder_parts(target: Any) -> tuple[nn.Module, nn.ModuleList]:
    inner = getattr(target, "model", None)
    layers = getattr(inner, "layers", None)
    config = getattr(target, "config", None)
    if (
        not isinstance(target, nn.Module)
        or config is None
        or not isinstance(layers, nn.ModuleList)
        or not all(hasattr(inner, attr) for attr in ("embed_tokens", "norm"))
        or not hasattr(target, "get_output_embeddings")
        or target.get_output_embeddings() is None
        or (hasattr(config, "get_text_config") and config.get_text_config() is not config)
    ):
        raise DrafterCompatibilityError(
            f"`target` must be a Llama-family causal LM (`target.model.embed_tokens`, `target.model.layers`, "
            f"`target.model.norm`, `target.lm_head`), but is {type(target).__name__}. Use an assistant-model or "
            "prompt-lookup drafter for this target."
        )
    hooked = [name or type(target).__name__ for name, m in target.named_modules() if "forward" in m.__dict__]
    if hooked:
        raise DrafterCompatibilityError(
            f"`target` must run its modules' own `forward` to be cut after a few layers, but {hooked[0]!r} has a "
            "per-instance `forward` (accelerate hooks from `device_map=`, or a patched module). Load the target on "
            "one device without `device_map`, or use an assistant-model drafter."
        )
    return inner, layers


def early_exit_model(target: Any, num_layers: int) -> nn.Module:
    """A view of `target` that runs only its first `num_layers` decoder layers, then its final norm and LM head.

    The view shares every weight with `target` (same tensors, no copy) and has its own config
    (``num_hidden_layers = num_layers``), so a `DynamicCache` built from it has `num_layers` layers.

    Raises:
        DrafterCompatibilityError: `target` is not a Llama-family causal LM (``target.model.layers``).
        TypeError: `num_layers` is not an int.
        ValueError: `num_layers` is not in ``[1, number of target layers]``.
    """
    inner, layers = _decoder_parts(target)
    total = len(layers)
    if not isinstance(num_layers, int) or isinstance(num_layers, bool) or not 1 <= num_layers <= total:
        raise int_error(num_layers)(
            f"`num_layers` must be an int in [1, {total}] (the target has {total} layers), but is {num_layers!r}. "
            f"Use e.g. {max(1, total // 4)}."
        )
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = num_layers
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:num_layers]
    view = _clone_structure(target)
    view.config = config
    view.model.config = config
    view.model.layers = nn.ModuleList(list(view.model.layers)[:num_layers])
    return view


@register_drafter_kind
class EarlyExitDrafter(ModelDrafter):
    """Self-drafting with the target's first `num_layers` layers (plus its final norm and LM head).

    Args:
        target: the target model (Llama family: ``target.model.layers``); its weights are shared, not copied.
        num_layers: decoder layers to keep, in ``[1, number of target layers]``. Fewer layers: cheaper drafts that
            agree less with the target.
        name: label (default ``"early_exit_<num_layers>"``).
        adapter: optional peft adapter trained for these layers: a folder or Hub repo id (loaded frozen), or a
            `peft.PeftConfig` to create a fresh adapter (e.g. to train it). It is injected into the view only: the
            target keeps running without it.
        revision, token: for an `adapter` on the Hub.
        head_token_ids: restrict the LM head to these ids (see `ModelDrafter`).

    Example:
        >>> import torch
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=4,
        ...                   num_attention_heads=2, num_key_value_heads=1)
        >>> _ = torch.manual_seed(0)
        >>> target = LlamaForCausalLM(cfg)
        >>> drafter = EarlyExitDrafter(target, num_layers=1)
        >>> drafter.name, drafter.model.lm_head.weight is target.lm_head.weight
        ('early_exit_1', True)
    """

    kind = "early_exit"

    def __init__(
        self,
        target: Any,
        num_layers: int,
        *,
        name: str | None = None,
        adapter: str | os.PathLike | Any | None = None,
        revision: str | None = None,
        token: str | bool | None = None,
        head_token_ids: torch.Tensor | list[int] | None = None,
    ) -> None:
        view = early_exit_model(target, num_layers)
        self.num_layers = num_layers
        self.peft_model: Any = None
        self.adapter: str | None = None
        self.adapter_revision = revision
        if adapter is not None:
            peft = require_peft("An early-exit adapter needs")
            if isinstance(adapter, peft.PeftConfig):
                self.peft_model = peft.get_peft_model(view, adapter)
            else:
                self.adapter = str(adapter)
                hub_kwargs = {k: v for k, v in {"revision": revision, "token": token}.items() if v is not None}
                self.peft_model = peft.PeftModel.from_pretrained(view, self.adapter, is_trainable=False, **hub_kwargs)
            self.peft_model.eval()
        super().__init__(
            view, name=name or f"early_exit_{num_layers}", head_token_ids=head_token_ids, float32_prefill=False
        )

    def config(self) -> dict[str, Any]:
        return {"num_layers": self.num_layers, **super().config()}

    # ------------------------------------------------------------------ pool config round trip
    @classmethod
    def to_spec(cls, group: list[Drafter], ctx: SaveContext) -> DrafterSpec:
        """``num_layers`` and the head (the target's layers are not saved); an adapter by reference, or stored in
        ``early_exit/<name>/``."""
        (drafter,) = group
        folder = ctx.folder("early_exit", drafter.name)
        path, revision, store = None, None, False
        if drafter.peft_model is not None:
            store, path, revision = ctx.reference(drafter, ctx.where(drafter), drafter.adapter)
            revision = revision or drafter.adapter_revision
            if store:
                ctx.save_adapter(drafter.peft_model, drafter.peft_model.active_adapter, folder)
                path = folder
        params = {"num_layers": drafter.num_layers, "head_token_ids": ctx.head(drafter, folder)}
        return DrafterSpec(cls.kind, drafter.name, path, revision, store, None, params)

    @classmethod
    def from_spec(cls, spec: DrafterSpec, ctx: LoadContext) -> list[Drafter]:
        """The first ``num_layers`` layers of ``ctx.target``, with the entry's adapter (if any) and head."""
        where = ctx.where(spec)
        head_ids = ctx.head_ids(spec, where)
        params = {k: v for k, v in spec.params.items() if k not in ("head_token_ids", "share_target_embeddings")}
        adapter = None if not spec.path else ctx.resolve(spec, where, need_folder=False)
        if adapter is not None and (spec.stored or ctx.mapped(spec.path) is not None):
            ctx.adapter_folder(adapter, where)  # a local folder: no code, safetensors only

        def construct() -> EarlyExitDrafter:
            return cls(
                ctx.target,
                name=spec.name,
                adapter=adapter,
                revision=None if spec.stored else spec.revision,
                token=ctx.hub.get("token"),
                head_token_ids=head_ids,
                **params,
            )

        # `params` the constructor refuses are named by `build`; anything else reading the adapter by `reading`
        with ctx.reading(where, os.path.join(adapter or "", ADAPTER_WEIGHTS_NAME)):
            return [ctx.build(spec, cls, construct)]

    @classmethod
    def validate_spec(cls, spec: DrafterSpec, where: str) -> None:
        """An early-exit entry needs no `path` (only an adapter has one); like every kind but LoRA, no `adapters`."""
        super(ModelDrafter, cls).validate_spec(spec, where)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, num_layers={self.num_layers})"
