"""Drafter pools as Hub artefacts: `DrafterPoolConfig` (the versioned `config.json`) and `DrafterPool`.

A pool is the ordered drafters plus the defaults of a MetaSD call (policy, reward, draft length). It is saved, loaded
and pushed the way huggingface_hub's `ModelHubMixin` integrations are (`_save_pretrained` / `_from_pretrained`; a push
is one commit holding `config.json`, the `README.md` model card and any weights the pool stores itself), and it can be
passed straight to generation::

    pool = DrafterPool.from_pretrained("me/smollm2-drafters", target=target)
    target.generate(**inputs, custom_generate=hf_metasd.generate, assistant_models=pool)

A `DrafterPool` given as ``assistant_models=`` brings its policy, reward and `num_assistant_tokens` as defaults;
explicit ``meta_policy=`` / ``meta_reward=`` / ``num_assistant_tokens=`` arguments still win. We pass the pool object
itself (rather than unpacking it) so that one object carries everything a pool's author tuned.

What is stored where (`config.json`, one entry per drafter, see `DrafterSpec`):

* model-free drafters (``prompt_lookup``) and ``early_exit`` drafters (the target's own layers): their parameters only;
* ``assistant_model`` and ``lora`` drafters: by default a *reference* (a Hub repo id or local path, plus a revision);
  with ``save_pretrained(..., store_weights=True)`` their weights are written inside the pool folder instead
  (``drafters/<name>/``, ``lora/<name>/base/`` + ``lora/<name>/adapters/<adapter>/``). A drafter whose embedding and LM
  head are the target's (``share_target_embeddings``) is stored without them and re-attached to the target's modules
  on load, so a small trained drafter base with several adapters takes a few MB;
* restricted heads (``head_token_ids``) are always stored in the pool as a JSON list of ids.

Example `config.json` for a folder produced by ``recipes/train_drafters.py`` (``base/``, ``adapters/<task>/``,
``head_token_ids.json``), which `DrafterPool.from_pretrained(folder, target=target)` then loads::

    {"drafters": [{"adapters": ["code", "qa"], "kind": "lora", "name": "smollm2-drafters",
                   "params": {"adapters_dir": "adapters", "base": "base", "head_token_ids": "head_token_ids.json",
                              "share_target_embeddings": true},
                   "path": ".", "revision": null, "stored": true},
                  {"adapters": null, "kind": "prompt_lookup", "name": "prompt_lookup",
                   "params": {"max_matching_ngram_size": 2, "num_output_tokens": null},
                   "path": null, "revision": null, "stored": false}],
     "format_version": 1, "hf_metasd_version": "0.1.0", "num_assistant_tokens": 4, "policy": "ucb",
     "policy_kwargs": {}, "reward": "bd", "target": "HuggingFaceTB/SmolLM2-135M-Instruct"}
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import HfApi, ModelCard, ModelCardData, ModelHubMixin, snapshot_download
from huggingface_hub.errors import HFValidationError
from safetensors.torch import load_file, save_file

from . import __version__
from .candidate_generator import DEFAULT_NUM_ASSISTANT_TOKENS
from .drafters import (
    DRAFTER_KINDS,
    Drafter,
    EarlyExitDrafter,
    LoraDrafter,
    ModelDrafter,
    as_drafters,
    target_vocab_size,
)
from .errors import DrafterCompatibilityError, InvalidPoolError, MetaSDConfigError
from .policies import get_policy
from .rewards import REWARDS, get_reward

__all__ = ["FORMAT_VERSION", "DrafterPool", "DrafterPoolConfig", "DrafterSpec"]

#: Version of the `config.json` layout. Bump it when a field changes meaning; new optional fields do not need it.
FORMAT_VERSION = 1
CONFIG_NAME = "config.json"
MODEL_CARD_NAME = "README.md"
WEIGHTS_NAME = "model.safetensors"
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
ADAPTER_CONFIG_NAME = "adapter_config.json"
HEAD_TOKEN_IDS_NAME = "head_token_ids.json"
MODEL_KINDS = ("assistant_model", "lora")
TAGS = ["hf_metasd", "metasd", "speculative-decoding"]


# ======================================================================================================================
# config.json
# ======================================================================================================================
@dataclass
class DrafterSpec:
    """One entry of a pool's `config.json`: how to rebuild one drafter (a ``lora`` entry: one arm per adapter).

    Attributes:
        kind: a registered drafter kind (``"assistant_model"``, ``"lora"``, ``"prompt_lookup"``, ``"early_exit"``, ...).
        name: the drafter's label (a ``lora`` entry's arms are named after their adapters).
        path: where the weights are: a Hub repo id or a local folder (a reference), or, when `stored`, a folder
            relative to the pool. ``None`` for kinds without weights. For ``early_exit``: the adapter, if any.
        revision: Hub revision of a reference (a commit hash pins it).
        stored: the weights live inside the pool folder, at `path`.
        adapters: ``lora`` only: the adapter names, one arm each, in arm order; adapter ``a`` is read from
            ``<path>/<params["adapters_dir"]>/a``.
        params: kind parameters. ``lora``: ``base`` (subfolder of `path` holding the base model, ``""`` for `path`
            itself), ``adapters_dir``, ``share_target_embeddings`` and ``head_token_ids``; ``assistant_model``:
            ``share_target_embeddings`` and ``head_token_ids``; ``early_exit``: ``num_layers`` and ``head_token_ids``;
            model-free kinds: their constructor's keyword arguments. ``head_token_ids`` is a JSON file of token ids
            relative to the pool folder. ``share_target_embeddings``: the stored base has no embedding / LM head
            weights and uses the target's modules.
    """

    kind: str
    name: str
    path: str | None = None
    revision: str | None = None
    stored: bool = False
    adapters: list[str] | None = None
    params: dict[str, Any] = field(default_factory=dict)


_TOP_TYPES: dict[str, tuple[type, ...]] = {
    "drafters": (list,),
    "target": (str, type(None)),
    "policy": (str,),
    "policy_kwargs": (dict,),
    "reward": (str,),
    "num_assistant_tokens": (int,),
    "hf_metasd_version": (str,),
    "format_version": (int,),
}
_SPEC_TYPES: dict[str, tuple[type, ...]] = {
    "kind": (str,),
    "name": (str,),
    "path": (str, type(None)),
    "revision": (str, type(None)),
    "stored": (bool,),
    "adapters": (list, type(None)),
    "params": (dict,),
}


@dataclass
class DrafterPoolConfig:
    """A pool's `config.json`: saved as sorted, indented JSON; validated before any save or load.

    Attributes:
        drafters: the entries, in arm order.
        target: Hub id (or path) of the target model the pool drafts for (the model card's ``base_model``).
        policy, policy_kwargs: a registered policy name and its settings (`hf_metasd.policies.get_policy`).
        reward: ``"bd"`` or ``"be"``.
        num_assistant_tokens: tokens drafted per round.
        hf_metasd_version: version of hf_metasd that wrote the file.
        format_version: layout version (`FORMAT_VERSION`).

    A file written by a newer hf_metasd may hold keys this version does not know: they are ignored with **one**
    warning naming them all.
    """

    drafters: list[DrafterSpec] = field(default_factory=list)
    target: str | None = None
    policy: str = "ucb"
    policy_kwargs: dict[str, Any] = field(default_factory=dict)
    reward: str = "bd"
    num_assistant_tokens: int = DEFAULT_NUM_ASSISTANT_TOKENS
    hf_metasd_version: str = __version__
    format_version: int = FORMAT_VERSION

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Raise `InvalidPoolError` if this config cannot make a working pool (nothing is read or downloaded)."""
        _validate_defaults(self.policy, self.policy_kwargs, self.reward, self.num_assistant_tokens)
        if not self.drafters:
            raise InvalidPoolError(
                "pool `drafters` must hold at least one drafter, but is empty. Add a drafter, e.g. "
                "`DrafterPool([PromptLookupDrafter()])`."
            )
        for i, spec in enumerate(self.drafters):
            where = f"drafter {spec.name!r} (drafters[{i}])"
            if spec.kind not in DRAFTER_KINDS:
                raise InvalidPoolError(
                    f"{where} must be of a registered kind {sorted(DRAFTER_KINDS)}, but its kind is {spec.kind!r}. "
                    "Register the kind with `hf_metasd.drafters.register_drafter_kind` before loading, or fix `kind`."
                )
            if spec.kind in MODEL_KINDS and not spec.path:
                raise InvalidPoolError(
                    f"{where} must have a `path` (a Hub repo id, a folder, or a folder inside the pool), but has none. "
                    "Set `path`, or save the pool with `store_weights=True`."
                )
            relative = {"params.head_token_ids": spec.params.get("head_token_ids")}
            if spec.stored:
                relative["path"] = spec.path
            if spec.kind == "lora":
                relative.update(
                    {"params.base": spec.params.get("base"), "params.adapters_dir": spec.params.get("adapters_dir")}
                )
                relative.update({f"adapters[{j}]": a for j, a in enumerate(spec.adapters or []) if isinstance(a, str)})
            for key, value in relative.items():
                _check_inside(value, f"{where} `{key}`", single=key.startswith("adapters["))
            if spec.kind == "lora":
                if not spec.adapters or not all(isinstance(a, str) and a for a in spec.adapters):
                    raise InvalidPoolError(
                        f"{where} must list its adapters in `adapters` (non-empty names), but has {spec.adapters!r}. "
                        'List the adapter folders to load, e.g. `adapters: ["code"]`.'
                    )
            elif spec.adapters is not None:
                raise InvalidPoolError(
                    f"{where} must not have `adapters` (only `lora` drafters do), but has {spec.adapters!r}. "
                    'Drop `adapters`, or use kind "lora".'
                )

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json_string(self) -> str:
        """Sorted, indented JSON (stable diffs on the Hub)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def save(self, directory: str | os.PathLike) -> Path:
        """Validate, then write `config.json` into `directory`; returns the file's path."""
        self.validate()
        path = Path(directory) / CONFIG_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json_string(), encoding="utf-8")
        return path

    @classmethod
    def from_dict(cls, data: Any, *, source: str = CONFIG_NAME) -> DrafterPoolConfig:
        """Build a config from parsed JSON; unknown keys are ignored with one warning, bad types raise."""
        if not isinstance(data, dict):
            raise InvalidPoolError(
                f"{source} must hold a JSON object, but holds {type(data).__name__}. Re-save the pool with "
                "`DrafterPool.save_pretrained`."
            )
        unknown = [k for k in data if k not in _TOP_TYPES]
        kwargs = {k: _typed(data[k], _TOP_TYPES[k], k, source) for k in _TOP_TYPES if k in data}
        specs = []
        for i, entry in enumerate(kwargs.get("drafters", [])):
            where = f"drafters[{i}]"
            if not isinstance(entry, dict):
                raise InvalidPoolError(
                    f"{source} `{where}` must be a JSON object, but is {type(entry).__name__}. Fix the entry."
                )
            for key in ("kind", "name"):
                if key not in entry:
                    raise InvalidPoolError(
                        f"{source} `{where}` must have `{key}`, but has only {sorted(entry)}. Add `{key}`."
                    )
            unknown += [f"{where}.{k}" for k in entry if k not in _SPEC_TYPES]
            specs.append(
                DrafterSpec(
                    **{k: _typed(entry[k], _SPEC_TYPES[k], f"{where}.{k}", source) for k in _SPEC_TYPES if k in entry}
                )
            )
        kwargs["drafters"] = specs
        config = cls(**kwargs)
        newer = config.format_version > FORMAT_VERSION
        if unknown or newer:
            what = f"keys this version does not know, ignored: {unknown}" if unknown else "no unknown keys"
            warnings.warn(
                f"{source} was written by hf_metasd {config.hf_metasd_version} (format {config.format_version}); "
                f"this is hf_metasd {__version__} (format {FORMAT_VERSION}), and it has {what}. Upgrade hf_metasd "
                "to use them.",
                UserWarning,
                stacklevel=2,
            )
        return config

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> DrafterPoolConfig:
        path = Path(path)
        if not path.is_file():
            raise InvalidPoolError(
                f"a pool folder must hold `{CONFIG_NAME}`, but {str(path.parent)!r} has none. Point to a folder "
                "written by `DrafterPool.save_pretrained`, or write its config with `DrafterPoolConfig.save`."
            )
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise InvalidPoolError(
                f"{str(path)!r} must be valid JSON, but is not ({err}). Restore the file, or re-save the pool with "
                "`DrafterPool.save_pretrained`."
            ) from err
        return cls.from_dict(data, source=str(path))


