"""hf_metasd as a transformers ``custom_generate`` repository: a folder (or a Hub repo made from it) that anyone can
use with ``model.generate(..., custom_generate="folder-or-repo-id", trust_remote_code=True, assistant_models=[...])``.

transformers loads ``custom_generate/generate.py`` from the folder, checks ``custom_generate/requirements.txt``
against the installed packages, and calls the file's ``generate(model=..., **every argument of model.generate)``.
The file written here holds no decoding logic: it calls `repo_generate` of the installed hf_metasd, so an update of
the package needs no new copy of the repository.

```bash
hf-metasd custom-generate-repo my_metasd_repo      # README.md, custom_generate/generate.py, .../requirements.txt
```
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from ._version import __version__
from .errors import CustomGenerateRepoError, MetaSDConfigError
from .generation import generate_with_pool

__all__ = ["FILES", "LOADING_KWARGS", "repo_generate", "requirements", "write_custom_generate_repo"]

#: The files `write_custom_generate_repo` writes, relative to the folder (the only ones ``overwrite`` replaces).
FILES = ("README.md", "custom_generate/generate.py", "custom_generate/requirements.txt")

#: Arguments of `model.generate` that transformers uses to fetch the repository (a pinned ``revision``, a
#: ``cache_dir``, ...) and then hands to the repository's `generate` with all the others: they mean nothing to decoding.
LOADING_KWARGS = ("cache_dir", "force_download", "local_files_only", "proxies", "repo_type", "revision", "token")

#: What transformers' requirement check reads on a line: a name, one comparison, a version of digits and dots
#: (``transformers.utils.import_utils.split_package_version``). Anything else is cut short or fails there.
_CHECKABLE = re.compile(r"[A-Za-z0-9_-]+(==|!=|<=|>=|<|>)[0-9]+(\.[0-9]+)*")


def repo_generate(model: Any, *args: Any, **kwargs: Any) -> Any:
    """What the repository's ``custom_generate/generate.py`` calls: `model.generate`'s arguments, as transformers hands
    them to a repository, served by `hf_metasd.generation.generate_with_pool` (the checks and the decoding of
    ``hf_metasd.enable()``, without patching anything).

    The arguments transformers used to fetch the repository (`LOADING_KWARGS`) are dropped here: they were spent on
    loading. `assistant_models` is required: this repository is MetaSD, and a call without drafters is refused rather
    than silently decoded without them (transformers' lone ``assistant_model=`` is a pool of one, as on the other ways
    in: `hf_metasd.generation.one_pool`).
    """
    assistant_models = kwargs.pop("assistant_models", None)
    if assistant_models is None and kwargs.get("assistant_model") is None:
        raise MetaSDConfigError(
            "`assistant_models` must be passed with the hf_metasd `custom_generate` repository, but is None. "
            "Pass the drafters, `assistant_models=[drafter, ...]` or a `DrafterPool`, or drop `custom_generate` "
            "for plain `generate`."
        )
    for key in LOADING_KWARGS:
        kwargs.pop(key, None)
    return generate_with_pool(model, *args, assistant_models=assistant_models, **kwargs)


def requirements(version: str = __version__, requires: list[str] | None = None) -> list[str]:
    """The lines of ``custom_generate/requirements.txt``: hf-metasd and transformers, one bound a line.

    transformers checks each line as ``name OP digits`` (no commas, no ``.dev0``/``rc1`` suffixes: such a version
    makes its check raise), so a range takes one line per bound. hf-metasd: ``>=`` its release (``1.2.3`` for
    ``1.2.3.post1``; none for a development or pre-release version, which sorts below its release and which that
    grammar cannot write) and ``<`` the next release that may break the API (the next minor below 1.0, the next major
    from 1.0). transformers: the bounds this hf-metasd was built
    with, from its installed metadata (`requires`; default: ``importlib.metadata.requires("hf-metasd")``).

    >>> requirements("0.1.0.dev0", ["transformers<6,>=5.24"])
    ['hf-metasd<0.2', 'transformers>=5.24', 'transformers<6']
    >>> requirements("1.2.3", ["transformers<6,>=5.24", "peft>=0.17; extra == 'peft'"])
    ['hf-metasd>=1.2.3', 'hf-metasd<2', 'transformers>=5.24', 'transformers<6']
    """
    parsed = Version(version)
    major, minor = (parsed.release + (0,))[:2]
    lines = [] if parsed.is_prerelease else [f"hf-metasd>={parsed.base_version}"]
    lines.append(f"hf-metasd<{major}.{minor + 1}" if major == 0 else f"hf-metasd<{major + 1}")
    if requires is None:
        try:
            requires = importlib.metadata.requires("hf-metasd") or []
        except importlib.metadata.PackageNotFoundError as err:
            raise CustomGenerateRepoError(
                "hf-metasd must be installed to write its repository (transformers checks the installed version), "
                "but no installed metadata was found. Run `pip install -e .` in the clone, or install the wheel."
            ) from err
    found = [r for r in map(Requirement, requires) if canonicalize_name(r.name) == "transformers" and not r.marker]
    if len(found) != 1:
        raise CustomGenerateRepoError(
            f"hf-metasd's metadata must name transformers once, but names it {len(found)} times in {requires!r}. "
            "Reinstall hf-metasd (`pip install -e .` or the wheel)."
        )
    specs = sorted(found[0].specifier, key=lambda spec: (not spec.operator.startswith(">"), spec.version))
    lines += [f"transformers{spec.operator}{spec.version}" for spec in specs]
    unreadable = [line for line in lines if not _CHECKABLE.fullmatch(line)]
    if unreadable:
        raise CustomGenerateRepoError(
            f"a requirement must read `name OP digits` for transformers' check, but is {unreadable[0]!r}. "
            "Write the bound in pyproject.toml with ==, !=, <, <=, > or >= and a version of digits and dots."
        )
    return lines


_GENERATE_PY = '''\
"""MetaSD (multi-drafter speculative decoding) as a transformers `custom_generate` method.

