"""A pool is data, never code, and bounded: the checks that make loading one as safe as loading safetensors.

A pool comes from the Hub, or from a folder someone else wrote: every file in it is untrusted input. Loading one
(`DrafterPool.from_pretrained`) therefore:

* **runs no code.** Every transformers load passes ``trust_remote_code=False`` (so transformers never asks on stdin),
  and a file that asks for code is refused, naming the file: ``auto_map`` in a ``config.json``,
  ``tokenizer_config.json`` or ``adapter_config.json`` the load would read (`check_no_remote_code`; loading the class
  transformers has built in instead of the one the file names would be a silent fallback), a ``trust_remote_code`` /
  ``class_path`` key in an entry's `params` (the pool's ``CODE_KEYS``). Weights are read from safetensors
  files only: a pickled ``.bin`` is refused.
* **reads only its own files.** A stored path is relative without ``..`` (`hf_metasd.drafters.spec.check_inside`), and
  every symbolic link in the pool folder must resolve inside it (`check_links`; for a Hub download, inside the repo's
  cache folder, whose snapshot files are links to its blobs). A drafter `path` that names a local folder outside the
  pool is refused unless the *caller* maps it (``from_pretrained(..., local_paths={path: folder})``); Hub repo ids
  stay allowed (transformers resolves them through the Hub, with ``trust_remote_code=False``).
* **parses bounded input**: JSON files are read by `read_json` (at most `MAX_JSON_BYTES`, nested at most
  `MAX_JSON_DEPTH`), and every number of the pool's `config.json` has a range (`hf_metasd.pool.config`, and each
  kind's `validate_spec`).
* **tokenizers**: see `check_tokenizer_folder`. The stored copy of the target's tokenizer must have the fingerprint
  the entry recorded.
* **fails as `InvalidPoolError`.** Whatever a library raises while reading a pool file, including pyo3's
  ``PanicException`` (a `BaseException`, not an `Exception`), becomes an `InvalidPoolError` naming the file and what to
  do (`reading_untrusted`). Only hf_metasd's own errors and `MemoryError` pass through as they are.

The pool's drafter kinds (`hf_metasd.drafters.load`), the pool itself (`hf_metasd.pool`) and a feature head's files
(`hf_metasd.feature_head.io`, its adapters) read untrusted files through these helpers; this module imports nothing
of theirs.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import InvalidPoolError, MetaSDConfigError

__all__ = [
    "KNOWN_PATTERNS",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "check_links",
    "check_no_remote_code",
    "check_tokenizer_folder",
    "is_rust_panic",
    "is_safe_pattern",
    "nests_deeper",
    "read_json",
    "reading_untrusted",
]

#: Largest JSON file a pool load parses (a large tokenizer.json is ~35 MB).
MAX_JSON_BYTES = 64 * 2**20
#: Deepest nesting of lists and objects in a JSON file a pool load parses (configs and tokenizers nest < 10 deep).
MAX_JSON_DEPTH = 64
#: The files a load hands to transformers / peft that may ask for code with ``auto_map``.
CODE_FILES = ("config.json", "tokenizer_config.json", "adapter_config.json")
#: The pre-tokenizer / normalizer patterns transformers and tokenizers write for the usual tokenizer families
#: (Qwen2, Llama 3 / cl100k, the o200k-style split transformers patches in, GPT-2, SentencePiece's whitespace rules,
#: BLOOM-style splits). Each is linear on adversarial texts (20,000 spaces, newlines, punctuation, mixed: < 20 ms).
KNOWN_PATTERNS = frozenset(
    {
        r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
        r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
        r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|"
        r"\s+(?!\S)|\s+",
        r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
        r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""",
        r"\A +| +\z",
        r" {2,}",
        r"\s+",
    }
)
#: What a short encode / decode at load reads (a tokenizer that cannot encode fails at load, not in generate).
PROBE_TEXT = "Hello world, 123 times!\n  Héllo\twörld."


# ======================================================================================================================
# errors: whatever a library raises on a pool file becomes an InvalidPoolError naming it
# ======================================================================================================================
def is_rust_panic(err: BaseException) -> bool:
    """Whether `err` is pyo3's ``PanicException`` (a Rust library such as tokenizers panicked); it derives from
    `BaseException` and cannot be imported by name, so it is recognised by its module and name."""
    return type(err).__module__ == "pyo3_runtime" and type(err).__name__ == "PanicException"


