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

Reading is untrusted (`hf_metasd.pool.untrusted`): no code runs (``trust_remote_code=False``, ``auto_map`` refused),
weights come from safetensors only, a pool reads only its own files (a local folder outside it only when the caller
maps it with ``local_paths``), and whatever a library raises on a pool file becomes an `InvalidPoolError`.
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
from huggingface_hub.utils import validate_repo_id
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..drafters import target_vocab_size
from ..errors import DrafterCompatibilityError, InvalidPoolError, MetaSDConfigError
from .config import CONFIG_NAME, DrafterSpec
from .untrusted import PROBE_TEXT, check_no_remote_code, check_tokenizer_folder, read_json, reading_untrusted

if TYPE_CHECKING:
    from ..drafters import Drafter

D = TypeVar("D", bound="Drafter")

__all__ = [
    "ADAPTER_CONFIG_NAME",
    "ADAPTER_WEIGHTS_NAME",
    "DTYPES",
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
#: The dtypes a model entry's ``params.dtype`` may name (others, such as float8 ones, cannot run a drafter).
DTYPES = ("bfloat16", "float16", "float32", "float64")


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
    """Whether `path` is a local path (absolute, ``.``/``~``-relative, or existing) rather than a Hub repo id.

    A pool file may not make a load read such a path (`LoadContext.resolve`): the caller maps it with ``local_paths``.
    """
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
def _read_head(pool_root: Path | None, relative: str, where: str, vocab_size: int | None = None) -> list[int]:
    """The ids of a ``head_token_ids`` file: a JSON list of at most `vocab_size` ints."""
    path = None if pool_root is None else pool_root / relative
    if path is None or not path.is_file():
        raise InvalidPoolError(
            f"{where} must find its `head_token_ids` file {relative!r} in the pool folder, but it is missing. "
            "Restore the file, or drop `head_token_ids` from the drafter's `params`."
        )
    ids = read_json(path, f"{where} `head_token_ids`", "Write it as a JSON list of token ids, e.g. `[0, 1, 2]`.")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise InvalidPoolError(
            f"{where} `head_token_ids` file {str(path)!r} must hold a JSON list of token ids, but does not. "
            "Write it as e.g. `[0, 1, 2]`."
        )
    if vocab_size is not None and len(ids) > vocab_size:
        raise InvalidPoolError(
            f"{where} `head_token_ids` file {str(path)!r} must hold at most the target's vocabulary size {vocab_size} "
            f"ids, but holds {len(ids)}. Write each id the drafter may propose once."
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
        local_paths: the caller's map from a path `config.json` records (a drafter's `path`, a tokenizer folder) to
            a local folder read instead (``DrafterPool.from_pretrained(..., local_paths=)``). A mapped folder is the
            caller's: it may lie outside the pool, and its tokenizer patterns are not checked (no code runs either way).

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
    local_paths: dict[str, Path] = field(default_factory=dict)

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
        """Turn an error while reading `file` into an `InvalidPoolError` naming the drafter and the file: a truncated or
        corrupt safetensors file says so; anything else a library raises (`hf_metasd.pool.untrusted.reading_untrusted`,
        a Rust panic included) names its error."""
        try:
            with reading_untrusted(where, file, _RESTORE):
                yield
        except InvalidPoolError as err:
            cause = err.__cause__
            if isinstance(cause, SafetensorError):
                raise InvalidPoolError(
                    f"{where} must find a complete safetensors file at {str(file)!r}, but it is truncated or corrupt "
                    f"({cause}). {_RESTORE}"
                ) from cause
            raise

    def mapped(self, path: str | None) -> Path | None:
        """The caller's folder for `path` (a path `config.json` records) from `local_paths`, or ``None``."""
        return None if path is None else self.local_paths.get(path)

    def resolve(self, spec: DrafterSpec, where: str, *, need_folder: bool) -> str:
        """The local folder (or, when `need_folder` is false, the Hub repo id) holding the entry's weights.

        The caller's `local_paths` first; then a stored entry's folder inside the pool; then a Hub repo id. A
        reference to a local folder outside the pool (absolute, ``..``, ``~``, or a folder that exists relative to the
        current directory, which transformers would read instead of the Hub) is refused: only the caller may point a
        load at local files.
        """
        mapped = self.mapped(spec.path)
        if mapped is not None:
            if not mapped.exists():
                raise InvalidPoolError(
                    f"{where} must point to an existing folder or a Hub repo id, but {str(mapped)!r} does not exist. "
                    f"Fix `path` in config.json, or the folder `local_paths` maps {spec.path!r} to."
                )
            return str(mapped)
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
            raise InvalidPoolError(
                f"{where} `path` must be a Hub repo id or a folder stored in the pool, but is {path!r}, a local path "
                "outside the pool: a pool file may not make hf_metasd read local files. If you trust it, pass "
                f"`DrafterPool.from_pretrained(..., local_paths={{{path!r}: {path!r}}})` (any folder may be the "
                "value), or re-save the pool with `store_weights=True` so that it carries the weights."
            )
        try:
            validate_repo_id(path)
        except HFValidationError as err:
            raise InvalidPoolError(
                f'{where} `path` must be a Hub repo id (e.g. "org/model") or a folder stored in the pool, but is '
                f"{path!r}. Fix `path` in config.json."
            ) from err
        if not need_folder:
            return path
        return snapshot_download(path, revision=spec.revision, **self.hub)

    def head_ids(self, spec: DrafterSpec, where: str) -> list[int] | None:
        """The ids of ``params.head_token_ids`` (a JSON file in the pool, at most the target's vocabulary size long),
        or ``None`` when the entry has none."""
        relative = spec.params.get("head_token_ids")
        if relative is None:
            return None
        vocab = None if self.target is None else target_vocab_size(self.target)
        return _read_head(self.root, relative, where, vocab)

    def dtype(self, spec: DrafterSpec, where: str) -> torch.dtype:
        """``params.dtype`` of a model entry, one of `DTYPES` (default: the target's dtype)."""
        name = spec.params.get("dtype")
        if name is None:
            return self.target.dtype
        if name not in DTYPES:
            raise InvalidPoolError(
                f"{where} `params.dtype` must name a torch floating dtype, but is {name!r} (a drafter runs in one of "
                f'{list(DTYPES)}). Use e.g. "bfloat16".'
            )
        return getattr(torch, name)

    def share(self, spec: DrafterSpec, where: str) -> bool:
        """``params.share_target_embeddings`` of a model entry: true or false (default false)."""
        share = spec.params.get("share_target_embeddings", False)
        if not isinstance(share, bool):
            raise InvalidPoolError(
                f"{where} `params.share_target_embeddings` must be true or false, but is {share!r}. Fix it in "
                "config.json."
            )
        return share

    def load_tokenizer(self, relative: str, where: str, what: str, *, expected_hash: str | None = None) -> Any:
        """A tokenizer folder of the pool (or the caller's folder `local_paths` maps `relative` to), checked before it
        is read (`hf_metasd.pool.untrusted.check_tokenizer_folder`), loaded with ``trust_remote_code=False``, then
        probed with a short encode / decode; with `expected_hash`, its `tokenizer_fingerprint` must be that one.
        Any failure is an `InvalidPoolError` naming the folder."""
        from transformers import AutoTokenizer

        from ..drafters import tokenizer_fingerprint

        mapped = self.mapped(relative)
        folder = mapped if mapped is not None else (None if self.root is None else self.root / relative)
        if folder is None or not folder.is_dir():
            raise InvalidPoolError(
                f"{where} must find its {what} in the pool folder at {relative!r}, but it is missing. Restore the "
                "folder, or re-save the pool from a working copy of the drafter."
            )
        check_tokenizer_folder(folder, f"{where} {what}", vouched=mapped is not None)
        fix = "Restore the folder, or re-save the pool from a working copy of the drafter."
        with reading_untrusted(f"{where} {what}", folder, fix):
            tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
            tokenizer.decode(tokenizer.encode(PROBE_TEXT))
            found = None if expected_hash is None else tokenizer_fingerprint(tokenizer)
        if found != expected_hash:
            raise InvalidPoolError(
                f"{where} {what} in {str(folder)!r} must have the fingerprint the pool recorded ({expected_hash}), but "
                f"has {found}: the folder holds another tokenizer. Restore the folder, or re-save the pool from a "
                "working copy of the drafter."
            )
        return tokenizer

    def adapter_folder(self, folder: str | os.PathLike, where: str) -> None:
        """A local adapter folder must ask for no code and hold ``adapter_model.safetensors`` (a pickled
        ``adapter_model.bin`` is never read)."""
        check_no_remote_code(folder, where)
        if not (Path(folder) / ADAPTER_WEIGHTS_NAME).is_file():
            raise InvalidPoolError(
                f"{where} must find `{ADAPTER_WEIGHTS_NAME}` in {str(folder)!r}, but it is missing (a pool reads "
                "weights from safetensors files only, never pickles). Save the adapter with peft's "
                "`save_pretrained(..., safe_serialization=True)`, or restore the file."
            )

    def load_base(
        self,
        folder: str | os.PathLike,
        where: str,
        *,
        share: bool,
        dtype: torch.dtype | None = None,
        check_vocab: bool = True,
    ) -> torch.nn.Module:
        """A stored model: `config.json` + `model.safetensors` (without the embeddings when `share`).

        With `share`, the target's embedding and LM head are attached (shared; a cast copy when `dtype` differs from
        the target's, e.g. a bfloat16 drafter for a float32 target). The model is built on the meta device and takes
        the file's tensors, so a config that claims more weights than the file holds allocates nothing and is refused.
        `check_vocab`: the vocabulary must be the target's (``False`` for a drafter with its own tokenizer).
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
        check_no_remote_code(folder, where)
        with self.reading(where, folder / CONFIG_NAME):
            config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
        if check_vocab:
            with self.reading(where, folder / CONFIG_NAME):
                _check_model_config(config, target, where, share=share)
        with self.reading(where, weights):
            state = load_file(weights)
        with self.reading(where, folder / CONFIG_NAME), init_empty_weights(include_buffers=False):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
        if share:
            embedding, head = _target_embeddings(target, dtype)
            model.set_input_embeddings(embedding)
            model.get_output_embeddings().weight = head
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        with self.reading(where, weights):
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
        location = str(folder) if folder is not None else self.resolve(spec, where, need_folder=False)
        model = self.load_reference(spec, where, location, local=folder is not None, dtype=dtype)
        return model.to(self.target.device).eval()

    def load_reference(
        self,
        spec: DrafterSpec,
        where: str,
        location: str,
        *,
        local: bool = False,
        dtype: torch.dtype | None = None,
        check_vocab: bool = True,
    ) -> torch.nn.Module:
        """A model that is not stored in the pool (a Hub repo id, or a folder `resolve` found) through transformers'
        ``from_pretrained``: ``trust_remote_code=False``, safetensors only, a config without ``auto_map``, the revision
        for a Hub id. `check_vocab`: the vocabulary must be the target's, checked before any weight is read."""
        from transformers import AutoConfig, AutoModelForCausalLM

        local = local or spec.stored or self.mapped(spec.path) is not None or is_local_reference(location)
        if local:
            if not (Path(location) / CONFIG_NAME).is_file():
                raise InvalidPoolError(
                    f"{where} must find its model in {location!r}, but it holds no `{CONFIG_NAME}`. Fix `path` (and "
                    "`params.base` for a base in a subfolder), or re-save the pool with `store_weights=True`."
                )
            check_no_remote_code(location, where)
        revision = {"revision": spec.revision} if spec.revision and not local else {}
        config_file = os.path.join(location, CONFIG_NAME)
        with self.reading(where, config_file):
            config = AutoConfig.from_pretrained(location, trust_remote_code=False, **revision, **self.hub)
        if getattr(config, "auto_map", None):
            raise InvalidPoolError(
                f"{where} must not ask for code, but {config_file!r} has `auto_map` {config.auto_map!r}, which names "
                "Python files to run. hf_metasd loads with `trust_remote_code=False` and refuses such models. Use a "
                "drafter whose architecture transformers has built in, or build the pool in memory."
            )
        if check_vocab:
            with self.reading(where, config_file):
                _check_model_config(config, self.target, where, share=False)
        with self.reading(where, location):
            return AutoModelForCausalLM.from_pretrained(
                location,
                dtype=dtype or self.target.dtype,
                trust_remote_code=False,
                use_safetensors=True,
                **revision,
                **self.hub,
            )


def _index_of(item: Any, items: Sequence[Any], start: int) -> int | None:
    """Position of `item` (by identity) in `items`, looking from `start` first (an object may appear twice)."""
    for i in (*range(start, len(items)), *range(start)):
        if items[i] is item:
            return i
    return None