def _check_inside(value: Any, where: str, *, single: bool = False) -> None:
    """Paths inside a pool must stay inside it: relative, no `..` (a Hub config is untrusted input)."""
    if value is None:
        return
    parts = Path(value).parts if isinstance(value, str) else None
    if (
        parts is None
        or Path(value).is_absolute()
        or ".." in parts
        or "\\" in value
        or (single and (len(parts) != 1 or value in (".", "")))
    ):
        raise InvalidPoolError(
            f"{where} must be a relative path inside the pool folder{' (one folder name)' if single else ''}, but is "
            f'{value!r}. Use e.g. "adapters"; reference outside weights with a non-stored `path` instead.'
        )


def _typed(value: Any, types: tuple[type, ...], key: str, source: str) -> Any:
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
        raise InvalidPoolError(
            f"{source} `{key}` must be {names}, but is {value!r}. Fix the value, or re-save the pool with "
            "`DrafterPool.save_pretrained`."
        )
    return value


def _validate_defaults(policy: Any, policy_kwargs: Any, reward: Any, num_assistant_tokens: Any) -> None:
    if not isinstance(policy, str):
        raise InvalidPoolError(
            f"pool `policy` must be a registered policy name (instances cannot be saved), but is "
            f'{type(policy).__name__}. Pass the name, e.g. "ucb", or give the instance as `meta_policy=` to generate.'
        )
    try:
        json.dumps(policy_kwargs or {})
    except (TypeError, ValueError) as err:
        raise InvalidPoolError(
            f"pool `policy_kwargs` must be JSON-serialisable to be saved, but is {policy_kwargs!r}. Use plain numbers, "
            "strings and lists."
        ) from err
    try:
        get_policy(policy, **(policy_kwargs or {}))
    except (MetaSDConfigError, ValueError, TypeError) as err:
        raise InvalidPoolError(f"pool policy {policy!r} with {policy_kwargs or {}} is invalid: {err}") from err
    if not isinstance(reward, str):
        raise InvalidPoolError(
            f"pool `reward` must be a reward name in {sorted(REWARDS)} (callables cannot be saved), but is "
            f"{type(reward).__name__}. Use a name, or pass the callable as `meta_reward=` to generate."
        )
    try:
        get_reward(reward)
    except MetaSDConfigError as err:
        raise InvalidPoolError(f"pool reward {reward!r} is invalid: {err}") from err
    if not isinstance(num_assistant_tokens, int) or isinstance(num_assistant_tokens, bool) or num_assistant_tokens < 1:
        raise InvalidPoolError(
            f"pool `num_assistant_tokens` must be an int >= 1, but is {num_assistant_tokens!r}. "
            f"Use e.g. {DEFAULT_NUM_ASSISTANT_TOKENS}."
        )


