"""Task adapters on one resident feature head: several LoRA adapters on one `FeatureHead`, one drafter arm each.

Memory for K task heads is one head plus K adapters (``r * (in + out)`` numbers per adapted projection) instead of K
heads. The adapters are injected into the head in place with peft's functional API (`peft.inject_adapter_in_model`:
the head stays a `FeatureHead`, peft's ``lora.Linear`` wraps each adapted projection); `FeatureHeadDrafter` drafts
with one of them (``adapter="code"``) or with none (the base head, every adapter switched off).

**Which modules.** An adapter may adapt the projections in `ADAPTER_MODULES`; by default (`DEFAULT_TARGET_MODULES`)
the decoder layer's seven: attention ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` and MLP ``gate_proj``,
``up_proj``, ``down_proj``. That layer runs at *every* draft step (step 0 on the fused target feature, later steps on
the head's own output), so an adapter there acts on every drafted token. ``fc`` (the fusion of the target's features)
is allowed but left out by default: it runs at step 0 only, and what it reads, the target's features, already carries
the task. ``lm_head`` is not allowed: it is the head's largest matrix (draft vocabulary x hidden), and the draft
vocabulary it maps to is shared by every adapter.

**Switching.** Which adapter the head computes with is state of the shared head. `using_adapter` activates an arm's
adapter (or switches every adapter off) and holds the head's lock (`adapter_lock`) while the arm drafts, so concurrent
calls never draft with another arm's adapter; `adapter_state` / `restore_adapter_state` give the user's head back as
it was after a call (active adapter, adapters on or off, which parameters require grad).

**Files.** An adapter folder holds peft's ``adapter_config.json`` (sorted JSON) and ``adapter_model.safetensors``
(``<module path>.lora_A.weight`` ``(r, in)`` and ``<module path>.lora_B.weight`` ``(out, r)`` per adapted module, as
peft names them). A folder is untrusted input, read as data: the JSON is bounded (`hf_metasd.untrusted`),
``peft_type`` must be ``"LORA"``, ``r`` in ``[1, MAX_RANK]``, ``lora_alpha`` in ``(0, MAX_ALPHA]``,
``target_modules`` a list from `ADAPTER_MODULES`, every other setting peft knows must be its plain-LoRA default (no
DoRA, no bias, no ``modules_to_save``, no ``auto_mapping``: nothing that runs code or changes the head's other
weights), and the tensors' names and shapes are checked against those settings before one is read. The adapter is
built from the checked settings only, never from the file's dict. peft is an optional dependency
(``pip install hf-metasd[peft]``), imported when an adapter is added or loaded.

Example:
    >>> import torch
    >>> from hf_metasd.feature_head import FeatureHead, FeatureHeadConfig
    >>> config = FeatureHeadConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4,
    ...                            num_key_value_heads=2, vocab_size=96, draft_vocab_size=96, layer_ids=(1,))
    >>> head = FeatureHead(config, torch.nn.Embedding(96, 32))
    >>> add_adapter(head, "code", r=4)
    >>> add_adapter(head, "math", r=2, target_modules=["q_proj", "v_proj", "fc"])
    >>> adapter_names(head), sorted(head.base_state_dict()) == sorted(FeatureHead(config, head.embedding).state_dict())
    (['code', 'math'], True)
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from .._peft import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, adapter_lock, require_peft
from ..errors import InvalidPoolError, InvalidPoolTypeError, MetaSDConfigError, MetaSDTypeError
from ..untrusted import read_json
from .head import FeatureHead
from .io import read_tensors

__all__ = [
    "ADAPTER_MODULES",
    "DEFAULT_TARGET_MODULES",
    "MAX_ALPHA",
    "MAX_RANK",
    "adapter_lock",
    "adapter_names",
    "adapter_state",
    "add_adapter",
    "check_adapter_name",
    "check_savable",
    "load_adapter",
    "restore_adapter_state",
    "save_adapter",
    "set_active_adapter",
    "using_adapter",
]

#: The projections an adapter may adapt (peft's ``target_modules`` names) and where they sit in the head.
ADAPTER_MODULES = {
    "q_proj": "layers.0.self_attn.q_proj",
    "k_proj": "layers.0.self_attn.k_proj",
    "v_proj": "layers.0.self_attn.v_proj",
    "o_proj": "layers.0.self_attn.o_proj",
    "gate_proj": "layers.0.mlp.gate_proj",
    "up_proj": "layers.0.mlp.up_proj",
    "down_proj": "layers.0.mlp.down_proj",
    "fc": "fc",
}
#: What `add_adapter` adapts by default: the decoder layer's projections (the module docstring says why).
DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: Largest LoRA rank an adapter may have (bounds what a file can make a load allocate).
MAX_RANK = 256
#: Largest ``lora_alpha`` an adapter may have.
MAX_ALPHA = 4096.0
#: Settings of an adapter file that say nothing about its computation (read and ignored).
_METADATA = frozenset(
    {"base_model_name_or_path", "inference_mode", "init_lora_weights", "peft_version", "revision", "task_type"}
)
_CHECKED = frozenset({"peft_type", "r", "lora_alpha", "target_modules", "lora_dropout", "use_rslora"})
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}")
_FILE_FIX = "Re-save the adapter with `hf_metasd.feature_head.save_adapter`, or restore its folder."


# ======================================================================================================================
# adding, listing, switching
# ======================================================================================================================
def adapter_names(head: FeatureHead) -> list[str]:
    """The adapters of `head`, in the order they were added (empty for a head without adapters)."""
    return list(getattr(head, "peft_config", {}))


def check_adapter_name(name: Any, where: str = "`name`", error: type[Exception] = MetaSDConfigError) -> None:
    """An adapter name is 1 to 64 letters, digits, ``_`` or ``-`` (not starting with ``-``): a folder name and a key
    peft accepts."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise error(
            f"{where} must be an adapter name of 1 to 64 letters, digits, `_` or `-`, but is {name!r}. "
            'Use e.g. "code".'
        )


