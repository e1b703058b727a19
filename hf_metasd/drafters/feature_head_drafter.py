"""White-box drafting: a `FeatureHeadDrafter` drafts with an EAGLE-3-style `FeatureHead` from the target's own
features (`hf_metasd.feature_head`).

The drafter has no model of the sequence of its own: it reads what the target computed while verifying. During every
verification pass of a call whose pool holds a feature-head drafter, `hf_metasd.decoding` records the inputs of the
head's target layers (`FeatureRecorder`: forward pre-hooks, installed for that pass only); after acceptance, the
features of the kept positions and the ids of the tokens that follow them go to every feature-head drafter of the call
(`MetaCandidateGenerator.observe_target_features` -> `FeatureHeadDrafter.observe`), whether or not it drafted the
round. The newest token's feature comes with the next pass, so the drafter abstains in the call's first round (no
feature yet) and drafts from then on. `catch_up` does nothing: there is nothing to ingest.

Per-task adapters (`hf_metasd.feature_head.adapters`): several LoRA adapters on one resident head, one arm per adapter
(``FeatureHeadDrafter(head, adapter="code")``) beside the base head's arm (``adapter=None``: every adapter off). An
arm drafts under the head's lock with its adapter active, so concurrent calls never draft with another arm's adapter;
each arm keeps its own cache and observed features, as every arm does.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import torch

from ..errors import DrafterCompatibilityError, InvalidPoolError, InvalidPoolTypeError, MetaSDConfigError
from ..feature_head import FeatureHead, adapter_names, load_adapter, load_feature_head, save_adapter, save_feature_head
from ..feature_head.adapters import (
    adapter_state,
    check_adapter_name,
    check_savable,
    restore_adapter_state,
    using_adapter,
)
from .base import Drafter, eval_mode, shared_scope
from .load import LoadContext
from .registry import register_drafter_kind
from .save import SaveContext
from .spec import DrafterSpec, require_path

#: Subfolder of a stored head's folder holding one folder per adapter.
ADAPTERS_DIR = "adapters"

__all__ = ["FeatureHeadDrafter"]


@register_drafter_kind
class FeatureHeadDrafter(Drafter):
    """Drafts with a `FeatureHead` from the target's features at ``head.config.layer_ids``.

    The head (its weights, and the target's embedding it shares) is shared by every call; each call's copy
    (`Drafter.spawn`) has its own `FeatureHeadCache` and its own features not yet fed to the head.

    Args:
        head: a `FeatureHead` built for the target (``FeatureHead(config, target.get_input_embeddings())``, or
            `hf_metasd.feature_head.load_feature_head`), on the target's device.
        adapter: the head's adapter this arm drafts with (`hf_metasd.feature_head.add_adapter` / `load_adapter`), or
            ``None`` (default) for the head's own weights, every adapter off.
        name: label (default: the adapter's name, else ``"feature_head"``).

    Pool entry: the head is always stored inside the pool, in hf_metasd's layout (``feature_head/<name>/``:
    ``feature_head_config.json`` + ``feature_head.safetensors``), once however many arms draft with it; loading reads
    that folder, or a Hub repo in either layout `load_feature_head` reads, and entries with the same folder share one
    head. An adapter arm's entry has ``params.adapter``: its adapter is stored in ``<head folder>/adapters/<adapter>/``
    (``adapter_config.json`` + ``adapter_model.safetensors``) and checked as `load_adapter` does before it is read.
    A base arm's entry has no `params`.

    Example:
        >>> import torch
        >>> from hf_metasd.feature_head import FeatureHeadConfig, add_adapter
        >>> config = FeatureHeadConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4,
        ...                            num_key_value_heads=2, vocab_size=96, draft_vocab_size=96, layer_ids=(1,))
        >>> head = FeatureHead(config, torch.nn.Embedding(96, 32))
        >>> add_adapter(head, "code", r=4)
        >>> add_adapter(head, "math", r=4)
        >>> [arm.name for arm in FeatureHeadDrafter.arms(head)]
        ['feature_head', 'code', 'math']
    """

    kind = "feature_head"

    def __init__(self, head: FeatureHead, *, adapter: str | None = None, name: str | None = None) -> None:
        if not isinstance(head, FeatureHead):
            raise TypeError(
                f"`head` must be a `FeatureHead`, but is {type(head).__name__}. Build one with "
                "`FeatureHead(config, target.get_input_embeddings())` or load one with `load_feature_head`."
            )
        if adapter is not None and adapter not in adapter_names(head):
            raise DrafterCompatibilityError(
                f"`adapter` must be one of the head's adapters {adapter_names(head)} or None (the base head), but is "
                f"{adapter!r}. Add it with `hf_metasd.feature_head.add_adapter` or load it with `load_adapter`."
            )
        super().__init__(name or adapter)
        self.head = head
        self.adapter = adapter
        self.reset()

    @classmethod
    def arms(cls, head: FeatureHead, *, base: bool = True) -> list[FeatureHeadDrafter]:
        """One arm per adapter of `head` (in the order they were added), after the base head's arm unless `base` is
        false; the arms share the head."""
        return ([cls(head)] if base else []) + [cls(head, adapter=adapter) for adapter in adapter_names(head)]

    @property
    def layer_ids(self) -> tuple[int, ...]:
        """The target layers whose features the head reads (`hf_metasd.feature_head.config`)."""
        return tuple(self.head.config.layer_ids)

    @property
    def vocab_size(self) -> int:
        return self.head.config.vocab_size

    @property
    def device(self) -> torch.device:
        return self.head.fc.weight.device

    def check_compatible(self, target: Any) -> None:
        """The head must fit `target` (hidden size, vocabulary, layer ids: `FeatureHeadConfig.check_target`)."""
        try:
            self.head.config.check_target(target, where=f"drafter {self.name!r}")
        except InvalidPoolError as err:
            raise DrafterCompatibilityError(str(err)) from err

    def in_use(self) -> AbstractContextManager[Any]:
        """Eval mode, and the head's adapter state (active adapter, adapters on or off, which parameters require grad)
        back as the user had it after the call (shared by concurrent calls)."""
        head = self.head
        stack = ExitStack()
        key = ("feature_head_adapter", id(head))
        stack.enter_context(shared_scope(key, lambda: adapter_state(head), lambda s: restore_adapter_state(head, s)))
        stack.enter_context(eval_mode(head))
        return stack

    def reset(self) -> None:
        self.cache = self.head.new_cache()
        self._features: list[torch.Tensor] = []  # observed, not yet fed to the head: (1, T, k H) each
        self._next_ids: list[torch.Tensor] = []  # (1, T) each: the token after each of those positions
        self._next: int | None = None  # the position the next observed feature must be at

    # ------------------------------------------------------------------ the target's features
    def observe(self, features: torch.Tensor, next_ids: torch.LongTensor, start: int) -> None:
        """Take the target's features ``(1, T, k H)`` at positions ``start .. start + T - 1`` of the sequence, and
        the ids ``(1, T)`` of the tokens at ``start + 1 .. start + T``. Positions must follow the ones observed
        before without a gap."""
        if self._next is not None and start != self._next:
            raise MetaSDConfigError(
                f"`start` must be {self._next} (the position after the features drafter {self.name!r} observed so "
                f"far), but is {start}. Pass the features of every kept position, in order."
            )
        if features.shape[:2] != next_ids.shape or features.shape[1] < 1:
            raise MetaSDConfigError(
                f"`features` must have shape (1, T, kH) and `next_ids` (1, T) with T >= 1, but they have "
                f"{tuple(features.shape)} and {tuple(next_ids.shape)}. Pass one next token per feature position."
            )
        self._features.append(features)
        self._next_ids.append(next_ids)
        self._next = start + features.shape[1]

    # ------------------------------------------------------------------ drafting
    def draft(
        self,
        input_ids: torch.LongTensor,
        num_tokens: int,
        *,
        logits_processor: Any = None,
        do_sample: bool = False,
    ) -> tuple[torch.LongTensor, torch.FloatTensor | None]:
        """Up to `num_tokens` tokens after `input_ids` ``(1, L)`` and their processed logits ``(1, n, V)``.

        Abstains (``n = 0``) when no feature was observed since the last draft (the call's first round). Otherwise
        the observed features must end at position ``L - 2`` (the newest token's feature comes with the next pass).
        """
        if num_tokens < 1 or not self._features:
            return input_ids[:, :0], None
        if self._next != input_ids.shape[1] - 1:
            raise MetaSDConfigError(
                f"`input_ids` must have {self._next + 1} tokens (the features drafter {self.name!r} observed end at "
                f"position {self._next - 1}), but has {input_ids.shape[1]}. Draft with the sequence whose features "
                "were observed, as `generate` does."
            )
        device = self.device
        features = torch.cat(self._features, dim=1).to(device)
        next_ids = torch.cat(self._next_ids, dim=1).to(device)
        self._features, self._next_ids = [], []
        processor = logits_processor if logits_processor is not None and len(logits_processor) > 0 else None
        with using_adapter(self.head, self.adapter):  # the head's lock, this arm's adapter active
            tokens, logits = self.head.draft(
                features,
                next_ids,
                num_tokens,
                cache=self.cache,
                input_ids=input_ids.to(device),
                logits_processor=processor,
                do_sample=do_sample,
            )
        if tokens.shape[1] == 0:  # the head's first step had no distribution (`FeatureHead.draft`): abstain
            return input_ids[:, :0], None
        return tokens.to(input_ids.device), logits

    # ------------------------------------------------------------------ pool config round trip
    @classmethod
    def to_spec(cls, group: list[Drafter], ctx: SaveContext) -> DrafterSpec:
        """The head stored in ``feature_head/<name>/`` (hf_metasd's layout, once per head: the first arm's name); the
        target's embedding is not saved. An adapter arm adds ``params.adapter`` and its adapter in
        ``<head folder>/adapters/<adapter>/`` (once per adapter); an adapter a load would refuse is refused here."""
        (drafter,) = group
        head = drafter.head
        folder = ctx.shared.get(("feature_head", id(head)))  # `ctx` lasts one save, while the pool holds the head
        if folder is None:
            folder = ctx.shared[("feature_head", id(head))] = ctx.folder("feature_head", drafter.name)
            ctx.schedule(lambda root: save_feature_head(head, root / folder))
        if drafter.adapter is None:
            return DrafterSpec(cls.kind, drafter.name, path=folder, stored=True)
        adapter = drafter.adapter
        check_savable(head, adapter, f" of {ctx.where(drafter)}", InvalidPoolError, InvalidPoolTypeError)
        if ("feature_head_adapter", id(head), adapter) not in ctx.shared:
            ctx.shared["feature_head_adapter", id(head), adapter] = True
            ctx.schedule(lambda root: save_adapter(head, adapter, root / folder / ADAPTERS_DIR / adapter))
        return DrafterSpec(cls.kind, drafter.name, path=folder, stored=True, params={"adapter": adapter})

    @classmethod
    def from_spec(cls, spec: DrafterSpec, ctx: LoadContext) -> list[Drafter]:
        """The head of the entry's folder (`load_feature_head`: checked against ``ctx.target`` before its tensors are
        read; one head for every entry with that folder), sharing the target's embedding; with ``params.adapter``,
        that adapter loaded onto it from ``<folder>/adapters/<adapter>/`` (`load_adapter`'s checks) unless an
        earlier entry did."""
        where = ctx.where(spec)
        folder = ctx.resolve(spec, where, need_folder=True)
        key = ("feature_head", str(Path(folder).resolve()))
        head = ctx.bases.get(key)
        if head is None:
            with ctx.reading(where, os.path.join(folder, "")):
                head = ctx.bases[key] = load_feature_head(folder, ctx.target)
        adapter = spec.params.get("adapter")
        if adapter is not None and adapter not in adapter_names(head):
            path = Path(folder) / ADAPTERS_DIR / adapter
            with ctx.reading(where, path):
                load_adapter(head, path, adapter)
        return [ctx.build(spec, cls, lambda: cls(head, name=spec.name, **spec.params))]

    @classmethod
    def validate_spec(cls, spec: DrafterSpec, where: str) -> None:
        """A feature-head entry needs a `path` (the head's folder); like every kind but LoRA, no `adapters`; an
        adapter arm's ``params.adapter`` is an adapter name (a folder name: letters, digits, ``_``, ``-``)."""
        super().validate_spec(spec, where)
        require_path(spec, where)
        if "adapter" in spec.params:
            check_adapter_name(spec.params["adapter"], f"{where} `params.adapter`", InvalidPoolError)

    def __repr__(self) -> str:
        adapter = "" if self.adapter is None else f", adapter={self.adapter!r}"
        return f"{type(self).__name__}(name={self.name!r}{adapter}, layer_ids={list(self.layer_ids)})"