# ======================================================================================================================
# weights: what a stored drafter writes, how it is read back
# ======================================================================================================================
#: drafter -> where the pool loader found it; lets `save_pretrained` write a loaded drafter back as it came.
_ORIGINS: weakref.WeakKeyDictionary[Drafter, dict[str, Any]] = weakref.WeakKeyDictionary()


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


def _shares_target_embeddings(model: torch.nn.Module, target: Any) -> bool:
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


def _base_state_dict(model: torch.nn.Module, *, drop_embeddings: bool) -> dict[str, torch.Tensor]:
    """The base model's own weights: peft adapter parameters left out, ``.base_layer.`` unwrapped, tied copies once."""
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
        _base_state_dict(model, drop_embeddings=drop_embeddings), folder / WEIGHTS_NAME, metadata={"format": "pt"}
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


def _dtype(name: str | None, target: Any, where: str) -> torch.dtype:
    """`params.dtype` of a model drafter (default: the target's dtype)."""
    if name is None:
        return target.dtype
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InvalidPoolError(
            f'{where} `params.dtype` must name a torch floating dtype, but is {name!r}. Use e.g. "bfloat16".'
        )
    return dtype


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


def _load_base(
    folder: Path, target: Any, where: str, *, share: bool, dtype: torch.dtype | None = None
) -> torch.nn.Module:
    """A stored base: `config.json` + `model.safetensors` (without the embeddings when `share`).

    With `share`, the target's embedding and LM head are attached (shared; a cast copy when `dtype` differs from the
    target's, e.g. a bfloat16 drafter for a float32 target).
    """
    dtype = dtype or target.dtype
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    weights = folder / WEIGHTS_NAME
    if not (folder / CONFIG_NAME).is_file() or not weights.is_file():
        raise InvalidPoolError(
            f"{where} must find `{CONFIG_NAME}` and `{WEIGHTS_NAME}` in {str(folder)!r}, but they are missing. "
            "Restore the folder, or re-save the pool with `store_weights=True`."
        )
    config = AutoConfig.from_pretrained(folder)
    _check_model_config(config, target, where, share=share)
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config)
    if share:
        embedding, head = _target_embeddings(target, dtype)
        model.set_input_embeddings(embedding)
        model.get_output_embeddings().weight = head
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in load_file(weights).items()}
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