Written by `hf-metasd custom-generate-repo` (hf-metasd {version}). transformers calls `generate(model=..., **the
arguments of model.generate)`; the installed hf_metasd does the work (`hf_metasd.custom_generate_repo.repo_generate`).
"""

from hf_metasd.custom_generate_repo import repo_generate


def generate(model, *args, **kwargs):
    """`model.generate(..., custom_generate=<this repository>, trust_remote_code=True, assistant_models=[...])`."""
    return repo_generate(model, *args, **kwargs)
'''

_README = """\
---
library_name: transformers
tags:
  - custom_generate
---

# MetaSD: multi-drafter speculative decoding

A pool of drafters instead of one `assistant_model`: every draft-and-verify round, a multi-armed-bandit policy picks
the drafter, the target verifies in transformers' assisted-decoding loop, and the policy learns which drafter saves
the most. The output is the target's own: token for token identical under greedy decoding, identically distributed
under sampling. This repository is a thin `custom_generate` entry point; the method is the
[hf_metasd](https://github.com/hf-metasd/hf_metasd) package (written by hf-metasd {version}).

## Base model

Any decoder-only causal LM of transformers as the target. Drafters: causal LMs that share the target's tokenizer,
peft models (one drafter per adapter), and hf_metasd `Drafter` objects (prompt lookup, the target's early layers,
a corpus of token sequences, a model with another tokenizer through `TokenizerBridgeDrafter`).

## Install

hf_metasd must be installed where `generate` runs (from a clone or a wheel built from one; see its documentation),
with the versions in `custom_generate/requirements.txt`:

```bash
pip install -e path/to/hf_metasd      # or: pip install hf_metasd-*.whl
```

## Usage

`trust_remote_code=True` is required: transformers runs `custom_generate/generate.py` of this repository (a local
folder too), which calls the installed hf_metasd.

```python
out = target.generate(
    **inputs,
    custom_generate="REPO",            # this repository's id, or the path of its folder
    trust_remote_code=True,
    assistant_models=[drafter_a, drafter_b, drafter_c],
    max_new_tokens=128,
)
```

With a saved pool (drafters plus the call's defaults: policy, reward, draft length):

```python
from hf_metasd.pool import DrafterPool

pool = DrafterPool.from_pretrained("path/or/pool-repo", target=target)
out = target.generate(**inputs, custom_generate="REPO", trust_remote_code=True, assistant_models=pool)
```

## Additional arguments

`assistant_models` (required): a list of drafters or a `DrafterPool`. The `meta_*` arguments of hf_metasd
(`meta_policy`, `meta_policy_kwargs`, `meta_reward`, `meta_draft_length`, ...) and `num_assistant_tokens` work as
with `hf_metasd.enable()`. `stop_strings=[...]` needs `tokenizer=tokenizer` in the same call. Not with
`assistant_model`, `prompt_lookup_num_tokens` or `assistant_tokenizer` (put every drafter in the pool). A pinned
`revision=` (or `cache_dir=`, `token=`, ...) is used by transformers to fetch this repository and not passed on.

## Output type

What `generate` returns: a tensor of token ids, or with `return_dict_in_generate=True` transformers' output object
with one more field, `metasd` (per-round telemetry: drafter picked, tokens accepted, rewards, time;
`out.metasd.summary()`).

## Note

After `hf_metasd.enable()`, `generate` takes `assistant_models=` itself: call it without `custom_generate`.
"""


def write_custom_generate_repo(folder: str | Path, *, overwrite: bool = False) -> Path:
    """Write the repository layout into `folder` (created if missing) and return it: `FILES`, i.e. ``README.md``
    (a model card tagged ``custom_generate``), ``custom_generate/generate.py`` and
    ``custom_generate/requirements.txt`` (`requirements`).

    A folder that holds anything is refused unless `overwrite`, which replaces these three files and leaves every
    other file as it is (a model repository may hold weights beside them). Checked before anything is written.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise CustomGenerateRepoError(f"`folder` must be a folder, but {folder} is a file. Choose another path.")
    held = sorted(entry.name for entry in folder.iterdir()) if folder.is_dir() else []
    if held and not overwrite:
        shown = ", ".join(held[:5]) + (", ..." if len(held) > 5 else "")
        raise CustomGenerateRepoError(
            f"`folder` must be empty or new, but {folder} holds {len(held)} entries ({shown}). Choose another "
            f"folder, or pass `overwrite=True` (`--overwrite`) to replace {', '.join(FILES)} in it."
        )
    texts = {
        "README.md": _README.format(version=__version__),
        "custom_generate/generate.py": _GENERATE_PY.format(version=__version__),
        "custom_generate/requirements.txt": "\n".join(requirements()) + "\n",
    }
    for name in FILES:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(texts[name], encoding="utf-8", newline="\n")
    return folder
