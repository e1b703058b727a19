"""Loading a drafter from a pool: the `LoadContext` every kind reads its entry through, and the readers it uses.

A drafter kind loads itself (`Drafter.from_spec`) through a `LoadContext`: the pool root, the target, the target's
tokenizer (when the load was given one), the Hub arguments, a cache of loaded bases shared across entries, and the
helpers to read an entry (`resolve`, `head_ids`, `dtype`, `load_base`, `load_model`, `load_tokenizer`, `reading`,
`build`). The files are the ones `hf_metasd.drafters.save` writes.

Reading is untrusted (`hf_metasd.untrusted`): no code runs (``trust_remote_code=False``, ``auto_map``
refused), weights come from safetensors only, a pool reads only its own files (a local folder outside it only when the
caller maps it with ``local_paths``), and whatever a library raises on a pool file becomes an `InvalidPoolError`; a
truncated or corrupt safetensors file raises one naming the drafter and the file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from huggingface_hub import snapshot_download
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from safetensors import SafetensorError
from safetensors.torch import load_file

from ..errors import DrafterCompatibilityError, InvalidPoolError, InvalidPoolTypeError, MetaSDConfigError
from ..untrusted import (
    PROBE_TEXT,
    check_adapter_numbers,
    check_no_remote_code,
    check_tokenizer_folder,
    read_json,
    reading_untrusted,
)
from .spec import (
    ADAPTER_WEIGHTS_NAME,
    DTYPES,
    MODEL_CONFIG_NAME,
    WEIGHTS_NAME,
    DrafterSpec,
    drafter_label,
    is_local_reference,
)
from .vocab import target_vocab_size, tokenizer_fingerprint

__all__ = ["LoadContext"]

#: what a drafter kind's `from_spec` builds (a `Drafter` subclass)
D = TypeVar("D")

_RESTORE = (
    "Restore the file (copy it again, or download it again with `force_download=True`), or re-save the pool from a "
    "working copy."
)


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
        raise InvalidPoolTypeError(
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
        return drafter_label(spec.name, spec, self.specs, self.position)

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
        corrupt safetensors file says so; anything else a library raises (`hf_metasd.untrusted.reading_untrusted`,
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
            raise InvalidPoolTypeError(
                f"{where} `params.share_target_embeddings` must be true or false, but is {share!r}. Fix it in "
                "config.json."
            )
        return share

    def load_tokenizer(self, relative: str, where: str, what: str, *, expected_hash: str | None = None) -> Any:
        """A tokenizer folder of the pool (or the caller's folder `local_paths` maps `relative` to), checked before it
        is read (`hf_metasd.untrusted.check_tokenizer_folder`), loaded with ``trust_remote_code=False``, then
        probed with a short encode / decode; with `expected_hash`, its `tokenizer_fingerprint` must be that one.
        Any failure is an `InvalidPoolError` naming the folder."""
        from transformers import AutoTokenizer

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
        check_adapter_numbers(folder, where)
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
        if not (folder / MODEL_CONFIG_NAME).is_file() or not weights.is_file():
            raise InvalidPoolError(
                f"{where} must find `{MODEL_CONFIG_NAME}` and `{WEIGHTS_NAME}` in {str(folder)!r}, but they are missing. "
                "Restore the folder, or re-save the pool with `store_weights=True`."
            )
        check_no_remote_code(folder, where)
        with self.reading(where, folder / MODEL_CONFIG_NAME):
            config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
        if check_vocab:
            with self.reading(where, folder / MODEL_CONFIG_NAME):
                _check_model_config(config, target, where, share=share)
        with self.reading(where, weights):
            state = load_file(weights)
        with self.reading(where, folder / MODEL_CONFIG_NAME), init_empty_weights(include_buffers=False):
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
        check_vocab: bool = True,
    ) -> torch.nn.Module:
        """The causal LM of an entry, on the target's device, in eval mode.

        Stored or embedding-sharing models are read with `load_base`; references with transformers'
        ``from_pretrained`` (the revision applies to a Hub id). `folder` is where the model is when the kind knows
        it (a LoRA base in a subfolder); otherwise it is `resolve`d from `spec`. `check_vocab`: the vocabulary must be
        the target's, checked before any weight is read (``False`` for a drafter with a tokenizer of its own).
        """
        if spec.stored or share:
            location = folder if folder is not None else self.resolve(spec, where, need_folder=True)
            return self.load_base(location, where, share=share, dtype=dtype, check_vocab=check_vocab)
        location = str(folder) if folder is not None else self.resolve(spec, where, need_folder=False)
        model = self.load_reference(
            spec, where, location, local=folder is not None, dtype=dtype, check_vocab=check_vocab
        )
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
            if not (Path(location) / MODEL_CONFIG_NAME).is_file():
                raise InvalidPoolError(
                    f"{where} must find its model in {location!r}, but it holds no `{MODEL_CONFIG_NAME}`. Fix `path` (and "
                    "`params.base` for a base in a subfolder), or re-save the pool with `store_weights=True`."
                )
            check_no_remote_code(location, where)
        revision = {"revision": spec.revision} if spec.revision and not local else {}
        config_file = os.path.join(location, MODEL_CONFIG_NAME)
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