def _is_local_reference(path: str) -> bool:
    return os.path.isabs(path) or path.startswith((".", "~")) or Path(path).expanduser().exists()


def _resolve(spec: DrafterSpec, pool_root: Path | None, where: str, hub: dict[str, Any], *, need_folder: bool) -> str:
    """The local folder (or, when `need_folder` is false, the Hub repo id) holding the spec's weights."""
    if spec.stored:
        folder = None if pool_root is None else pool_root / (spec.path or "")
        if folder is None or not folder.exists():
            raise InvalidPoolError(
                f"{where} must be stored in the pool at {spec.path!r}, but that folder is missing"
                f"{'' if pool_root is None else f' from {str(pool_root)!r}'}. Restore it, or re-save the pool."
            )
        return str(folder)
    path = str(spec.path)
    if _is_local_reference(path):
        local = Path(path).expanduser()
        if not local.exists():
            raise InvalidPoolError(
                f"{where} must point to an existing folder or a Hub repo id, but {path!r} does not exist. Fix `path` "
                "in config.json, or save the pool with `store_weights=True` so that it carries the weights."
            )
        return str(local)
    if not need_folder:
        return path
    try:
        return snapshot_download(path, revision=spec.revision, **hub)
    except HFValidationError as err:
        raise InvalidPoolError(
            f"{where} must point to an existing folder or a Hub repo id, but {path!r} is neither. Fix `path`."
        ) from err


# ======================================================================================================================
# DrafterPool
# ======================================================================================================================
def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "drafter"


