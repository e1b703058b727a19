"""Saving and loading a `FeatureHead`: hf_metasd's layout, the layout dispatch, and the checks of untrusted files.

hf_metasd's layout is a folder with two files:

* ``feature_head_config.json``: the `FeatureHeadConfig` as sorted JSON;
* ``feature_head.safetensors``: the head's `state_dict` (speculators' tensor names: ``fc.weight``, ``layers.0.*``,
  ``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d``, ``input_norm.weight`` with `norm_before_fc`). The target's
  embedding is not in it: the head shares the target's. Nor are its adapters (`FeatureHead.base_state_dict`): they
  are saved apart (`hf_metasd.feature_head.adapters`).

`load_feature_head` also reads speculators' EAGLE-3 layout (`hf_metasd.feature_head.speculators`). A head folder is
untrusted input, read as data: JSON files of at most `MAX_JSON_BYTES` nested at most `MAX_JSON_DEPTH` deep, weights
from safetensors only (a pickled ``.bin`` is refused), every tensor's name, shape and dtype checked against the
config *before* it is read, the config checked against the target. Every failure is an `InvalidPoolError` that
names the file and what to do.
"""

from __future__ import annotations

import json
import os
import re
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from ..errors import InvalidPoolError
from ..untrusted import nests_deeper, reading_untrusted
from .config import FeatureHeadConfig
from .head import FeatureHead
from .vocab import check_vocab_map

__all__ = [
    "CONFIG_NAME",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "WEIGHTS_NAME",
    "read_json",
    "read_tensors",
    "tensor_names",
    "weight_files",
]

CONFIG_NAME = "feature_head_config.json"
WEIGHTS_NAME = "feature_head.safetensors"
#: Largest JSON file a head load parses (configs and shard indexes are a few kB).
MAX_JSON_BYTES = 4 * 2**20
#: Deepest nesting of lists and objects in a JSON file a head load parses.
MAX_JSON_DEPTH = 16
#: safetensors dtype names by kind: what a float weight, ``d2t`` and ``t2d`` may be stored as.
FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})
INT_DTYPES = frozenset({"I8", "I16", "I32", "I64", "U8", "U16", "U32"})
_SHARD = re.compile(r"[\w.-]+\.safetensors")


# ======================================================================================================================
# untrusted input
# ======================================================================================================================
def reading(file: str | os.PathLike, fix: str) -> AbstractContextManager[None]:
    """Whatever a parser raises on `file` (a Rust panic included) as an `InvalidPoolError` naming the feature head
    (`hf_metasd.untrusted.reading_untrusted`, the pool loads' own)."""
    return reading_untrusted("the feature head", file, fix)


def read_json(path: str | os.PathLike, fix: str) -> Any:
    """Parsed JSON of `path`, at most `MAX_JSON_BYTES` large and `MAX_JSON_DEPTH` deep, else `InvalidPoolError`."""
    path = Path(path)
    with reading(path, fix):
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise InvalidPoolError(f"{str(path)!r} must hold at most {MAX_JSON_BYTES} bytes, but has {size}. {fix}")
        data = json.loads(path.read_bytes())
    if nests_deeper(data, MAX_JSON_DEPTH):
        raise InvalidPoolError(f"{str(path)!r} must nest at most {MAX_JSON_DEPTH} deep, but nests deeper. {fix}")
    return data


def _dtypes(name: str, example: torch.Tensor) -> frozenset[str]:
    if name == "t2d":
        return frozenset({"BOOL"})
    return FLOAT_DTYPES if example.dtype.is_floating_point else INT_DTYPES


def weight_files(folder: Path, single: str, fix: str) -> list[Path]:
    """The safetensors files of a head in `folder`: `single`, or the shards its index ``<single>.index.json`` names
    (plain file names in `folder`)."""
    index = folder / f"{single}.index.json"
    if (folder / single).is_file():
        return [folder / single]
    if index.is_file():
        data = read_json(index, fix)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(
            isinstance(v, str) and _SHARD.fullmatch(v) for v in weight_map.values()
        ):
            raise InvalidPoolError(
                f"{str(index)!r} must have a `weight_map` of tensor names to .safetensors file names in the folder, "
                f"but it does not. {fix}"
            )
        return [folder / name for name in sorted(set(weight_map.values()))]
    pickled = sorted(p.name for p in folder.glob("*.bin")) if folder.is_dir() else []
    raise InvalidPoolError(
        f"the feature head must find its weights in {str(folder / single)!r} (safetensors), but "
        + (f"finds only pickled files {pickled}, which are never loaded" if pickled else "there is none")
        + f". {fix}"
    )


