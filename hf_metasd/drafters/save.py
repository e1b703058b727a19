"""Saving a drafter into a pool: the `SaveContext` every kind plans its entry through, and the weight files it writes.

A drafter kind saves itself (`Drafter.to_spec`) through a `SaveContext`, so that the pool's own code never names a
kind. The context threads through every entry of one save: `store_weights`, `for_hub`, the pool's target, the
scheduled writes (callables taking the pool root, run only once the whole pool is planned and valid), unique folder
names, a registry of shared things already planned (a LoRA base stored once for several entries), and helpers several
kinds use (`reference`, `model_reference`, `shares_target_embeddings`, `head`, `save_model`, `save_adapter`).

Stored files: a model is ``config.json`` + ``model.safetensors`` (without the embedding and LM head when they are the
target's), an adapter is peft's ``adapter_config.json`` + ``adapter_model.safetensors``, a restricted head is
``head_token_ids.json`` (a JSON list of ids). `hf_metasd.drafters.load` reads them back.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors.torch import save_file

from ..errors import InvalidPoolError, InvalidPoolTypeError
from .spec import ADAPTER_WEIGHTS_NAME, HEAD_TOKEN_IDS_NAME, WEIGHTS_NAME, drafter_label, is_local_reference

__all__ = ["ModelPlan", "SaveContext", "base_state_dict"]


def _tuner_prefixes(model: torch.nn.Module) -> list[str]:
    """State-dict prefixes of peft adapter parameters injected into `model` (empty without peft)."""
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:  # pragma: no cover
        return []
    prefixes = []
    for name, module in model.named_modules():
        if isinstance(module, BaseTunerLayer):
            for attr in (*module.adapter_layer_names, *module.other_param_names):
                prefixes.append(f"{name}.{attr}." if name else f"{attr}.")
    return prefixes


def _same_embeddings(model: torch.nn.Module, target: Any) -> bool:
    """Whether `model`'s input embedding and LM head weights are the target's (same tensors)."""
    if not isinstance(target, torch.nn.Module):
        return False
    mine_in, mine_out = model.get_input_embeddings(), model.get_output_embeddings()
    theirs_in, theirs_out = target.get_input_embeddings(), target.get_output_embeddings()
    if None in (mine_in, mine_out, theirs_in, theirs_out):
        return False
    return (
        mine_in.weight.data_ptr() == theirs_in.weight.data_ptr()
        and mine_out.weight.data_ptr() == theirs_out.weight.data_ptr()
    )


def base_state_dict(model: torch.nn.Module, *, drop_embeddings: bool) -> dict[str, torch.Tensor]:
    """The base model's own weights: peft adapter parameters left out, ``.base_layer.`` unwrapped, tied copies once.

    With `drop_embeddings`, the input embedding and LM head weights are left out too (they are the target's).

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16,
        ...                                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
        >>> sorted(k for k in base_state_dict(model, drop_embeddings=True) if "embed" in k or "lm_head" in k)
        []
    """
    prefixes = _tuner_prefixes(model)
    skip_ptrs = set()
    if drop_embeddings:
        skip_ptrs = {model.get_input_embeddings().weight.data_ptr(), model.get_output_embeddings().weight.data_ptr()}
    state, seen = {}, set()
    for key, tensor in model.state_dict().items():
        if any(key.startswith(p) for p in prefixes):
            continue
        ptr = tensor.data_ptr()
        if ptr in skip_ptrs or ptr in seen:  # shared with the target, or tied to a tensor already kept
            continue
        seen.add(ptr)
        state[key.replace(".base_layer.", ".")] = tensor.detach().contiguous()
    return state


def _write_base(model: torch.nn.Module, folder: Path, *, drop_embeddings: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(folder)
    save_file(
        base_state_dict(model, drop_embeddings=drop_embeddings), folder / WEIGHTS_NAME, metadata={"format": "pt"}
    )


def _write_adapter(peft_model: Any, adapter_name: str, folder: Path) -> None:
    from peft import get_peft_model_state_dict

    folder.mkdir(parents=True, exist_ok=True)
    peft_model.peft_config[adapter_name].save_pretrained(folder)
    state = get_peft_model_state_dict(peft_model, adapter_name=adapter_name)
    save_file(
        {k: v.detach().contiguous() for k, v in state.items()},
        folder / ADAPTER_WEIGHTS_NAME,
        metadata={"format": "pt"},
    )


def _write_head(head_token_ids: torch.Tensor, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(head_token_ids.tolist()), encoding="utf-8")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "drafter"


def absolute_if_local(path: str | None) -> str | None:
    """`path` as a reference records it: a local folder (`is_local_reference`; ``~`` expanded) as an absolute path,
    anything else (a Hub repo id, ``None``) as it is.

    A model loaded from ``./drafter`` has ``name_or_path`` ``"./drafter"``, relative to the working directory of that
    load: recorded so, the pool would point elsewhere from any other directory (``drafter`` would even read as a Hub
    repo id there). Absolute, it stays a local path outside the pool, which a load refuses unless the caller maps it
    with ``local_paths`` (`hf_metasd.untrusted`'s rule), and then it loads from any directory.

    Example:
        >>> absolute_if_local("HuggingFaceTB/SmolLM2-135M"), absolute_if_local(None)
        ('HuggingFaceTB/SmolLM2-135M', None)
        >>> import os; absolute_if_local("./drafter") == os.path.join(os.getcwd(), "drafter")
        True
    """
    if path is None or not is_local_reference(path):
        return path
    return os.path.abspath(os.path.expanduser(path))


class ModelPlan(NamedTuple):
    """How `SaveContext.model_reference` plans a drafter's model: the entry's `stored`, `path` and `revision`, the
    folder the entry's files go to, and whether the stored weights leave out the target's embeddings."""

    stored: bool
    path: str | None
    revision: str | None
    folder: str
    share_target_embeddings: bool


@dataclass
class SaveContext:
    """What planning one save threads through every pool entry (`Drafter.to_spec`); nothing is written while planning.

    Attributes:
        drafters: the pool's drafters, in order (for `where`).
        target: the pool's target model, or ``None`` (then embedding sharing is only kept for loaded drafters).
        store_weights: store weights inside the pool instead of references.
        for_hub: the save is a push: references to local folders are refused.
        writes: the scheduled writes, callables taking the pool root, run in order once the plan is complete.
        shared: things already planned that several entries share, by a key their kind chooses (e.g. the folder of
            a LoRA base that is stored once).
        position: index in `drafters` of the entry being planned (set by the pool; `where` looks there first).

    Example:
        >>> from hf_metasd.drafters import PromptLookupDrafter
        >>> drafter = PromptLookupDrafter()
        >>> ctx = SaveContext([drafter])
        >>> PromptLookupDrafter.to_spec([drafter], ctx).params
        {'max_matching_ngram_size': 2, 'num_output_tokens': None}
        >>> ctx.folder("corpus", "my corpus"), ctx.folder("corpus", "my corpus"), ctx.writes
        ('corpus/my_corpus', 'corpus/my_corpus_2', [])
    """

    drafters: Sequence[Any] = ()
    target: Any = None
    store_weights: bool = False
    for_hub: bool = False
    writes: list[Callable[[Path], None]] = field(default_factory=list)
    shared: dict[Hashable, Any] = field(default_factory=dict)
    position: int = 0
    _folders: set[str] = field(default_factory=set, repr=False)

    def where(self, drafter: Any) -> str:
        """``drafter 'name' (drafters[i])``: how messages name a drafter of the pool."""
        return drafter_label(drafter.name, drafter, self.drafters, self.position)

    def schedule(self, write: Callable[[Path], None]) -> None:
        """Run ``write(pool_root)`` when the pool is written (after every entry is planned and the config is valid)."""
        self.writes.append(write)

    def folder(self, prefix: str, name: str) -> str:
        """A folder ``<prefix>/<name>`` (name made file-safe) that no other entry of this save uses."""
        base = candidate = f"{prefix}/{_safe(name)}"
        k = 1
        while candidate in self._folders:
            k += 1
            candidate = f"{base}_{k}"
        self._folders.add(candidate)
        return candidate

    def reference(self, drafter: Any, where: str, default_path: str | None) -> tuple[bool, str | None, str | None]:
        """``(store, path, revision)``: keep a loaded drafter as it came, reference a known source, else refuse.

        Stored when `store_weights` or when the drafter was loaded stored; otherwise a reference to where it was
        loaded from (as its pool recorded it), or to `default_path` (e.g. the model's ``name_or_path``), made
        absolute when it is a local folder (`absolute_if_local`).
        """
        source = drafter.source or {}
        if self.store_weights or source.get("stored"):
            return True, None, None
        path = source.get("path") or absolute_if_local(default_path)
        if not path:
            raise InvalidPoolError(
                f"{where} must have a source (Hub repo id or folder) to be saved by reference, but it was built in "
                "memory. Save the pool with `store_weights=True` to store its weights inside the pool."
            )
        if self.for_hub and is_local_reference(path):
            raise InvalidPoolError(
                f"{where} must reference a Hub repo to be pushed, but references the local path {path!r}. Push with "
                "`store_weights=True`, or load the drafter from the Hub first."
            )
        return False, path, source.get("revision")

    def model_reference(self, drafter: Any, model: torch.nn.Module, *, share_embeddings: bool) -> ModelPlan:
        """Plan `model` (the drafter's causal LM) as `reference` does, in the folder ``drafters/<name>``.

        A reference points to the model's own ``name_or_path`` unless the drafter was loaded from elsewhere, with the
        commit it came from; a stored model is scheduled into the folder (without the target's embedding and LM head
        when `share_embeddings` allows it and they are the target's).
        """
        default = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", None) or None
        default = absolute_if_local(default)
        store, path, revision = self.reference(drafter, self.where(drafter), default)
        if revision is None and not store and path == default:
            revision = getattr(model.config, "_commit_hash", None)
        folder = self.folder("drafters", drafter.name)
        share = store and share_embeddings and self.shares_target_embeddings(model, drafter)
        if store:
            self.save_model(model, folder, drop_embeddings=share)
            path = folder
        return ModelPlan(store, path, revision, folder, share)

    def shares_target_embeddings(self, model: torch.nn.Module, drafter: Any) -> bool:
        """Whether `model` (the drafter's) uses the target's embedding and LM head, so that they are not stored."""
        loaded_shared = bool((drafter.source or {}).get("share_target_embeddings", False))
        # a drafter loaded with a cast copy of the target's embedding (other dtype) still shares it on disk
        return loaded_shared or _same_embeddings(model, self.target)

    def head(self, drafter: Any, folder: str) -> str | None:
        """Schedule the drafter's restricted head (``head_token_ids``) as ``<folder>/head_token_ids.json``; returns
        that path, or ``None`` for a drafter with a full head."""
        ids = getattr(drafter, "head_token_ids", None)
        if ids is None:
            return None
        relative = f"{folder}/{HEAD_TOKEN_IDS_NAME}"
        ids = ids.detach().cpu()
        self.schedule(lambda root: _write_head(ids, root / relative))
        return relative

    def save_model(self, model: torch.nn.Module, folder: str, *, drop_embeddings: bool) -> None:
        """Schedule `model`'s config and own weights into `folder` (see `base_state_dict`)."""
        self.schedule(lambda root: _write_base(model, root / folder, drop_embeddings=drop_embeddings))

    def save_adapter(self, peft_model: Any, adapter_name: str, folder: str) -> None:
        """Schedule one adapter of `peft_model` into `folder` (peft's files)."""
        self.schedule(lambda root: _write_adapter(peft_model, adapter_name, root / folder))

    def json_params(self, drafter: Any, params: dict[str, Any]) -> dict[str, Any]:
        """`params` if JSON can hold them, else `InvalidPoolError` naming the drafter."""
        try:
            json.dumps(params)
        except (TypeError, ValueError) as err:
            raise InvalidPoolTypeError(
                f"{self.where(drafter)} must have JSON-serialisable `config()` parameters to be saved, but has "
                f"{params!r}. Return plain values from `{type(drafter).__name__}.config()`."
            ) from err
        return params