class DrafterPool(
    ModelHubMixin,
    library_name="hf_metasd",
    tags=list(TAGS),
    repo_url="https://github.com/hf-metasd/hf_metasd",
):
    """An ordered pool of drafters with the defaults of a MetaSD call; savable to a folder or the Hub.

    Args:
        drafters: what ``assistant_models=`` accepts: `Drafter` objects, transformers causal LMs, peft models (one
            arm per adapter).
        target: the target model (enables checks and embedding sharing on save) or its Hub id.
        policy, policy_kwargs: registered policy name and settings used by default (``"ucb"``).
        reward: ``"bd"`` (default) or ``"be"``.
        num_assistant_tokens: tokens drafted per round by default.

    Pass the pool itself to generation: ``generate(..., custom_generate=hf_metasd.generate, assistant_models=pool)``
    (see `generate_kwargs`).

    Example:
        >>> from hf_metasd.drafters import PromptLookupDrafter
        >>> pool = DrafterPool([PromptLookupDrafter()], target="HuggingFaceTB/SmolLM2-135M-Instruct", policy="ucb")
        >>> pool.generate_kwargs()["meta_policy"], [d.name for d in pool.drafters]
        ('ucb', ['prompt_lookup'])
    """

    def __init__(
        self,
        drafters: Sequence[Any],
        *,
        target: Any = None,
        policy: str = "ucb",
        policy_kwargs: dict[str, Any] | None = None,
        reward: str = "bd",
        num_assistant_tokens: int = DEFAULT_NUM_ASSISTANT_TOKENS,
    ) -> None:
        if isinstance(drafters, Sequence) and not isinstance(drafters, (str, bytes)) and len(drafters) == 0:
            raise InvalidPoolError(
                "pool `drafters` must hold at least one drafter, but is empty. Add a drafter, e.g. "
                "`DrafterPool([PromptLookupDrafter()])`."
            )
        self.drafters: list[Drafter] = as_drafters(drafters)
        self.target = target if isinstance(target, torch.nn.Module) else None
        self.target_id: str | None = (
            target if isinstance(target, str) else (getattr(target, "name_or_path", None) or None)
        )
        self.policy = policy
        self.policy_kwargs = dict(policy_kwargs or {})
        self.reward = reward
        self.num_assistant_tokens = num_assistant_tokens
        self.validate()

    # ------------------------------------------------------------------ generation
    def generate_kwargs(self) -> dict[str, Any]:
        """The pool's defaults for `hf_metasd.generate` (explicit arguments to generate take precedence)."""
        return {
            "meta_policy": self.policy,
            "meta_policy_kwargs": dict(self.policy_kwargs),
            "meta_reward": self.reward,
            "num_assistant_tokens": self.num_assistant_tokens,
        }

    def validate(self) -> None:
        """Raise `InvalidPoolError` for an empty pool or bad defaults (policy, reward, draft length)."""
        if not self.drafters:
            raise InvalidPoolError(
                "pool `drafters` must hold at least one drafter, but is empty. Add a drafter, e.g. "
                "`DrafterPool([PromptLookupDrafter()])`."
            )
        for i, drafter in enumerate(self.drafters):
            if not isinstance(drafter, Drafter):
                raise InvalidPoolError(
                    f"pool `drafters[{i}]` must be a `Drafter`, but is {type(drafter).__name__}. Build the pool with "
                    "`DrafterPool([...])`, which wraps models and peft models."
                )
        _validate_defaults(self.policy, self.policy_kwargs, self.reward, self.num_assistant_tokens)

    def __len__(self) -> int:
        return len(self.drafters)

    def __repr__(self) -> str:
        names = ", ".join(repr(d.name) for d in self.drafters)
        return f"DrafterPool([{names}], policy={self.policy!r}, reward={self.reward!r}, N={self.num_assistant_tokens})"

    # ------------------------------------------------------------------ save plan (validation, no I/O)
    def to_config(self, *, store_weights: bool = False) -> DrafterPoolConfig:
        """The `config.json` this pool saves as (validates; writes nothing)."""
        return self._plan(store_weights=store_weights)[0]

    def _plan(
        self, *, store_weights: bool, for_hub: bool = False
    ) -> tuple[DrafterPoolConfig, list[Callable[[Path], None]]]:
        """Everything `save_pretrained` will write, computed and validated before any file is touched."""
        self.validate()
        specs: list[DrafterSpec] = []
        writes: list[Callable[[Path], None]] = []
        used: set[str] = set()
        stored_bases: dict[int, str] = {}  # id(peft_model) -> folder already planned

        def folder_for(prefix: str, name: str) -> str:
            base, k = f"{prefix}/{_safe(name)}", 1
            candidate = base
            while candidate in used:
                k += 1
                candidate = f"{base}_{k}"
            used.add(candidate)
            return candidate

        i = 0
        while i < len(self.drafters):
            drafter = self.drafters[i]
            where = f"drafter {drafter.name!r} (drafters[{i}])"
            kind = drafter.kind
            if DRAFTER_KINDS.get(kind) is not type(drafter):
                raise InvalidPoolError(
                    f"{where} must be of a registered kind to be saved, but its kind {kind!r} maps to "
                    f"{getattr(DRAFTER_KINDS.get(kind), '__name__', None)} in {sorted(DRAFTER_KINDS)}. Register "
                    f"`{type(drafter).__name__}` with `hf_metasd.drafters.register_drafter_kind`."
                )
            if isinstance(drafter, LoraDrafter):
                group = [drafter]
                while (
                    i + len(group) < len(self.drafters)
                    and type(self.drafters[i + len(group)]) is LoraDrafter
                    and self.drafters[i + len(group)].peft_model is drafter.peft_model
                ):
                    group.append(self.drafters[i + len(group)])
                spec = self._plan_lora(group, where, store_weights, for_hub, folder_for, stored_bases, writes)
                i += len(group)
            elif isinstance(drafter, EarlyExitDrafter):
                spec = self._plan_early_exit(drafter, where, store_weights, for_hub, folder_for, writes)
                i += 1
            elif isinstance(drafter, ModelDrafter):
                spec = self._plan_model(drafter, where, store_weights, for_hub, folder_for, writes)
                i += 1
            else:
                params = drafter.config()
                try:
                    json.dumps(params)
                except (TypeError, ValueError) as err:
                    raise InvalidPoolError(
                        f"{where} must have JSON-serialisable `config()` parameters to be saved, but has {params!r}. "
                        f"Return plain values from `{type(drafter).__name__}.config()`."
                    ) from err
                spec = DrafterSpec(kind=kind, name=drafter.name, params=params)
                i += 1
            specs.append(spec)
        config = DrafterPoolConfig(
            drafters=specs,
            target=self.target_id,
            policy=self.policy,
            policy_kwargs=dict(self.policy_kwargs),
            reward=self.reward,
            num_assistant_tokens=self.num_assistant_tokens,
        )
        config.validate()
        return config, writes

    def _reference(
        self, drafter: Drafter, where: str, store_weights: bool, for_hub: bool, default_path: str | None
    ) -> tuple[bool, str | None, str | None]:
        """(store?, path, revision): keep a loaded drafter as it came, reference a known source, else fail."""
        origin = _ORIGINS.get(drafter, {})
        if store_weights or origin.get("stored"):
            return True, None, None
        path = origin.get("path") or default_path
        if not path:
            raise InvalidPoolError(
                f"{where} must have a source (Hub repo id or folder) to be saved by reference, but it was built in "
                "memory. Save the pool with `store_weights=True` to store its weights inside the pool."
            )
        if for_hub and _is_local_reference(path):
            raise InvalidPoolError(
                f"{where} must reference a Hub repo to be pushed, but references the local path {path!r}. Push with "
                "`store_weights=True`, or load the drafter from the Hub first."
            )
        return False, path, origin.get("revision")

    def _share(self, model: torch.nn.Module, drafter: Drafter) -> bool:
        loaded_shared = bool(_ORIGINS.get(drafter, {}).get("share_target_embeddings", False))
        if self.target is not None:
            # a drafter loaded with a cast copy of the target's embedding (other dtype) still shares it on disk
            return loaded_shared or _shares_target_embeddings(model, self.target)
        return loaded_shared

    def _plan_head(self, drafter: ModelDrafter, folder: str, writes: list) -> str | None:
        if drafter.head_token_ids is None:
            return None
        relative = f"{folder}/{HEAD_TOKEN_IDS_NAME}"
        ids = drafter.head_token_ids.detach().cpu()
        writes.append(lambda root, ids=ids, relative=relative: _write_head(ids, root / relative))
        return relative

    def _plan_model(self, drafter, where, store_weights, for_hub, folder_for, writes) -> DrafterSpec:
        model = drafter.model
        default = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", None) or None
        store, path, revision = self._reference(drafter, where, store_weights, for_hub, default)
        if revision is None and not store and path == default:
            revision = getattr(model.config, "_commit_hash", None)
        folder = folder_for("drafters", drafter.name)
        share = store and self._share(model, drafter)
        if store:
            writes.append(lambda root, m=model, f=folder, s=share: _write_base(m, root / f, drop_embeddings=s))
            path = folder
        params = {"share_target_embeddings": share, "head_token_ids": self._plan_head(drafter, folder, writes)}
        params["dtype"] = str(model.dtype).removeprefix("torch.")
        return DrafterSpec("assistant_model", drafter.name, path, revision, store, None, params)

    def _plan_lora(self, group, where, store_weights, for_hub, folder_for, stored_bases, writes) -> DrafterSpec:
        first = group[0]
        peft_model = first.peft_model
        origin = _ORIGINS.get(first, {})
        store, path, revision = self._reference(first, where, store_weights, for_hub, None)
        adapters = [d.adapter_name for d in group]
        base_name = Path(getattr(peft_model.get_base_model(), "name_or_path", "") or "").name
        name = origin.get("entry_name") or base_name or adapters[0]
        share = store and self._share(peft_model.get_base_model(), first)
        params: dict[str, Any] = {
            "base": origin.get("base", "base"),
            "adapters_dir": origin.get("adapters_dir", "adapters"),
            "share_target_embeddings": origin.get("share_target_embeddings", False) if not store else share,
        }
        if store:
            params["base"], params["adapters_dir"] = "base", "adapters"
            if id(peft_model) in stored_bases:
                folder, new_base = stored_bases[id(peft_model)], False
            else:
                folder, new_base = folder_for("lora", name), True
                stored_bases[id(peft_model)] = folder
            if new_base:
                base_model = peft_model.get_base_model()
                writes.append(
                    lambda root, m=base_model, f=folder, s=share: _write_base(m, root / f / "base", drop_embeddings=s)
                )
            for adapter in adapters:
                writes.append(
                    lambda root, a=adapter, f=folder: _write_adapter(peft_model, a, root / f / "adapters" / a)
                )
            path = folder
        else:
            folder = folder_for("lora", name)
        params["head_token_ids"] = self._plan_head(first, folder, writes)
        params["dtype"] = str(peft_model.get_base_model().dtype).removeprefix("torch.")
        return DrafterSpec("lora", name, path, revision, store, adapters, params)

    def _plan_early_exit(self, drafter, where, store_weights, for_hub, folder_for, writes) -> DrafterSpec:
        folder = folder_for("early_exit", drafter.name)
        path, revision, store = None, None, False
        if drafter.peft_model is not None:
            store, path, revision = self._reference(drafter, where, store_weights, for_hub, drafter.adapter)
            revision = revision or drafter.adapter_revision
            if store:
                adapter_name = drafter.peft_model.active_adapter
                writes.append(
                    lambda root, d=drafter, a=adapter_name, f=folder: _write_adapter(d.peft_model, a, root / f)
                )
                path = folder
        params = {"num_layers": drafter.num_layers, "head_token_ids": self._plan_head(drafter, folder, writes)}
        return DrafterSpec("early_exit", drafter.name, path, revision, store, None, params)

    # ------------------------------------------------------------------ save / push (ModelHubMixin pattern)
    def save_pretrained(
        self,
        save_directory: str | os.PathLike,
        *,
        store_weights: bool = False,
        repo_id: str | None = None,
        push_to_hub: bool = False,
        model_card_kwargs: dict[str, Any] | None = None,
        **push_to_hub_kwargs: Any,
    ) -> Any:
        """Write `config.json`, the `README.md` model card (kept if the folder already has one, as huggingface_hub
        does) and any weights the pool stores. The pool is validated first: an invalid pool writes nothing.

        Args:
            save_directory: the pool folder (created).
            store_weights: store assistant-model and LoRA drafters' weights in the folder instead of references.
            repo_id, push_to_hub: also push (see `push_to_hub`).
            model_card_kwargs: e.g. ``{"repo_id": ...}`` for the usage snippet.
        """
        self._plan(store_weights=store_weights, for_hub=push_to_hub)  # validate before creating anything
        save_directory = Path(save_directory)
        save_directory.mkdir(parents=True, exist_ok=True)
        config = self._save_pretrained(save_directory, store_weights=store_weights)
        card_path = save_directory / MODEL_CARD_NAME
        if not card_path.exists():
            kwargs = dict(model_card_kwargs or {})
            kwargs.setdefault("repo_id", repo_id)
            self.generate_model_card(config=config, **kwargs).save(card_path)
        if push_to_hub:
            return self.push_to_hub(
                repo_id or save_directory.name,
                store_weights=store_weights,
                model_card_kwargs=model_card_kwargs,
                **push_to_hub_kwargs,
            )
        return None

    def _save_pretrained(self, save_directory: Path, *, store_weights: bool = False) -> DrafterPoolConfig:
        config, writes = self._plan(store_weights=store_weights)
        for write in writes:
            write(save_directory)
        config.save(save_directory)
        return config

    def push_to_hub(
        self,
        repo_id: str,
        *,
        store_weights: bool = False,
        commit_message: str = "Upload MetaSD drafter pool",
        private: bool | None = None,
        token: str | None = None,
        branch: str | None = None,
        create_pr: bool | None = None,
        allow_patterns: list[str] | str | None = None,
        ignore_patterns: list[str] | str | None = None,
        delete_patterns: list[str] | str | None = None,
        model_card_kwargs: dict[str, Any] | None = None,
    ) -> Any:
        """Push the pool to the Hub in **one** commit (`config.json`, `README.md`, stored weights).

        The pool is validated first (nothing is created on the Hub for an invalid pool); references to local folders
        cannot be resolved from the Hub and are refused: push those drafters with `store_weights=True`.
        """
        self._plan(store_weights=store_weights, for_hub=True)
        api = HfApi(token=token)
        repo_id = api.create_repo(repo_id=repo_id, private=private, exist_ok=True).repo_id
        kwargs = dict(model_card_kwargs or {})
        kwargs.setdefault("repo_id", repo_id)
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "pool"
            self.save_pretrained(folder, store_weights=store_weights, model_card_kwargs=kwargs)
            return api.upload_folder(
                repo_id=repo_id,
                repo_type="model",
                folder_path=folder,
                commit_message=commit_message,
                revision=branch,
                create_pr=create_pr,
                allow_patterns=allow_patterns,
                ignore_patterns=ignore_patterns,
                delete_patterns=delete_patterns,
            )

    def generate_model_card(self, *args: Any, config: DrafterPoolConfig | None = None, **kwargs: Any) -> ModelCard:
        """A model card: ``library_name: hf_metasd``, ``base_model:`` the target, the drafter table, a usage snippet."""
        config = config or self.to_config()
        repo_id = kwargs.get("repo_id") or "path/to/this/pool"
        data = ModelCardData(**self._hub_mixin_info.model_card_data.to_dict())
        data.base_model = config.target or None
        rows, arm = [], 0
        for spec in config.drafters:
            names = spec.adapters if spec.kind == "lora" else [spec.name]
            if spec.stored:
                where = f"stored: `{spec.path}`"
            elif spec.path:
                where = f"`{spec.path}`" + (f" @ `{spec.revision}`" if spec.revision else "")
            else:
                where = "config only"
            details = ", ".join(f"{k}={v}" for k, v in sorted(spec.params.items()) if v not in (None, False))
            for name in names:
                rows.append(f"| {arm} | `{name}` | {spec.kind} | {where} | {details or '-'} |")
                arm += 1
        target = config.target or "<target model id>"
        policy = config.policy + (
            f" {json.dumps(config.policy_kwargs, sort_keys=True)}" if config.policy_kwargs else ""
        )
        body = f"""
# MetaSD drafter pool for `{target}`

A pool of {arm} drafters for multi-drafter speculative decoding (MetaSD) with
[hf_metasd](https://github.com/hf-metasd/hf_metasd): each round, a bandit policy picks the drafter that drafts, and
the target verifies every drafted token, so the output is exactly the target's own.

| arm | drafter | kind | weights | parameters |
|---|---|---|---|---|
{chr(10).join(rows)}

Defaults: policy `{policy}`, reward `{config.reward}`, `num_assistant_tokens={config.num_assistant_tokens}`
(hf_metasd {config.hf_metasd_version}, pool format {config.format_version}).

## Usage

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_metasd
from hf_metasd import DrafterPool

target = AutoModelForCausalLM.from_pretrained("{target}")
tokenizer = AutoTokenizer.from_pretrained("{target}")
pool = DrafterPool.from_pretrained("{repo_id}", target=target)

inputs = tokenizer("Write a haiku about speculative decoding.", return_tensors="pt")
out = target.generate(**inputs, max_new_tokens=128, custom_generate=hf_metasd.generate, assistant_models=pool)
print(tokenizer.decode(out[0], skip_special_tokens=True))
```
"""
        return ModelCard(f"---\n{data.to_yaml()}\n---\n{body}")

    # ------------------------------------------------------------------ load
    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        *,
        target: Any,
        revision: str | None = None,
        token: str | bool | None = None,
        cache_dir: str | os.PathLike | None = None,
        force_download: bool = False,
        local_files_only: bool = False,
    ) -> DrafterPool:
        """Load a pool from a folder or a Hub repo and build every drafter for `target`.

        Args:
            pretrained_model_name_or_path: a pool folder or a Hub repo id.
            target: the target model (early-exit drafters use its layers; shared embeddings are re-attached to it;
                every drafter is checked against its vocabulary).
            revision, token, cache_dir, force_download, local_files_only: as in huggingface_hub; `token` is also used
                for the drafters the pool references.

        Raises:
            InvalidPoolError: no or corrupt `config.json`, a missing drafter folder, adapter or head file.
            DrafterCompatibilityError: a drafter's vocabulary is not the target's.
        """
        return cls._from_pretrained(
            model_id=str(pretrained_model_name_or_path),
            revision=revision,
            cache_dir=cache_dir,
            force_download=force_download,
            local_files_only=local_files_only,
            token=token,
            target=target,
        )

    @classmethod
    def _from_pretrained(
        cls,
        *,
        model_id: str,
        revision: str | None,
        cache_dir: str | os.PathLike | None,
        force_download: bool,
        local_files_only: bool,
        token: str | bool | None,
        target: Any = None,
        **kwargs: Any,
    ) -> DrafterPool:
        hub = {k: v for k, v in {"token": token, "cache_dir": cache_dir}.items() if v is not None}
        if os.path.isdir(model_id):
            root = Path(model_id)
        elif _is_local_reference(model_id):
            raise InvalidPoolError(
                f"`pretrained_model_name_or_path` must be a pool folder or a Hub repo id, but {model_id!r} does not "
                "exist. Check the path."
            )
        else:
            try:
                root = Path(
                    snapshot_download(
                        model_id,
                        revision=revision,
                        force_download=force_download,
                        local_files_only=local_files_only,
                        **hub,
                    )
                )
            except HFValidationError as err:
                raise InvalidPoolError(
                    f"`pretrained_model_name_or_path` must be a pool folder or a Hub repo id, but {model_id!r} is "
                    "neither. Check the path or repo id."
                ) from err
        config = DrafterPoolConfig.from_json_file(root / CONFIG_NAME)
        return cls.from_config(config, target=target, root=root, token=token, cache_dir=cache_dir)

    @classmethod
    def from_config(
        cls,
        config: DrafterPoolConfig,
        *,
        target: Any,
        root: str | os.PathLike | None = None,
        token: str | bool | None = None,
        cache_dir: str | os.PathLike | None = None,
    ) -> DrafterPool:
        """Build the pool described by `config` for `target`; stored entries are read from the folder `root`."""
        if not isinstance(target, torch.nn.Module) or not hasattr(target, "config"):
            raise TypeError(
                f"`target` must be the target model (a transformers causal LM), but is {type(target).__name__}. "
                "Pass e.g. `target=AutoModelForCausalLM.from_pretrained(config.target)`."
            )
        config.validate()
        pool_root = None if root is None else Path(root)
        hub = {k: v for k, v in {"token": token, "cache_dir": cache_dir}.items() if v is not None}
        bases: dict[tuple[str, str], Any] = {}  # (folder, base) -> peft model: entries on one base share it
        drafters: list[Drafter] = []
        for i, spec in enumerate(config.drafters):
            where = f"drafter {spec.name!r} (drafters[{i}])"
            built = _build(spec, where, target, pool_root, hub, bases)
            for drafter in built:
                drafter.check_compatible(target)
            drafters.extend(built)
        pool = cls(
            drafters,
            target=target,
            policy=config.policy,
            policy_kwargs=config.policy_kwargs,
            reward=config.reward,
            num_assistant_tokens=config.num_assistant_tokens,
        )
        pool.target_id = config.target or pool.target_id
        return pool


