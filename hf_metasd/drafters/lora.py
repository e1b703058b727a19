"""LoRA drafters: several peft adapters on one resident base model, one arm per adapter.

Memory for K adapters is one base plus K adapters (the adapters are small), instead of K full drafters. Each arm is a
`ModelDrafter` with its own KV cache; the only difference is its forward pass, which first activates the arm's
adapter on the shared base (``set_adapter``, skipped when it is already active). Activation and forward run under
one lock per peft model, so arms of concurrent calls never run on another arm's adapter; a call gives the user's
peft model back on the adapter (and with the training flags) it had.

peft is an optional dependency (``pip install hf-metasd[peft]``), imported only when a LoRA drafter is built.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Sequence
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import torch

from .._peft import adapter_lock, is_peft_model, require_peft
from ..errors import DrafterCompatibilityError, InvalidPoolError, MetaSDConfigError
from .base import Drafter, eval_mode, shared_scope
from .load import LoadContext
from .model import ModelDrafter
from .registry import register_drafter_kind
from .save import SaveContext
from .spec import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, DrafterSpec, check_inside, require_path

__all__ = ["LoraDrafter", "load_adapters"]


@register_drafter_kind
class LoraDrafter(ModelDrafter):
    """One adapter of a peft model as one drafter; arms built from the same peft model share its base.

    Build them with `LoraDrafter.from_peft_model` (one drafter per adapter) or pass the peft model itself in
    ``assistant_models=[...]``, which does the same.

    Args:
        peft_model: a `peft.PeftModel` whose base is a causal LM sharing the target's vocabulary.
        adapter_name: the adapter this arm drafts with (one of ``peft_model.peft_config``).
        name: label (default: the adapter's name).
        head_token_ids: restrict the LM head to these ids (see `ModelDrafter`).

    Attributes:
        peft_model: the shared peft model.
        adapter_name: this arm's adapter.
        source: where the pool loader found the base and adapter (``None`` for drafters built in memory); used by
            `DrafterPool.save_pretrained` to save the drafter as it came.

    In a pool, neighbouring arms of one peft model are saved as **one** entry (`spec_group`): the base once, one
    adapter folder per arm.

    Example:
        >>> import torch
        >>> from peft import LoraConfig, get_peft_model
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        ...                   num_attention_heads=2, num_key_value_heads=1)
        >>> _ = torch.manual_seed(0)
        >>> lora = LoraConfig(r=2, target_modules=["q_proj", "v_proj"])
        >>> peft_model = get_peft_model(LlamaForCausalLM(cfg), lora, adapter_name="code")
        >>> peft_model.add_adapter("math", lora)
        >>> [d.name for d in LoraDrafter.from_peft_model(peft_model)]
        ['code', 'math']
    """

    kind = "lora"

    def __init__(
        self,
        peft_model: Any,
        adapter_name: str,
        *,
        name: str | None = None,
        head_token_ids: torch.Tensor | Sequence[int] | None = None,
    ) -> None:
        require_peft("LoRA drafters need")
        if not is_peft_model(peft_model):
            raise TypeError(
                f"`peft_model` must be a `peft.PeftModel`, but is {type(peft_model).__name__}. "
                "Wrap the base with `peft.PeftModel.from_pretrained(base, adapter)` or `peft.get_peft_model`."
            )
        adapters = sorted(peft_model.peft_config)
        if adapter_name not in peft_model.peft_config:
            raise DrafterCompatibilityError(
                f"`adapter_name` must be one of the peft model's adapters {adapters}, but is {adapter_name!r}. "
                "Load it first with `peft_model.load_adapter(path, adapter_name=...)`."
            )
        if peft_model.peft_config[adapter_name].is_prompt_learning:
            raise DrafterCompatibilityError(
                f"adapter {adapter_name!r} must be an adapter injected in the base's layers (LoRA, IA3, ...), but is "
                f"a prompt-learning adapter ({peft_model.peft_config[adapter_name].peft_type}). Use a LoRA adapter."
            )
        self.peft_model = peft_model
        self.adapter_name = adapter_name
        self.source: dict[str, Any] | None = None
        base = peft_model.get_base_model()
        if head_token_ids is not None:
            self._check_head_not_adapted(base, name or adapter_name)
        super().__init__(base, name=name or adapter_name, head_token_ids=head_token_ids, float32_prefill=False)

    @staticmethod
    def _check_head_not_adapted(base: Any, name: str) -> None:
        from peft.tuners.tuners_utils import BaseTunerLayer

        if isinstance(base.get_output_embeddings(), BaseTunerLayer):
            raise DrafterCompatibilityError(
                f"drafter {name!r} must not adapt its LM head to restrict it with `head_token_ids`, but its adapters "
                "wrap the LM head. Drop `head_token_ids`, or leave `lm_head` out of the adapters' `target_modules`."
            )

    @classmethod
    def from_peft_model(
        cls,
        peft_model: Any,
        *,
        adapter_names: Sequence[str] | None = None,
        head_token_ids: torch.Tensor | Sequence[int] | None = None,
    ) -> list[LoraDrafter]:
        """One drafter per adapter of `peft_model` (all of them, in loading order, unless `adapter_names` is given).

        The arms share the base and, with `head_token_ids`, one restricted head (gathered once).
        """
        require_peft("LoRA drafters need")
        if not is_peft_model(peft_model):
            raise TypeError(
                f"`peft_model` must be a `peft.PeftModel`, but is {type(peft_model).__name__}. "
                "Wrap the base with `peft.PeftModel.from_pretrained(base, adapter)` or `peft.get_peft_model`."
            )
        names = list(peft_model.peft_config) if adapter_names is None else list(adapter_names)
        if not names:
            raise DrafterCompatibilityError(
                "`adapter_names` must name at least one adapter, but is empty. Load an adapter into the peft model."
            )
        drafters = [cls(peft_model, names[0], head_token_ids=head_token_ids)]
        for adapter in names[1:]:
            drafter = cls(peft_model, adapter)
            if head_token_ids is not None:
                drafter._share_head(drafters[0])
            drafters.append(drafter)
        return drafters

    def check_compatible(self, target: Any) -> None:
        """The vocabulary check, and no arm that would switch the target's own adapter: when the peft model's
        adapters sit in the target's own layers (``get_peft_model(target, ...)`` wraps the target in place), an arm
        on another adapter than the active one would have the target verify its drafts under that adapter, not the
        user's (and it costs a target pass per drafted token anyway). Refused before any compute
        (`DrafterCompatibilityError`)."""
        super().check_compatible(target)
        if self.peft_model.active_adapter != self.adapter_name and _adapts(self.peft_model, target):
            raise DrafterCompatibilityError(
                f"drafter {self.name!r} must run on a model apart from the target, but its peft model's adapters are "
                "in the target's own layers (`get_peft_model(target, ...)` wraps the target in place): drafting with "
                f"adapter {self.adapter_name!r} would switch the target's active adapter, and the target would verify "
                "under it. Load the adapters onto a separate copy of the base model (e.g. "
                "`PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter)`), or draft with the "
                "target's first layers (`EarlyExitDrafter(target, k)`)."
            )

    def _share_head(self, other: ModelDrafter) -> None:
        """Use `other`'s restricted head rows (same base: same LM head) instead of gathering a copy."""
        self.head_token_ids = other.head_token_ids
        self._head_weight = other._head_weight
        self._head_bias = other._head_bias

    def activate(self) -> None:
        """Make this arm's adapter the active one on the shared base (no-op when it already is)."""
        if self.peft_model.active_adapter != self.adapter_name:
            self.peft_model.set_adapter(self.adapter_name, inference_mode=True)

    def _forward(self, ids: torch.Tensor, num_logits: int) -> torch.Tensor:
        with adapter_lock(self.peft_model):
            self.activate()
            return super()._forward(ids, num_logits)

    def in_use(self) -> AbstractContextManager[Any]:
        """Eval mode, and the user's active adapter back after the call (shared by concurrent calls)."""
        peft_model = self.peft_model

        def enter() -> Any:
            active = peft_model.active_adapter
            active = list(active) if isinstance(active, (list, tuple)) else active
            return active, [(p, p.requires_grad) for p in peft_model.parameters()]

        def leave(state: Any) -> None:
            active, grads = state
            with adapter_lock(peft_model):
                if peft_model.active_adapter != active:
                    peft_model.set_adapter(active)
                for param, flag in grads:  # `set_adapter` also changes which parameters require grad
                    param.requires_grad_(flag)

        stack = ExitStack()
        stack.enter_context(shared_scope(("adapter", id(peft_model)), enter, leave))
        stack.enter_context(eval_mode(peft_model))
        return stack

    def config(self) -> dict[str, Any]:
        return {"adapter_name": self.adapter_name, **super().config()}

    # ------------------------------------------------------------------ pool config round trip
    def spec_group(self) -> Hashable | None:
        """Arms of the same peft model (standing next to each other in the pool) make one entry."""
        return ("peft_model", id(self.peft_model))  # compared at once, while the pool holds every arm's model

    @classmethod
    def to_spec(cls, group: list[Drafter], ctx: SaveContext) -> DrafterSpec:
        """One entry for the arms of one peft model: the base and the adapters by reference (as loaded), or stored
        as ``lora/<name>/base/`` (once per peft model, however many entries use it) and
        ``lora/<name>/adapters/<adapter>/``. The arms' restricted head is the first arm's.

        `adapters` lists the arms' adapters in order. Params: ``base`` (subfolder of `path` holding the base model,
        ``""`` for `path` itself), ``adapters_dir`` (subfolder of `path` holding one folder per adapter),
        ``share_target_embeddings``, ``head_token_ids`` and ``dtype``.
        """
        first = group[0]
        where = ctx.where(first)
        peft_model = first.peft_model
        base = peft_model.get_base_model()
        source = first.source or {}
        store, path, revision = ctx.reference(first, where, None)
        adapters = [d.adapter_name for d in group]
        name = source.get("entry_name") or Path(getattr(base, "name_or_path", "") or "").name or adapters[0]
        share = store and ctx.shares_target_embeddings(base, first)
        params: dict[str, Any] = {
            "base": source.get("base", "base"),
            "adapters_dir": source.get("adapters_dir", "adapters"),
            "share_target_embeddings": source.get("share_target_embeddings", False) if not store else share,
        }
        if store:
            params["base"], params["adapters_dir"] = "base", "adapters"
            key = ("lora_base", id(peft_model))  # `ctx` lasts one save, while the pool holds the model: no reuse
            folder = ctx.shared.get(key)
            if folder is None:
                folder = ctx.shared[key] = ctx.folder("lora", name)
                ctx.save_model(base, f"{folder}/base", drop_embeddings=share)
            for adapter in adapters:
                ctx.save_adapter(peft_model, adapter, f"{folder}/adapters/{adapter}")
            path = folder
        else:
            folder = ctx.folder("lora", name)
        params["head_token_ids"] = ctx.head(first, folder)
        params["dtype"] = str(base.dtype).removeprefix("torch.")
        return DrafterSpec(cls.kind, name, path, revision, store, adapters, params)

    @classmethod
    def from_spec(cls, spec: DrafterSpec, ctx: LoadContext) -> list[Drafter]:
        """One arm per adapter of the entry, on one base: entries on the same base folder share the loaded base."""
        where = ctx.where(spec)
        head_ids = ctx.head_ids(spec, where)
        share = ctx.share(spec, where)
        dtype = ctx.dtype(spec, where)
        folder = Path(ctx.resolve(spec, where, need_folder=True))
        base_dir = spec.params.get("base", "base") or ""
        adapters_dir = spec.params.get("adapters_dir", "adapters")
        paths = {a: folder / adapters_dir / a for a in spec.adapters}
        missing = [a for a, p in paths.items() if not (p / ADAPTER_CONFIG_NAME).is_file()]
        if missing:
            raise InvalidPoolError(
                f"{where} must find adapter {missing[0]!r} at {str(paths[missing[0]])!r}, but it is missing. Restore "
                f"the adapter folder, or remove {missing[0]!r} from `adapters` in config.json."
            )
        for path in paths.values():  # no code, safetensors only: checked before anything is loaded
            ctx.adapter_folder(path, where)
        key = ("lora_base", str(folder.resolve()), base_dir)
        peft_model = ctx.bases.get(key)
        if peft_model is None:
            base = ctx.load_model(spec, where, folder=folder / base_dir, share=share, dtype=dtype)
        for adapter, path in paths.items():
            with ctx.reading(where, path / ADAPTER_WEIGHTS_NAME):
                if peft_model is None:
                    peft_model = ctx.bases[key] = load_adapters(base, {adapter: path})
                elif adapter not in peft_model.peft_config:
                    peft_model.load_adapter(str(path), adapter_name=adapter, is_trainable=False)
        try:
            arms = cls.from_peft_model(peft_model, adapter_names=spec.adapters, head_token_ids=head_ids)
        except MetaSDConfigError:
            raise
        except (TypeError, ValueError) as err:  # e.g. head ids outside the vocabulary
            raise ctx.bad_params(spec, cls, err) from err
        for arm in arms:
            arm.source = ctx.source(
                spec, share_target_embeddings=share, base=base_dir, adapters_dir=adapters_dir, entry_name=spec.name
            )
        return arms

    @classmethod
    def validate_spec(cls, spec: DrafterSpec, where: str) -> None:
        """A `path`, `params.base` / `params.adapters_dir` / adapter names inside the pool, a non-empty `adapters`."""
        require_path(spec, where)
        check_inside(spec.params.get("base"), f"{where} `params.base`")
        check_inside(spec.params.get("adapters_dir"), f"{where} `params.adapters_dir`")
        for j, adapter in enumerate(spec.adapters or []):
            if isinstance(adapter, str):
                check_inside(adapter, f"{where} `adapters[{j}]`", single=True)
        if not spec.adapters or not all(isinstance(a, str) and a for a in spec.adapters):
            raise InvalidPoolError(
                f"{where} must list its adapters in `adapters` (non-empty names), but has {spec.adapters!r}. "
                'List the adapter folders to load, e.g. `adapters: ["code"]`.'
            )

    @classmethod
    def arm_names(cls, spec: DrafterSpec) -> list[str]:
        """One arm per adapter, named after it."""
        return list(spec.adapters or [])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, adapter_name={self.adapter_name!r})"


