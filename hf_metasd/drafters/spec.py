"""A drafter's pool entry: `DrafterSpec` (one entry of a pool's `config.json`) and the checks every entry gets.

Each drafter kind writes and reads its own entries (`Drafter.to_spec` / `Drafter.from_spec`, through the
`~hf_metasd.drafters.save.SaveContext` and `~hf_metasd.drafters.load.LoadContext`); this module holds what they all
share: the entry's fields, the names of the files a stored entry consists of, and the checks of what an entry may say
(a path stays inside the pool, a number stays below its documented bound). The pool (`hf_metasd.pool`) builds on it;
nothing here knows a pool.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._peft import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME
from ..errors import InvalidPoolError

__all__ = [
    "ADAPTER_CONFIG_NAME",
    "ADAPTER_WEIGHTS_NAME",
    "DTYPES",
    "HEAD_TOKEN_IDS_NAME",
    "MAX_NUM_ASSISTANT_TOKENS",
    "MODEL_CONFIG_NAME",
    "WEIGHTS_NAME",
    "DrafterSpec",
    "check_at_most",
    "check_inside",
    "drafter_label",
    "is_local_reference",
    "require_path",
]

#: A stored model is ``config.json`` + ``model.safetensors``.
MODEL_CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
# A stored adapter is peft's ``adapter_config.json`` + ``adapter_model.safetensors``: `ADAPTER_CONFIG_NAME` and
# `ADAPTER_WEIGHTS_NAME`, imported above from `hf_metasd._peft` (feature-head adapters use them too).
#: A restricted head is a JSON list of token ids.
HEAD_TOKEN_IDS_NAME = "head_token_ids.json"
#: The dtypes a model entry's ``params.dtype`` may name (others, such as float8 ones, cannot run a drafter).
DTYPES = ("bfloat16", "float16", "float32", "float64")
#: Most tokens a pool file may set as a draft length (the pool's `num_assistant_tokens`, prompt lookup's
#: ``num_output_tokens``): far above the 3-20 that pay off, far below a length whose bookkeeping alone slows a call
#: (10,000,000 made 12 new tokens take 40 s).
MAX_NUM_ASSISTANT_TOKENS = 128


@dataclass
class DrafterSpec:
    """One entry of a pool's `config.json`: how to rebuild one drafter, or several arms (a ``lora`` entry: one per adapter).

    The kind owns what an entry means (`Drafter.to_spec` writes it, `Drafter.from_spec` reads it, their docstrings
    list the kind's `params`); the fields are the same for every kind.

    Attributes:
        kind: a registered drafter kind (``"assistant_model"``, ``"lora"``, ``"prompt_lookup"``, ``"early_exit"``,
            ``"corpus"``, ...).
        name: the drafter's label (an entry with several arms names them itself, e.g. after their adapters).
        path: where the weights are: a Hub repo id or a local folder (a reference), or, when `stored`, a folder
            relative to the pool. ``None`` for kinds without weights (for ``early_exit``: the adapter, if any).
        revision: Hub revision of a reference (a commit hash pins it).
        stored: the weights live inside the pool folder, at `path`.
        adapters: the adapter names of an entry with one arm per adapter (``lora``: adapter ``a`` is read from
            ``<path>/<params["adapters_dir"]>/a``), in arm order; ``None`` for every other kind.
        params: kind parameters (see the kind's `to_spec`): a model-free kind's constructor keyword arguments, a model
            kind's ``share_target_embeddings`` (the stored base has no embedding / LM head weights and uses the
            target's modules), ``dtype`` and ``head_token_ids`` (a JSON file of token ids relative to the pool folder).
    """

    kind: str
    name: str
    path: str | None = None
    revision: str | None = None
    stored: bool = False
    adapters: list[str] | None = None
    params: dict[str, Any] = field(default_factory=dict)


def drafter_label(name: str, item: Any, items: Sequence[Any], start: int) -> str:
    """``drafter 'name' (drafters[i])``: how messages name a drafter or an entry, with ``i`` the position of `item`
    (by identity) in `items`, looked for from `start` first (an object may appear twice), left out when absent.

    Example:
        >>> spec = DrafterSpec("prompt_lookup", "pl")
        >>> drafter_label("pl", spec, [DrafterSpec("corpus", "c"), spec], 0), drafter_label("pl", spec, [], 0)
        ("drafter 'pl' (drafters[1])", "drafter 'pl'")
    """
    index = next((i for i in (*range(start, len(items)), *range(start)) if items[i] is item), None)
    return f"drafter {name!r}" + ("" if index is None else f" (drafters[{index}])")


def is_local_reference(path: str) -> bool:
    """Whether `path` is a local path (absolute, ``.``/``~``-relative, or existing) rather than a Hub repo id.

    A pool file may not make a load read such a path (`LoadContext.resolve`): the caller maps it with ``local_paths``.
    """
    return os.path.isabs(path) or path.startswith((".", "~")) or Path(path).expanduser().exists()


def check_inside(value: Any, where: str, *, single: bool = False) -> None:
    """Paths inside a pool must stay inside it: relative, no `..` (a Hub config is untrusted input).

    With `single`, the path must be one folder name (an adapter's name).

    Example:
        >>> check_inside("adapters/code", "`params.adapters_dir`")
        >>> check_inside("../elsewhere", "`path`")
        Traceback (most recent call last):
        ...
        hf_metasd.errors.InvalidPoolError: `path` must be a relative path inside the pool folder, but is '../elsewhere'. Use e.g. "adapters"; reference outside weights with a non-stored `path` instead.
    """
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


def check_at_most(value: Any, where: str, high: float) -> None:
    """A number a pool file sets must be at most `high`, its documented upper bound (NaN is refused too), else
    `InvalidPoolError`. Its type and lower bound are checked by what takes it (the kind's constructor, the policy's
    settings); anything that is not a number passes here. Kinds check their `params` with it in `validate_spec`.

    Example:
        >>> check_at_most(64, "`params.max_occurrences`", 4096)
        >>> check_at_most(10**9, "`params.max_occurrences`", 4096)
        Traceback (most recent call last):
        ...
        hf_metasd.errors.InvalidPoolError: `params.max_occurrences` must be at most 4096, but is 1000000000. Use a value in its range (the ranges of a pool file are in docs/tutorials/pool_hub.md).
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not value <= high:
        shown = f"{high:g}" if isinstance(high, float) else str(high)
        raise InvalidPoolError(
            f"{where} must be at most {shown}, but is {value!r}. Use a value in its range (the ranges of a pool file "
            "are in docs/tutorials/pool_hub.md)."
        )


def require_path(spec: DrafterSpec, where: str) -> None:
    """Raise `InvalidPoolError` if the pool entry `spec` has no `path` (a kind that reads a model needs one)."""
    if not spec.path:
        raise InvalidPoolError(
            f"{where} must have a `path` (a Hub repo id, a folder, or a folder inside the pool), but has none. "
            "Set `path`, or save the pool with `store_weights=True`."
        )