def _build(
    spec: DrafterSpec, where: str, target: Any, pool_root: Path | None, hub: dict[str, Any], bases: dict
) -> list[Drafter]:
    """The drafter(s) of one `config.json` entry."""
    params = dict(spec.params)
    head = params.pop("head_token_ids", None)
    head_ids = None if head is None else _read_head(pool_root, head, where)
    share = bool(params.pop("share_target_embeddings", False))
    dtype = _dtype(params.pop("dtype", None), target, where) if spec.kind in MODEL_KINDS else None
    origin = {"stored": spec.stored, "path": spec.path, "revision": spec.revision, "share_target_embeddings": share}
    if spec.kind == "assistant_model":
        drafter = ModelDrafter(
            _load_model(spec, where, target, pool_root, hub, share, dtype), name=spec.name, head_token_ids=head_ids
        )
        _ORIGINS[drafter] = origin
        return [drafter]
    if spec.kind == "lora":
        from .drafters.lora import load_adapters

        folder = _resolve(spec, pool_root, where, hub, need_folder=True)
        base_dir = params.get("base", "base") or ""
        adapters_dir = params.get("adapters_dir", "adapters")
        key = (str(Path(folder).resolve()), base_dir)
        missing = [a for a in spec.adapters if not (Path(folder) / adapters_dir / a / ADAPTER_CONFIG_NAME).is_file()]
        if missing:
            raise InvalidPoolError(
                f"{where} must find adapter {missing[0]!r} at {str(Path(folder) / adapters_dir / missing[0])!r}, but "
                f"it is missing. Restore the adapter folder, or remove {missing[0]!r} from `adapters` in config.json."
            )
        paths = {a: Path(folder) / adapters_dir / a for a in spec.adapters}
        if key not in bases:
            base_model = _load_lora_base(Path(folder) / base_dir, spec, where, target, share, dtype)
            bases[key] = load_adapters(base_model, paths)
        else:
            peft_model = bases[key]
            for adapter, path in paths.items():
                if adapter not in peft_model.peft_config:
                    peft_model.load_adapter(str(path), adapter_name=adapter, is_trainable=False)
        arms = LoraDrafter.from_peft_model(bases[key], adapter_names=spec.adapters, head_token_ids=head_ids)
        for arm in arms:
            _ORIGINS[arm] = {**origin, "base": base_dir, "adapters_dir": adapters_dir, "entry_name": spec.name}
        return arms
    if spec.kind == "early_exit":
        adapter = None
        if spec.path:
            adapter = _resolve(spec, pool_root, where, hub, need_folder=False)
        try:
            drafter = EarlyExitDrafter(
                target,
                name=spec.name,
                adapter=adapter,
                revision=None if spec.stored else spec.revision,
                token=hub.get("token"),
                head_token_ids=head_ids,
                **params,
            )
        except (MetaSDConfigError, InvalidPoolError):
            raise
        except (TypeError, ValueError) as err:
            raise _bad_params(where, EarlyExitDrafter, spec, err) from err
        _ORIGINS[drafter] = origin
        return [drafter]
    cls = DRAFTER_KINDS[spec.kind]
    try:
        return [cls(name=spec.name, **params)]
    except (MetaSDConfigError, InvalidPoolError):
        raise
    except (TypeError, ValueError) as err:
        raise _bad_params(where, cls, spec, err) from err