def tensor_names(files: list[Path], fix: str) -> set[str]:
    """The names of the tensors in the safetensors `files` (read from their headers)."""
    names: set[str] = set()
    for path in files:
        with reading(path, fix), safe_open(str(path), framework="pt", device="cpu") as handle:
            names.update(handle.keys())
    return names


def read_tensors(
    files: list[Path],
    expected: dict[str, torch.Tensor],
    *,
    optional: frozenset[str],
    skipped: dict[str, tuple],
    what: str = "the feature head's weights",
    fix: str = "Re-save the head from a working copy, or use a head trained for this target.",
    unknown_fix: str = "Use a single-layer EAGLE-3 head whose weights match its config.",
) -> dict[str, torch.Tensor]:
    """Read the tensors `expected` names (each like its example tensor in shape and dtype kind) from the safetensors
    `files`; names in `optional` may be absent, names in `skipped` (name -> shape) are checked and not read, any other
    name is refused. Shapes and dtypes are checked from the headers before any tensor is read. Messages name the
    tensors `what` (a head's by default; a head adapter's too) and end with `fix` (`unknown_fix` for extra tensors)."""
    handles, owner = {}, {}
    for path in files:
        with reading(path, fix):
            handles[path] = safe_open(str(path), framework="pt", device="cpu")
            names = list(handles[path].keys())
        for name in names:
            if name in owner:
                raise InvalidPoolError(
                    f"`{name}` must be in one weight file, but is in {owner[name].name!r} and {path.name!r}. {fix}"
                )
            owner[name] = path
    unknown = sorted(set(owner) - set(expected) - set(skipped))
    if unknown:
        raise InvalidPoolError(
            f"{what} must hold only the tensors of its config, but also hold {unknown[:8]}. {unknown_fix}"
        )
    missing = sorted(set(expected) - set(owner) - optional)
    if missing:
        raise InvalidPoolError(f"{what} are missing tensors {missing[:8]}. {fix}")
    out: dict[str, torch.Tensor] = {}
    for name in sorted(owner):
        path = owner[name]
        with reading(path, fix):
            view = handles[path].get_slice(name)
            shape, dtype = tuple(view.get_shape()), view.get_dtype()
        want = tuple(expected[name].shape) if name in expected else tuple(skipped[name])
        kinds = _dtypes(name, expected[name]) if name in expected else FLOAT_DTYPES
        if shape != want or dtype not in kinds:
            raise InvalidPoolError(
                f"`{name}` in {path.name!r} must have shape {want} and a dtype in {sorted(kinds)} for this config, "
                f"but has shape {shape} and dtype {dtype}. {fix}"
            )
        if name in expected:
            with reading(path, fix):
                out[name] = handles[path].get_tensor(name)
    return out


def load_state(head: FeatureHead, tensors: dict[str, torch.Tensor], where: str) -> FeatureHead:
    """Copy checked `tensors` into `head` (absent ``d2t`` / ``t2d`` keep the identity map) and check the vocab map."""
    with torch.no_grad():
        state = head.state_dict()
        for name, tensor in tensors.items():
            state[name].copy_(tensor.to(state[name].dtype))
    check_vocab_map(head.d2t, head.t2d, head.config.vocab_size, f"`d2t` / `t2d` of {where}")
    return head.eval()


def expected_state(config: FeatureHeadConfig, target: Any, where: str) -> dict[str, torch.Tensor]:
    """The `state_dict` of a head of `config` for `target` (after checking that it fits), as meta tensors: shapes
    and dtypes without memory. A load checks the files against it before it builds the head, so a config cannot make
    a load allocate more than its checked files hold."""
    config.check_target(target, where)
    with torch.device("meta"):
        return FeatureHead(config, target.get_input_embeddings(), device="meta").state_dict()


def new_head(config: FeatureHeadConfig, target: Any) -> FeatureHead:
    """An untrained head of `config` for `target` (checked by `expected_state`), on the target's device and dtype."""
    return FeatureHead(config, target.get_input_embeddings())