@contextmanager
def reading_untrusted(what: str, file: str | os.PathLike, fix: str) -> Iterator[None]:
    """Turn anything raised while a library reads the pool file `file` into an `InvalidPoolError`: ``"{what} must find
    a readable file at {file}, but reading it failed ({error}). {fix}"``.

    hf_metasd's own errors (`InvalidPoolError`, `MetaSDConfigError` such as `DrafterCompatibilityError`) and
    `MemoryError` pass as they are; a `BaseException` other than a Rust panic (``KeyboardInterrupt``) is re-raised.
    Catching every `Exception` is deliberate here: a parser of untrusted files may raise anything (``KeyError`` for an
    unknown tokenizer type, ``NotImplementedError``, ``UnpicklingError``...), and each one means the same thing.

    Example:
        >>> with reading_untrusted("drafter 'x'", "pool/tokenizer.json", "Restore it."):
        ...     raise KeyError("Foo")
        Traceback (most recent call last):
        ...
        hf_metasd.errors.InvalidPoolError: drafter 'x' must find a readable file at 'pool/tokenizer.json', but reading it failed (KeyError: 'Foo'). Restore it.
    """
    try:
        yield
    except (InvalidPoolError, MetaSDConfigError, MemoryError):
        raise
    except Exception as err:
        raise _unreadable(what, file, err, fix) from err
    except BaseException as err:
        if not is_rust_panic(err):
            raise
        raise _unreadable(what, file, err, fix) from err


def _unreadable(what: str, file: str | os.PathLike, err: BaseException, fix: str) -> InvalidPoolError:
    detail = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
    return InvalidPoolError(
        f"{what} must find a readable file at {str(file)!r}, but reading it failed ({type(err).__name__}: {detail}). "
        f"{fix}"
    )


