"""Weight I/O of a pool: what a stored drafter writes, how it is read back, and the two contexts the kinds use.

A drafter kind saves and loads itself (`Drafter.to_spec` / `Drafter.from_spec`) through these contexts, so that the
pool's own code never names a kind:

* `SaveContext`: what planning a save threads through every entry: `store_weights`, `for_hub`, the pool's target,
  the scheduled writes (callables taking the pool root, run only once the whole pool is planned and valid), unique
  folder names, a registry of shared things already planned (a LoRA base stored once for several entries), and
  helpers several kinds use (`reference`, `model_reference`, `shares_target_embeddings`, `head`, `save_model`,
  `save_adapter`).
* `LoadContext`: the pool root, the target, the target's tokenizer (when the load was given one), the Hub arguments,
  a cache of loaded bases shared across entries, and the helpers to read an entry (`resolve`, `head_ids`, `dtype`,
  `load_base`, `load_model`, `reading`, `build`).

Stored files: a model is ``config.json`` + ``model.safetensors`` (without the embedding and LM head when they are the
target's), an adapter is peft's ``adapter_config.json`` + ``adapter_model.safetensors``, a restricted head is
``head_token_ids.json`` (a JSON list of ids). A truncated or corrupt safetensors file raises `InvalidPoolError`
naming the drafter and the file.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import torch
from huggingface_hub import snapshot_download
from huggingface_hub.errors import HFValidationError
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..drafters import target_vocab_size
from ..errors import DrafterCompatibilityError, InvalidPoolError, MetaSDConfigError
from .config import CONFIG_NAME, DrafterSpec

if TYPE_CHECKING:
    from ..drafters import Drafter

D = TypeVar("D", bound="Drafter")

__all__ = [
    "ADAPTER_CONFIG_NAME",
    "ADAPTER_WEIGHTS_NAME",
    "HEAD_TOKEN_IDS_NAME",
    "WEIGHTS_NAME",
    "LoadContext",
    "ModelPlan",
    "SaveContext",
    "base_state_dict",
    "is_local_reference",
]

WEIGHTS_NAME = "model.safetensors"
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
ADAPTER_CONFIG_NAME = "adapter_config.json"
HEAD_TOKEN_IDS_NAME = "head_token_ids.json"
_RESTORE = (
    "Restore the file (copy it again, or download it again with `force_download=True`), or re-save the pool from a "
    "working copy."
)


# ======================================================================================================================
# writing
# ======================================================================================================================
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


def is_local_reference(path: str) -> bool:
    """Whether `path` is a local path (absolute, ``.``/``~``-relative, or existing) rather than a Hub repo id."""
    return os.path.isabs(path) or path.startswith((".", "~")) or Path(path).expanduser().exists()


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

    drafters: Sequence[Drafter] = ()
    target: Any = None
    store_weights: bool = False
    for_hub: bool = False
    writes: list[Callable[[Path], None]] = field(default_factory=list)
    shared: dict[Hashable, Any] = field(default_factory=dict)
    position: int = 0
    _folders: set[str] = field(default_factory=set, repr=False)

    def where(self, drafter: Drafter) -> str:
        """``drafter 'name' (drafters[i])``: how messages name a drafter of the pool."""
        index = _index_of(drafter, self.drafters, self.position)
        return f"drafter {drafter.name!r}" + ("" if index is None else f" (drafters[{index}])")

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

    def reference(self, drafter: Drafter, where: str, default_path: str | None) -> tuple[bool, str | None, str | None]:
        """``(store, path, revision)``: keep a loaded drafter as it came, reference a known source, else refuse.

        Stored when `store_weights` or when the drafter was loaded stored; otherwise a reference to where it was
        loaded from, or to `default_path` (e.g. the model's ``name_or_path``).
        """
        source = drafter.source or {}
        if self.store_weights or source.get("stored"):
            return True, None, None
        path = source.get("path") or default_path
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

    def model_reference(self, drafter: Drafter, model: torch.nn.Module, *, share_embeddings: bool) -> ModelPlan:
        """Plan `model` (the drafter's causal LM) as `reference` does, in the folder ``drafters/<name>``.

        A reference points to the model's own ``name_or_path`` unless the drafter was loaded from elsewhere, with the
        commit it came from; a stored model is scheduled into the folder (without the target's embedding and LM head
        when `share_embeddings` allows it and they are the target's).
        """
        default = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", None) or None
        store, path, revision = self.reference(drafter, self.where(drafter), default)
        if revision is None and not store and path == default:
            revision = getattr(model.config, "_commit_hash", None)
        folder = self.folder("drafters", drafter.name)
        share = store and share_embeddings and self.shares_target_embeddings(model, drafter)
        if store:
            self.save_model(model, folder, drop_embeddings=share)
            path = folder
        return ModelPlan(store, path, revision, folder, share)

    def shares_target_embeddings(self, model: torch.nn.Module, drafter: Drafter) -> bool:
        """Whether `model` (the drafter's) uses the target's embedding and LM head, so that they are not stored."""
        loaded_shared = bool((drafter.source or {}).get("share_target_embeddings", False))
        # a drafter loaded with a cast copy of the target's embedding (other dtype) still shares it on disk
        return loaded_shared or _same_embeddings(model, self.target)

    def head(self, drafter: Drafter, folder: str) -> str | None:
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

    def json_params(self, drafter: Drafter, params: dict[str, Any]) -> dict[str, Any]:
        """`params` if JSON can hold them, else `InvalidPoolError` naming the drafter."""
        try:
            json.dumps(params)
        except (TypeError, ValueError) as err:
            raise InvalidPoolError(
                f"{self.where(drafter)} must have JSON-serialisable `config()` parameters to be saved, but has "
                f"{params!r}. Return plain values from `{type(drafter).__name__}.config()`."
            ) from err
        return params


# ======================================================================================================================
# reading
# ======================================================================================================================
def _read_head(pool_root: Path | None, relative: str, where: str) -> list[int]:
    path = None if pool_root is None else pool_root / relative
    if path is None or not path.is_file():
        raise InvalidPoolError(
            f"{where} must find its `head_token_ids` file {relative!r} in the pool folder, but it is missing. "
            "Restore the file, or drop `head_token_ids` from the drafter's `params`."
        )
    try:
        ids = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise InvalidPoolError(
            f"{where} `head_token_ids` file {str(path)!r} must be valid JSON, but is not ({err})."
        ) from err
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise InvalidPoolError(
            f"{where} `head_token_ids` file {str(path)!r} must hold a JSON list of token ids, but does not. "
            "Write it as e.g. `[0, 1, 2]`."
        )
    return ids


def _check_model_config(config: Any, target: Any, where: str, *, share: bool) -> None:
    """Vocabulary (and, for shared embeddings, width) must match the target's: checked before reading weights."""
    theirs = target_vocab_size(target)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if int(text.vocab_size) != theirs:
        raise DrafterCompatibilityError(
            f"{where} must have the target's vocabulary size {theirs}, but has {text.vocab_size}. Load the pool with "
            "the target it was saved for (config.json `target`), or remove this drafter."
        )
    target_width = target.config.get_text_config().hidden_size
    if share and int(text.hidden_size) != int(target_width):
        raise DrafterCompatibilityError(
            f"{where} must have the target's hidden size {target_width} to share its embeddings, but has "
            f"{text.hidden_size}. Load the pool with the target it was saved for."
        )


def _target_embeddings(target: Any, dtype: torch.dtype) -> tuple[torch.nn.Module, torch.nn.Parameter]:
    """The target's embedding and LM-head weight, shared when `dtype` matches, else cast copies (never saved)."""
    embedding, head = target.get_input_embeddings(), target.get_output_embeddings().weight
    if embedding.weight.dtype == dtype:
        return embedding, head
    cast = torch.nn.Embedding.from_pretrained(
        embedding.weight.detach().to(dtype), freeze=True, padding_idx=embedding.padding_idx
    )
    tied = head is embedding.weight
    return cast, cast.weight if tied else torch.nn.Parameter(head.detach().to(dtype), requires_grad=False)


@dataclass
class LoadContext:
    """What reading one pool gives every entry (`Drafter.from_spec`).

    Attributes:
        root: the pool folder (stored entries are read below it), or ``None`` for a config without a folder.
        target: the target model the drafters are built for.
        hub: Hub keyword arguments for referenced drafters (``token``, ``cache_dir``).
        specs: the config's entries, in order (for `where`).
        bases: models loaded so far that later entries may share, by a key their kind chooses (e.g. one LoRA base
            for several entries).
        position: index in `specs` of the entry being loaded (set by the pool; `where` looks there first).
        tokenizer: the target's tokenizer the pool is loaded with (``DrafterPool.from_pretrained(...,
            tokenizer=)``), or ``None``; a kind that drafts with a tokenizer of its own reads the target's here.

    Example:
        >>> spec = DrafterSpec("prompt_lookup", "pl")
        >>> ctx = LoadContext(specs=[spec])
        >>> ctx.where(spec), ctx.head_ids(spec, ctx.where(spec))
        ("drafter 'pl' (drafters[0])", None)
    """

    root: Path | None = None
    target: Any = None
    hub: dict[str, Any] = field(default_factory=dict)
    specs: Sequence[DrafterSpec] = ()
    bases: dict[Hashable, Any] = field(default_factory=dict)
    position: int = 0
    tokenizer: Any = None

    def where(self, spec: DrafterSpec) -> str:
        """``drafter 'name' (drafters[i])``: how messages name an entry of the config."""
        index = _index_of(spec, self.specs, self.position)
        return f"drafter {spec.name!r}" + ("" if index is None else f" (drafters[{index}])")

    def source(self, spec: DrafterSpec, **extra: Any) -> dict[str, Any]:
        """What a drafter built from `spec` remembers as its `Drafter.source` (plus kind-specific `extra`)."""
        return {"stored": spec.stored, "path": spec.path, "revision": spec.revision, **extra}

    def bad_params(self, spec: DrafterSpec, cls: type, err: Exception) -> InvalidPoolError:
        """The error for `params` that the kind's constructor refused with `err`."""
        return InvalidPoolError(
            f"{self.where(spec)} must have `params` that `{cls.__name__}` accepts, but {spec.params!r} fails: {err} "
            "Fix `params` in config.json."
        )

    def build(self, spec: DrafterSpec, cls: type[D], construct: Callable[[], D]) -> D:
        """``construct()``, the drafter of `spec`, with its `Drafter.source` set from `spec`.

        A `TypeError` or `ValueError` of the constructor becomes `bad_params` (an `InvalidPoolError` naming the
        entry); hf_metasd's own errors (`MetaSDConfigError`, such as `DrafterCompatibilityError`, and
        `InvalidPoolError`) pass through as they are.
        """
        try:
            drafter = construct()
        except (MetaSDConfigError, InvalidPoolError):
            raise
        except (TypeError, ValueError) as err:
            raise self.bad_params(spec, cls, err) from err
        drafter.source = self.source(spec)
        return drafter

    @contextmanager
    def reading(self, where: str, file: str | os.PathLike) -> Iterator[None]:
        """Turn a safetensors error while reading `file` into an `InvalidPoolError` naming the drafter and the file."""
        try:
            yield
        except SafetensorError as err:
            raise InvalidPoolError(
                f"{where} must find a complete safetensors file at {str(file)!r}, but it is truncated or corrupt "
                f"({err}). {_RESTORE}"
            ) from err

    def resolve(self, spec: DrafterSpec, where: str, *, need_folder: bool) -> str:
        """The local folder (or, when `need_folder` is false, the Hub repo id) holding the entry's weights."""
        if spec.stored:
            folder = None if self.root is None else self.root / (spec.path or "")
            if folder is None or not folder.exists():
                raise InvalidPoolError(
                    f"{where} must be stored in the pool at {spec.path!r}, but that folder is missing"
                    f"{'' if self.root is None else f' from {str(self.root)!r}'}. Restore it, or re-save the pool."
                )
            return str(folder)
        path = str(spec.path)
        if is_local_reference(path):
            local = Path(path).expanduser()
            if not local.exists():
                raise InvalidPoolError(
                    f"{where} must point to an existing folder or a Hub repo id, but {path!r} does not exist. Fix "
                    "`path` in config.json, or save the pool with `store_weights=True` so that it carries the weights."
                )
            return str(local)
        if not need_folder:
            return path
        try:
            return snapshot_download(path, revision=spec.revision, **self.hub)
        except HFValidationError as err:
            raise InvalidPoolError(
                f"{where} must point to an existing folder or a Hub repo id, but {path!r} is neither. Fix `path`."
            ) from err

    def head_ids(self, spec: DrafterSpec, where: str) -> list[int] | None:
        """The ids of ``params.head_token_ids`` (a JSON file in the pool), or ``None`` when the entry has none."""
        relative = spec.params.get("head_token_ids")
        return None if relative is None else _read_head(self.root, relative, where)

    def dtype(self, spec: DrafterSpec, where: str) -> torch.dtype:
        """``params.dtype`` of a model entry (default: the target's dtype)."""
        name = spec.params.get("dtype")
        if name is None:
            return self.target.dtype
        dtype = getattr(torch, str(name), None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise InvalidPoolError(
                f'{where} `params.dtype` must name a torch floating dtype, but is {name!r}. Use e.g. "bfloat16".'
            )
        return dtype

    def load_base(
        self, folder: str | os.PathLike, where: str, *, share: bool, dtype: torch.dtype | None = None
    ) -> torch.nn.Module:
        """A stored model: `config.json` + `model.safetensors` (without the embeddings when `share`).

        With `share`, the target's embedding and LM head are attached (shared; a cast copy when `dtype` differs from
        the target's, e.g. a bfloat16 drafter for a float32 target).
        """
        from accelerate import init_empty_weights
        from transformers import AutoConfig, AutoModelForCausalLM

        target, folder = self.target, Path(folder)
        dtype = dtype or target.dtype
        weights = folder / WEIGHTS_NAME
        if not (folder / CONFIG_NAME).is_file() or not weights.is_file():
            raise InvalidPoolError(
                f"{where} must find `{CONFIG_NAME}` and `{WEIGHTS_NAME}` in {str(folder)!r}, but they are missing. "
                "Restore the folder, or re-save the pool with `store_weights=True`."
            )
        config = AutoConfig.from_pretrained(folder)
        _check_model_config(config, target, where, share=share)
        with self.reading(where, weights):
            state = load_file(weights)
        with init_empty_weights(include_buffers=False):
            model = AutoModelForCausalLM.from_config(config)
        if share:
            embedding, head = _target_embeddings(target, dtype)
            model.set_input_embeddings(embedding)
            model.get_output_embeddings().weight = head
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        _, unexpected = model.load_state_dict(state, strict=False, assign=True)
        if not share and getattr(config, "tie_word_embeddings", False):
            model.tie_weights()
        missing = [n for n, p in (*model.named_parameters(), *model.named_buffers()) if p.is_meta]
        if missing or unexpected:
            raise InvalidPoolError(
                f"{where} must find every weight of its model in {str(weights)!r}, but misses {missing[:4]} and has "
                f"unexpected {unexpected[:4]}. Re-save the pool with `store_weights=True`."
            )
        return model.to(device=target.device, dtype=dtype).eval()

    def load_model(
        self,
        spec: DrafterSpec,
        where: str,
        *,
        folder: str | os.PathLike | None = None,
        share: bool = False,
        dtype: torch.dtype | None = None,
    ) -> torch.nn.Module:
        """The causal LM of an entry, on the target's device, in eval mode.

        Stored or embedding-sharing models are read with `load_base`; references with transformers'
        ``from_pretrained`` (the revision applies to a Hub id). `folder` is where the model is when the kind knows
        it (a LoRA base in a subfolder); otherwise it is `resolve`d from `spec`. The vocabulary is checked against
        the target's before any weight is read.
        """
        if spec.stored or share:
            location = folder if folder is not None else self.resolve(spec, where, need_folder=True)
            return self.load_base(location, where, share=share, dtype=dtype)
        from transformers import AutoConfig, AutoModelForCausalLM

        location = str(folder) if folder is not None else self.resolve(spec, where, need_folder=False)
        local = folder is not None or is_local_reference(location)
        if local and not (Path(location) / CONFIG_NAME).is_file():
            raise InvalidPoolError(
                f"{where} must find its model in {location!r}, but it holds no `{CONFIG_NAME}`. Fix `path` (and "
                "`params.base` for a base in a subfolder), or re-save the pool with `store_weights=True`."
            )
        revision = {"revision": spec.revision} if spec.revision and not local else {}
        _check_model_config(
            AutoConfig.from_pretrained(location, **revision, **self.hub), self.target, where, share=False
        )
        with self.reading(where, location):
            model = AutoModelForCausalLM.from_pretrained(
                location, dtype=dtype or self.target.dtype, **revision, **self.hub
            )
        return model.to(self.target.device).eval()


def _index_of(item: Any, items: Sequence[Any], start: int) -> int | None:
    """Position of `item` (by identity) in `items`, looking from `start` first (an object may appear twice)."""
    for i in (*range(start, len(items)), *range(start)):
        if items[i] is item:
            return i
    return None