def _check_new(head: FeatureHead, name: Any) -> None:
    check_adapter_name(name)
    if name in adapter_names(head):
        raise MetaSDConfigError(
            f"`name` must be a new adapter of the head, but {name!r} is already one of {adapter_names(head)}. "
            "Pick another name."
        )


def add_adapter(
    head: FeatureHead,
    name: str,
    *,
    r: int = 16,
    lora_alpha: float | None = None,
    target_modules: Sequence[str] = DEFAULT_TARGET_MODULES,
) -> None:
    """Add a new LoRA adapter `name` to `head` (peft's names: rank `r`, ``lora_alpha`` default `r`, so the scaling
    ``lora_alpha / r`` is 1; `target_modules` from `ADAPTER_MODULES`).

    The head is left ready to train the new adapter: it is active and trainable, the head's own weights and its
    other adapters frozen (``requires_grad=False``). Its ``lora_B`` starts at zero, so the adapted head drafts as the
    base head until the adapter is trained.
    """
    peft = require_peft("feature-head adapters need")
    _check_new(head, name)
    data = {
        "peft_type": "LORA",
        "r": r,
        "lora_alpha": r if lora_alpha is None else lora_alpha,
        "target_modules": target_modules if isinstance(target_modules, str) else list(target_modules),
    }
    config = _checked_config(data, "", "Fix the argument of `add_adapter`.", MetaSDConfigError, MetaSDTypeError)
    with adapter_lock(head):  # no arm drafts while the head changes
        _inject(peft, head, config, name)
        set_active_adapter(head, name, trainable=True)  # the other adapters frozen (peft leaves them trainable)


def _inject(peft: Any, head: FeatureHead, config: Any, name: str) -> None:
    with warnings.catch_warnings():  # peft warns whenever a model gets a second adapter: that is the point here
        warnings.filterwarnings("ignore", message="Already found a `peft_config` attribute in the model")
        peft.inject_adapter_in_model(config, head, adapter_name=name)


def _tuner_layers(head: FeatureHead) -> list[Any]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [module for module in head.modules() if isinstance(module, BaseTunerLayer)]


def set_active_adapter(head: FeatureHead, adapter: str | None, *, trainable: bool = False) -> None:
    """Make `head` compute with `adapter`, or with its own weights only (``None``: every adapter switched off).

    Without `trainable` every adapter parameter is frozen (drafting); with it, `adapter`'s parameters require grad
    (training). Not locked: arms switch through `using_adapter`.
    """
    names = adapter_names(head)
    if adapter is not None and adapter not in names:
        raise MetaSDConfigError(
            f"`adapter` must be one of the head's adapters {names} or None (the base head), but is {adapter!r}. "
            "Add it with `add_adapter` or load it with `load_adapter` first."
        )
    for layer in _tuner_layers(head) if names else []:
        if adapter is None:
            layer.enable_adapters(False)
        else:
            layer.enable_adapters(True)
            layer.set_adapter(adapter, inference_mode=not trainable)


def _is_active(head: FeatureHead, adapter: str | None) -> bool:
    return all(
        layer.disable_adapters == (adapter is None) and (adapter is None or layer.active_adapters == [adapter])
        for layer in _tuner_layers(head)
    )


@contextmanager
def using_adapter(head: FeatureHead, adapter: str | None) -> Iterator[None]:
    """`head` computing with `adapter` (``None``: the base head) for the duration, under `adapter_lock`: no other
    arm switches it meanwhile. A head that never had an adapter is used as it is, without the lock."""
    if adapter is None and not adapter_names(head):
        yield
        return
    with adapter_lock(head):
        if not _is_active(head, adapter):
            set_active_adapter(head, adapter)
        yield