# ======================================================================================================================
# JSON
# ======================================================================================================================
def read_json(path: str | os.PathLike, what: str, fix: str) -> Any:
    """The parsed JSON of the pool file `path`, or `InvalidPoolError` (naming `what`, the file and `fix`) when it is
    unreadable, larger than `MAX_JSON_BYTES`, not JSON, or nested deeper than `MAX_JSON_DEPTH`."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise InvalidPoolError(
                f"{what} must find a JSON file of at most {MAX_JSON_BYTES} bytes at {str(path)!r}, but it has {size}. "
                f"{fix}"
            )
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as err:  # ValueError: bad JSON or UTF-8; RecursionError: too deep
        raise InvalidPoolError(
            f"{what} must find valid JSON at {str(path)!r}, but it is not ({type(err).__name__}: {err}). {fix}"
        ) from err
    if nests_deeper(data, MAX_JSON_DEPTH):
        raise InvalidPoolError(
            f"{what} must find JSON nested at most {MAX_JSON_DEPTH} deep at {str(path)!r}, but it nests deeper. {fix}"
        )
    return data


def nests_deeper(data: Any, limit: int) -> bool:
    """Whether the lists and objects of parsed JSON `data` nest more than `limit` deep (checked without recursion).

    Example:
        >>> nests_deeper({"a": [1, [2]]}, 3), nests_deeper({"a": [1, [2]]}, 2)
        (False, True)
    """
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return False


def check_no_remote_code(folder: str | os.PathLike, where: str) -> None:
    """The `CODE_FILES` in `folder` must parse (`read_json`) and must not ask for code (a top-level ``auto_map``).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     _ = Path(folder, "config.json").write_text('{"model_type": "evil", "auto_map": {"AutoConfig": "x.C"}}')
        ...     check_no_remote_code(folder, "drafter 'd'")
        Traceback (most recent call last):
        ...
        hf_metasd.errors.InvalidPoolError: drafter 'd' must not ask for code, but .../config.json' has `auto_map` {'AutoConfig': 'x.C'}, which names Python files to run. A pool is data: hf_metasd loads with `trust_remote_code=False` and refuses such files. Use a drafter whose architecture transformers has built in (drop `auto_map`), or load the model yourself and build the pool in memory.
    """
    for name in CODE_FILES:
        path = Path(folder) / name
        if not path.is_file():
            continue
        data = read_json(path, where, "Restore the file, or re-save the pool from a working copy.")
        if isinstance(data, dict) and "auto_map" in data:
            raise InvalidPoolError(
                f"{where} must not ask for code, but {str(path)!r} has `auto_map` {data['auto_map']!r}, which names "
                "Python files to run. A pool is data: hf_metasd loads with `trust_remote_code=False` and refuses "
                "such files. Use a drafter whose architecture transformers has built in (drop `auto_map`), or load "
                "the model yourself and build the pool in memory."
            )


#: The largest LoRA rank and alpha a pool's adapter may ask for (peft builds each adapter's matrices from its
#: config before it reads a tensor: a small file with a large rank would allocate first).
MAX_LORA_RANK = 1024
MAX_LORA_ALPHA = 65536.0


def check_adapter_numbers(folder: str | os.PathLike, where: str) -> None:
    """The ranks and alphas in `folder`'s ``adapter_config.json`` must be bounded numbers: ``r`` and every value of
    ``rank_pattern`` an int in ``[1, MAX_LORA_RANK]``, ``lora_alpha`` and every value of ``alpha_pattern`` a finite
    number in ``(0, MAX_LORA_ALPHA]``, checked before peft builds the adapter.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     _ = Path(folder, "adapter_config.json").write_text('{"peft_type": "LORA", "r": 10000000}')
        ...     check_adapter_numbers(folder, "drafter 'd'")
        Traceback (most recent call last):
        ...
        hf_metasd.errors.InvalidPoolError: drafter 'd' must have `r` an int in [1, 1024] in .../adapter_config.json', but it is 10000000. Use an adapter of a smaller rank, or load it yourself and build the pool in memory.
    """
    path = Path(folder) / "adapter_config.json"
    data = read_json(path, where, "Restore the file, or re-save the pool from a working copy.")
    if not isinstance(data, dict):
        raise InvalidPoolError(
            f"{where} must have a JSON object in {str(path)!r}, but has {type(data).__name__}. "
            "Restore the file, or re-save the pool from a working copy."
        )
    fix = "Use an adapter of a smaller rank, or load it yourself and build the pool in memory."
    ranks = [("r", data.get("r", 8))]
    alphas = [("lora_alpha", data.get("lora_alpha", 8))]
    for key, out in (("rank_pattern", ranks), ("alpha_pattern", alphas)):
        pattern = data.get(key) or {}
        if not isinstance(pattern, dict):
            raise InvalidPoolError(
                f"{where} must have `{key}` an object in {str(path)!r}, but it is {pattern!r}. {fix}"
            )
        out += [(f"{key}[{name!r}]", value) for name, value in pattern.items()]
    for name, value in ranks:
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_LORA_RANK:
            raise InvalidPoolError(
                f"{where} must have `{name}` an int in [1, {MAX_LORA_RANK}] in {str(path)!r}, but it is {value!r}. {fix}"
            )
    for name, value in alphas:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not (math.isfinite(value) and 0 < value <= MAX_LORA_ALPHA):
            raise InvalidPoolError(
                f"{where} must have `{name}` a number in (0, {MAX_LORA_ALPHA:g}] in {str(path)!r}, but it is "
                f"{value!r}. {fix}"
            )


# ======================================================================================================================
# paths
# ======================================================================================================================
def boundary_of(root: str | os.PathLike) -> Path:
    """The folder every file of the pool at `root` must resolve inside: `root` itself, or, for a snapshot of the
    Hub cache (``.../models--org--name/snapshots/<commit>``, whose files are links to ``../../blobs/``), the repo's
    cache folder."""
    resolved = Path(root).resolve()
    if resolved.parent.name == "snapshots" and resolved.parent.parent.name.startswith(("models--", "datasets--")):
        return resolved.parent.parent
    return resolved


def check_links(root: str | os.PathLike) -> None:
    """Every symbolic link under `root` (files and folders) must resolve inside `boundary_of(root)`, else
    `InvalidPoolError` naming the link: a pool reads only its own files."""
    boundary = boundary_of(root)
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in (*dirs, *files):
            path = Path(folder) / name
            if not path.is_symlink():
                continue
            try:
                resolved = path.resolve(strict=True)
            except (OSError, RuntimeError) as err:  # a dangling link, or a loop
                raise InvalidPoolError(
                    f"pool file {str(path)!r} must be a file or folder of the pool, but it is a symbolic link that "
                    f"does not resolve ({err}). Replace the link with a copy of its target, or remove it."
                ) from err
            if not resolved.is_relative_to(boundary):
                raise InvalidPoolError(
                    f"pool file {str(path)!r} must stay inside the pool folder {str(boundary)!r}, but it is a symbolic "
                    f"link to {str(resolved)!r} outside it. A pool reads only its own files: replace the link with a "
                    "copy of its target, or pass the outside folder with `from_pretrained(..., local_paths=...)`."
                )


# ======================================================================================================================
# tokenizers
# ======================================================================================================================
def is_safe_pattern(pattern: str) -> bool:
    r"""Whether a tokenizer's regular expression matches in time linear in the text, by construction: one of
    `KNOWN_PATTERNS`, or *flat* (alternatives of single-character atoms: literals, escapes such as ``\p{L}``, classes,
    ``.``, anchors; no group, no quantifier, no back-reference or subroutine call). A flat pattern tries each
    alternative once per position, so it cannot backtrack.

    Example:
        >>> is_safe_pattern("."), is_safe_pattern(r"<\|im_start\|>|[\p{N}]"), is_safe_pattern(r" {2,}")
        (True, True, True)
        >>> is_safe_pattern("(a+)+b"), is_safe_pattern(r"\s*\s*[^\s]"), is_safe_pattern(r"(?:ab)|\1")
        (False, False, False)
    """
    if pattern in KNOWN_PATTERNS:
        return True
    i, n, depth = 0, len(pattern), 0  # depth: inside a character class (nested classes allowed)
    while i < n:
        char = pattern[i]
        if char == "\\":
            if i + 1 >= n or pattern[i + 1] in "123456789kgK":  # back-references, subroutine calls
                return False
            if pattern[i + 1] in "pPxo" and i + 2 < n and pattern[i + 2] == "{":  # \p{L}, \x{263a}, \o{17}
                end = pattern.find("}", i + 3)
                if end < 0:
                    return False
                i = end + 1
                continue
            i += 2
            continue
        if char == "[":
            depth += 1
            if i + 1 < n and pattern[i + 1] == "^":
                i += 1
            if i + 1 < n and pattern[i + 1] == "]":  # a leading "]" is a literal
                i += 1
        elif char == "]" and depth:
            depth -= 1
        elif not depth and char in "()*+?{}":
            return False
        i += 1
    return depth == 0


def _patterns(data: Any) -> Iterator[str]:
    """Every regular expression (``{"Regex": "..."}``) in a tokenizer.json tree (normalizers, pre-tokenizers,
    decoders), without recursion."""
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            pattern = value.get("Regex")
            if isinstance(pattern, str):
                yield pattern
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def check_tokenizer_folder(folder: str | os.PathLike, where: str, *, vouched: bool = False) -> None:
    r"""Before a pool tokenizer is loaded: its files ask for no code (`check_no_remote_code`) and, unless the caller
    `vouched` for the folder (``local_paths=``), every regular expression in its ``tokenizer.json`` is safe
    (`is_safe_pattern`).

    Why an allow-list. A tokenizer's regular expressions are programs for a backtracking engine (Oniguruma): with a
    pre-tokenizer ``(a+)+b`` a 30-character prompt took 0.82 s and a 34-character one made tokenizers panic, and even
    ``\s*\s*[^\s]`` takes 40 s on 3,000 spaces. Whether a pattern can backtrack that way is not something a short check
    decides, and a probe encode only tries texts the pool's author can steer around; the vocabulary fingerprint
    cannot vouch for a pattern either, since the author writes both. So a pool may only use patterns whose cost is
    known to be linear: the ones the usual tokenizer families write (`KNOWN_PATTERNS`, each checked on adversarial
    texts) and flat ones (linear by construction). A caller who trusts another tokenizer maps its folder with
    ``local_paths=``. After loading, a short encode / decode (`PROBE_TEXT`) makes a tokenizer that cannot encode
    fail at load rather than in the middle of `generate`.
    """
    check_no_remote_code(folder, where)
    path = Path(folder) / "tokenizer.json"
    if vouched or not path.is_file():
        return
    fix = "Restore the folder, or re-save the pool from a working copy of the drafter."
    for pattern in _patterns(read_json(path, where, fix)):
        if not is_safe_pattern(pattern):
            raise InvalidPoolError(
                f"{where} must use tokenizer patterns that match in linear time, but {str(path)!r} has the regular "
                f"expression {pattern[:120]!r}, which hf_metasd cannot vouch for (a pattern can make one encode take "
                "seconds, or panic). Use a tokenizer of a usual family, or, if you trust this one, pass its folder "
                "with `DrafterPool.from_pretrained(..., local_paths={<the folder recorded in config.json>: folder})`."
            )