def _adapts(peft_model: Any, target: Any) -> bool:
    """Whether `target` computes with `peft_model`'s adapters: its base is the target, or one of its adapted layers
    is a module of the target."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    if peft_model.get_base_model() is target:
        return True
    adapted = {id(m) for m in peft_model.modules() if isinstance(m, BaseTunerLayer)}
    return any(id(m) in adapted for m in target.modules())


def load_adapters(
    base_model: Any,
    adapters: dict[str, str | os.PathLike],
    *,
    revision: str | None = None,
    token: str | bool | None = None,
) -> Any:
    """Load the adapters ``{name: folder or Hub repo id}`` onto `base_model`; returns the `peft.PeftModel`.

    The adapters are loaded frozen (inference mode); the base is wrapped in place, as peft does.
    """
    peft = require_peft("LoRA drafters need")
    if not adapters:
        raise DrafterCompatibilityError(
            "`adapters` must hold at least one adapter, but is empty. Pass e.g. `{'code': 'path/to/adapter'}`."
        )
    hub_kwargs = {k: v for k, v in {"revision": revision, "token": token}.items() if v is not None}
    items = list(adapters.items())
    first_name, first_path = items[0]
    peft_model = peft.PeftModel.from_pretrained(
        base_model, str(first_path), adapter_name=first_name, is_trainable=False, **hub_kwargs
    )
    for name, path in items[1:]:
        peft_model.load_adapter(str(path), adapter_name=name, is_trainable=False, **hub_kwargs)
    peft_model.set_adapter(first_name, inference_mode=True)
    return peft_model.eval()