def adapter_state(head: FeatureHead) -> Any:
    """What `restore_adapter_state` gives back: each adapted module's active adapters and on/off switch, and which of
    the head's parameters require grad."""
    layers = _tuner_layers(head) if adapter_names(head) else []  # peft is imported only for a head with adapters
    return [(layer, layer.disable_adapters, list(layer.active_adapters)) for layer in layers], [
        (param, param.requires_grad) for param in head.parameters()
    ]


def restore_adapter_state(head: FeatureHead, state: Any) -> None:
    """Put `head` back as `adapter_state` found it (under `adapter_lock`). A module adapted since computes as the
    modules adapted then (with every adapter off if there were none); parameters added since are frozen."""
    layers, grads = state
    with adapter_lock(head):
        if adapter_names(head):
            known = {id(layer): (disabled, active) for layer, disabled, active in layers}
            default = next(iter(known.values()), (True, None))
            for layer in _tuner_layers(head):
                disabled, active = known.get(id(layer), default)
                if active is not None:
                    layer.set_adapter(active)
                layer.enable_adapters(not disabled)
        flags = {id(param): flag for param, flag in grads}
        for param in head.parameters():  # switching adapters also changes which parameters require grad
            param.requires_grad_(flags.get(id(param), False))


# ======================================================================================================================
# settings: the one check of an adapter's settings, for arguments and for files
# ======================================================================================================================
def _checked_config(data: Any, where: str, fix: str, error: type[Exception], type_error: type[Exception]) -> Any:
    """The peft ``LoraConfig`` of adapter settings `data` (a dict in ``adapter_config.json``'s form), built from the
    checked settings only; `where` (``" in '<file>'"`` or ``""``) goes after each setting's name in messages."""
    from peft import LoraConfig

    if not isinstance(data, dict):
        raise type_error(f"the adapter settings{where} must be a JSON object, but are {type(data).__name__}. {fix}")
    if data.get("peft_type") != "LORA":
        raise error(f'`peft_type`{where} must be "LORA", but is {data.get("peft_type")!r}. Use a LoRA adapter.')
    r, alpha = data.get("r"), data.get("lora_alpha")
    if not isinstance(r, int) or isinstance(r, bool) or not 1 <= r <= MAX_RANK:
        raise (error if isinstance(r, int) and not isinstance(r, bool) else type_error)(
            f"`r`{where} must be an int in [1, {MAX_RANK}], but is {r!r}. {fix}"
        )
    if not _is_number(alpha) or not (math.isfinite(alpha) and 0 < alpha <= MAX_ALPHA):
        raise (error if _is_number(alpha) else type_error)(
            f"`lora_alpha`{where} must be a number in (0, {MAX_ALPHA:g}], but is {alpha!r}. {fix}"
        )
    modules = data.get("target_modules")
    if not (
        isinstance(modules, list)
        and modules
        and all(isinstance(m, str) for m in modules)
        and len(set(modules)) == len(modules)
        and set(modules) <= set(ADAPTER_MODULES)
    ):
        raise error(
            f"`target_modules`{where} must be a list of distinct modules among {list(ADAPTER_MODULES)}, but is "
            f"{modules!r}. {fix}"
        )
    dropout, rslora = data.get("lora_dropout", 0.0), data.get("use_rslora", False)
    if not _is_number(dropout) or not 0 <= dropout < 1:
        raise error(f"`lora_dropout`{where} must be a number in [0, 1), but is {dropout!r}. {fix}")
    if not isinstance(rslora, bool):
        raise type_error(f"`use_rslora`{where} must be true or false, but is {rslora!r}. {fix}")
    config = LoraConfig(
        r=r, lora_alpha=alpha, target_modules=sorted(modules), lora_dropout=float(dropout), use_rslora=rslora
    )
    plain = _as_json(config)
    unknown = sorted(str(key) for key in data if key not in plain and key not in _METADATA)
    for key, value in data.items():
        if key in plain and key not in _CHECKED | _METADATA and value != plain[key]:
            want = json.dumps(plain[key])  # in the file's own (JSON) spelling
            raise error(
                f"`{key}`{where} must be {want} (plain LoRA on a feature head), but is {json.dumps(value)}. "
                f"Train the adapter with hf_metasd's `add_adapter`, or set `{key}` to {want}."
            )
    if unknown:
        warnings.warn(
            f"the adapter settings{where} have keys this peft version does not know, ignored: {unknown}. Upgrade "
            "peft to use them.",
            UserWarning,
            stacklevel=3,
        )
    return config


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_json(config: Any) -> dict[str, Any]:
    """``adapter_config.json`` of a peft config, as peft's `save_pretrained` writes it, with sorted sets."""
    data = config.to_dict()
    for key, value in data.items():
        if isinstance(value, set):
            data[key] = sorted(value)
    return json.loads(json.dumps(data))