def _bad_params(where: str, cls: type, spec: DrafterSpec, err: Exception) -> InvalidPoolError:
    return InvalidPoolError(
        f"{where} must have `params` that `{cls.__name__}` accepts, but {spec.params!r} fails: {err} "
        "Fix `params` in config.json."
    )


def _load_model(
    spec: DrafterSpec,
    where: str,
    target: Any,
    pool_root: Path | None,
    hub: dict,
    share: bool,
    dtype: torch.dtype | None = None,
) -> Any:
    if spec.stored or share:
        folder = Path(_resolve(spec, pool_root, where, hub, need_folder=True))
        return _load_base(folder, target, where, share=share, dtype=dtype)
    from transformers import AutoConfig, AutoModelForCausalLM

    location = _resolve(spec, pool_root, where, hub, need_folder=False)
    revision = {"revision": spec.revision} if spec.revision and not os.path.isdir(location) else {}
    _check_model_config(AutoConfig.from_pretrained(location, **revision, **hub), target, where, share=False)
    model = AutoModelForCausalLM.from_pretrained(location, dtype=dtype or target.dtype, **revision, **hub)
    return model.to(target.device).eval()


def _load_lora_base(
    folder: Path, spec: DrafterSpec, where: str, target: Any, share: bool, dtype: torch.dtype | None = None
) -> Any:
    if share or spec.stored:
        return _load_base(folder, target, where, share=share, dtype=dtype)
    from transformers import AutoConfig, AutoModelForCausalLM

    if not (folder / CONFIG_NAME).is_file():
        raise InvalidPoolError(
            f"{where} must find its base model in {str(folder)!r}, but it holds no `{CONFIG_NAME}`. Fix `path` / "
            "`params.base`, or re-save the pool with `store_weights=True`."
        )
    _check_model_config(AutoConfig.from_pretrained(folder), target, where, share=False)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype or target.dtype).to(target.device).eval()