# ======================================================================================================================
# files
# ======================================================================================================================
def _adapted(head: FeatureHead, name: str) -> dict[str, Any]:
    """``{module path: peft LoRA layer}`` of the modules adapter `name` adapts."""
    out = {}
    for path in ADAPTER_MODULES.values():
        module = head.get_submodule(path)
        if name in getattr(module, "lora_A", {}):
            out[path] = module
    return out


def check_savable(
    head: FeatureHead,
    name: str,
    where: str = "",
    error: type[Exception] = MetaSDConfigError,
    type_error: type[Exception] = MetaSDTypeError,
) -> dict[str, Any]:
    """The ``adapter_config.json`` of adapter `name` of `head`, or the error a load of it would raise: an adapter
    injected with peft directly may adapt modules or use settings that `load_adapter` refuses. `where` goes after
    the adapter's name in messages."""
    names = adapter_names(head)
    if name not in names:
        raise MetaSDConfigError(f"`name` must be one of the head's adapters {names}, but is {name!r}. Pick one.")
    data = _as_json(head.peft_config[name])
    fix = "Add the adapter with `hf_metasd.feature_head.add_adapter` (plain LoRA on `ADAPTER_MODULES`)."
    _checked_config(data, f" of adapter {name!r}{where}", fix, error, type_error)
    return data


def save_adapter(head: FeatureHead, name: str, folder: str | os.PathLike) -> None:
    """Write adapter `name` of `head` to `folder` (``adapter_config.json`` + ``adapter_model.safetensors``).

    An adapter whose settings a load would refuse (`check_savable`) is refused here, before anything is written.
    """
    data = check_savable(head, name)
    tensors = {}
    for path, module in _adapted(head, name).items():
        tensors[f"{path}.lora_A.weight"] = module.lora_A[name].weight.detach().to("cpu").contiguous()
        tensors[f"{path}.lora_B.weight"] = module.lora_B[name].weight.detach().to("cpu").contiguous()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / ADAPTER_WEIGHTS_NAME), metadata={"format": "pt"})
    (folder / ADAPTER_CONFIG_NAME).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def load_adapter(head: FeatureHead, folder: str | os.PathLike, name: str) -> None:
    """Add the adapter saved in `folder` (by `save_adapter`, or peft for a head) to `head` as `name`, frozen.

    Every check of the module docstring runs before the adapter is injected; a refused folder is an
    `InvalidPoolError` naming the file and leaves the head as it was. The head's active adapter does not change.
    """
    peft = require_peft("feature-head adapters need")
    _check_new(head, name)
    folder = Path(folder)
    config_file, weights_file = folder / ADAPTER_CONFIG_NAME, folder / ADAPTER_WEIGHTS_NAME
    for file in (config_file, weights_file):
        if not file.is_file():
            pickled = " (a pool reads safetensors only, never pickles)" if file is weights_file else ""
            raise InvalidPoolError(
                f"the feature-head adapter {name!r} must find {file.name} in {str(folder)!r}, but it is "
                f"missing{pickled}. {_FILE_FIX}"
            )
    where = f" in {str(config_file)!r}"
    data = read_json(config_file, f"the feature-head adapter {name!r}", _FILE_FIX)
    config = _checked_config(data, where, _FILE_FIX, InvalidPoolError, InvalidPoolTypeError)
    expected = {}
    for module in config.target_modules:
        path = ADAPTER_MODULES[module]
        layer = head.get_submodule(path)
        base = getattr(layer, "base_layer", layer)
        expected[f"{path}.lora_A.weight"] = torch.empty(config.r, base.in_features, device="meta")
        expected[f"{path}.lora_B.weight"] = torch.empty(base.out_features, config.r, device="meta")
    tensors = read_tensors(
        [weights_file],
        expected,
        optional=frozenset(),
        skipped={},
        what=f"the weights of feature-head adapter {name!r}",
        fix=_FILE_FIX,
        unknown_fix=f"Save the adapter's `target_modules` and only those ({ADAPTER_WEIGHTS_NAME}).",
    )
    with adapter_lock(head):  # no arm drafts while the head changes
        state = adapter_state(head)
        _inject(peft, head, config, name)
        with torch.no_grad():
            for path, module in _adapted(head, name).items():
                for part in ("lora_A", "lora_B"):
                    weight = getattr(module, part)[name].weight
                    weight.copy_(tensors[f"{path}.{part}.weight"].to(weight.dtype))
        restore_adapter_state(head, state)  # on the adapter it was on (or none), the new adapter frozen
