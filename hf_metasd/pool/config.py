"""A pool's `config.json`: `DrafterSpec` (one entry), `DrafterPoolConfig` (the file), their validation and versions.

The file is sorted, indented JSON. `DrafterPoolConfig.validate` runs before every save and every load and reads
nothing: the checks every entry gets live here (a registered kind, paths that stay inside the pool, no key that asks
for code, at most `MAX_ARMS` arms), the checks of one kind live on the kind (`Drafter.validate_spec`), so this module
names no kind.

**A pool is data, and bounded.** A pool comes from the Hub: its file is untrusted input (`hf_metasd.pool.untrusted`
says what loading one reads). Every number it sets has a range checked on load, and on save, so that a pool that
saves also loads: the top-level ones are in `DrafterPoolConfig` (`MAX_NUM_ASSISTANT_TOKENS`, `MAX_PRIOR_WEIGHT`,
`MAX_POLICY_SETTING`, `MAX_ARMS`), each kind documents the ranges of its `params` in its `to_spec` and checks them in
its `validate_spec` (upper bounds with `check_at_most`, the rest in its constructor). The whole table is in
docs/tutorials/pool_hub.md ("What a pool file may hold").

Versions: `format_version` is the layout version (`FORMAT_VERSION`). A file of a newer format is refused with the
versions to upgrade to; a file of a readable format that holds keys this version does not know (written by a newer
hf_metasd that added optional fields) loads with **one** warning naming them all.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._validation import check_real
from .._version import __version__
from ..drafters import DRAFTER_KINDS, unique_names
from ..errors import InvalidPoolError, MetaSDConfigError
from ..policies import POLICY_REGISTRY, get_policy
from ..rewards import COST_AWARE_REWARDS, REWARDS, get_reward, is_cost_aware
from ..settings import DEFAULTS

__all__ = [
    "CODE_KEYS",
    "CONFIG_NAME",
    "FORMAT_VERSION",
    "MAX_ARMS",
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_DEPTH",
    "MAX_NUM_ASSISTANT_TOKENS",
    "MAX_POLICY_SETTING",
    "MAX_PRIOR_WEIGHT",
    "NO_DRAFT",
    "DrafterPoolConfig",
    "DrafterSpec",
    "check_at_most",
    "check_inside",
    "validate_defaults",
    "validate_priors",
]

#: Version of the `config.json` layout. Bump it when a field changes meaning; new optional fields do not need it.
FORMAT_VERSION = 1
CONFIG_NAME = "config.json"
#: the name of the no-draft arm in `priors` (the candidate generator's arm that drafts nothing).
NO_DRAFT = "no_draft"
#: optional top-level fields written only when set, so that older hf_metasd versions read such pools without a warning.
_OMITTED_WHEN_NONE = ("priors", "prior_weight", "tokenizer_hash")
_RESAVE = "Re-save the pool with `DrafterPool.save_pretrained`."
#: Most tokens a pool may set as its draft length (`num_assistant_tokens`): far above the 3-20 that pay off, far below
#: a length whose bookkeeping alone slows a call (10,000,000 made 12 new tokens take 40 s).
MAX_NUM_ASSISTANT_TOKENS = 128
#: Most arms a pool may hold (drafters, a LoRA entry counting one arm per adapter).
MAX_ARMS = 64
#: Most pseudo-observations a prior may count as (`prior_weight`).
MAX_PRIOR_WEIGHT = 10_000.0
#: Largest number in `policy_kwargs` (each policy checks its own range on top, see its settings).
MAX_POLICY_SETTING = 1e6
#: `params` keys that ask for code: a pool never runs code, so an entry that holds one is refused (not ignored).
CODE_KEYS = ("auto_map", "class_path", "trust_remote_code")
#: Deepest nesting of lists and objects in a pool's `config.json` (a written one nests 4 deep).
MAX_CONFIG_DEPTH = 16
#: Largest `config.json` a load reads (a pool of `MAX_ARMS` drafters writes a few tens of KB).
MAX_CONFIG_BYTES = 4 * 2**20


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


_TOP_TYPES: dict[str, tuple[type, ...]] = {
    "drafters": (list,),
    "target": (str, type(None)),
    "policy": (str,),
    "policy_kwargs": (dict,),
    "reward": (str,),
    "num_assistant_tokens": (int,),
    "hf_metasd_version": (str,),
    "format_version": (int,),
    "tokenizer_hash": (str, type(None)),
    "priors": (dict, type(None)),
    "prior_weight": (int, float, type(None)),
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
        reward: a reward name (`hf_metasd.rewards.REWARDS`).
        num_assistant_tokens: tokens drafted per round, in ``[1, MAX_NUM_ASSISTANT_TOKENS]`` (128).
        hf_metasd_version: version of hf_metasd that wrote the file.
        format_version: layout version (`FORMAT_VERSION`), an int >= 1.
        tokenizer_hash: `hf_metasd.drafters.tokenizer_fingerprint` of the tokenizer the pool's drafters use (the
            target's), or ``None`` (unknown). Loading with ``tokenizer=`` compares it.
        priors: prior mean reward per arm name (the names a call reports: drafter names, ``#k``-suffixed where
            repeated; ``"no_draft"`` is the no-draft arm of a cost-aware reward), in ``[0, 1]`` under the pool's
            `reward`, or ``None``. Generate applies them when a call uses the pool's reward.
        prior_weight: pseudo-observations each prior counts as, in ``(0, MAX_PRIOR_WEIGHT]`` (10,000), or ``None``
            for the policy's default.

    Policy, reward and draft length default to `hf_metasd.generation.DEFAULTS`. A file written by a newer hf_metasd
    may hold keys this version does not know: they are ignored with **one** warning naming them all.

    Ranges checked by `validate` (on every save and load): the ones above; every number in `policy_kwargs` at most
    `MAX_POLICY_SETTING` (1e6), on top of the policy's own checks; at most `MAX_ARMS` (64) arms; no `params` key in
    `CODE_KEYS`; each kind's `params` as its `to_spec` documents them. `from_json_file` also refuses a file larger
    than `MAX_CONFIG_BYTES` (4 MiB), `from_dict` one nested deeper than `MAX_CONFIG_DEPTH` (16).

    Example:
        >>> config = DrafterPoolConfig([DrafterSpec("prompt_lookup", "pl")], priors={"pl": 0.4})
        >>> config.validate()
        >>> config.reward, json.loads(config.to_json_string())["priors"]
        ('speed', {'pl': 0.4})
    """

    drafters: list[DrafterSpec] = field(default_factory=list)
    target: str | None = None
    policy: str = DEFAULTS["meta_policy"]
    policy_kwargs: dict[str, Any] = field(default_factory=dict)
    reward: str = DEFAULTS["meta_reward"]
    num_assistant_tokens: int = DEFAULTS["num_assistant_tokens"]
    hf_metasd_version: str = __version__
    format_version: int = FORMAT_VERSION
    tokenizer_hash: str | None = None
    priors: dict[str, float] | None = None
    prior_weight: float | None = None

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Raise `InvalidPoolError` if this config cannot make a working pool (nothing is read or downloaded)."""
        _check_format_version(self.format_version, self.hf_metasd_version, "pool config")
        validate_defaults(self.policy, self.policy_kwargs, self.reward, self.num_assistant_tokens)
        if not self.drafters:
            raise InvalidPoolError(
                "pool `drafters` must hold at least one drafter, but is empty. Add a drafter, e.g. "
                "`DrafterPool([PromptLookupDrafter()])`."
            )
        names: list[str] = []
        for i, spec in enumerate(self.drafters):
            where = f"drafter {spec.name!r} (drafters[{i}])"
            cls = DRAFTER_KINDS.get(spec.kind)
            if cls is None:
                raise InvalidPoolError(
                    f"{where} must be of a registered kind {sorted(DRAFTER_KINDS)}, but its kind is {spec.kind!r}. "
                    "Register the kind with `hf_metasd.drafters.register_drafter_kind` before loading, or fix `kind`."
                )
            _check_no_code(spec.params, where)
            check_inside(spec.params.get("head_token_ids"), f"{where} `params.head_token_ids`")
            if spec.stored:
                check_inside(spec.path, f"{where} `path`")
            cls.validate_spec(spec, where)
            names += cls.arm_names(spec)
            if len(names) > MAX_ARMS:
                raise InvalidPoolError(
                    f"pool must hold at most {MAX_ARMS} arms (drafters, one per adapter of a `lora` entry), but "
                    f"drafters[:{i + 1}] already hold {len(names)}. Split the pool, or drop drafters."
                )
        _check_tokenizer_hash(self.tokenizer_hash)
        validate_priors(self.priors, self.prior_weight, names, self.policy, self.reward)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """The fields as plain data (optional fields that are unset are left out)."""
        data = asdict(self)
        for key in _OMITTED_WHEN_NONE:
            if data[key] is None:
                del data[key]
        return data

    def to_json_string(self) -> str:
        """Sorted, indented JSON (stable diffs on the Hub)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def save(self, directory: str | os.PathLike) -> Path:
        """Validate, then write `config.json` into `directory`; returns the file's path. An invalid config writes
        nothing (not even the folder)."""
        self.validate()
        return self._write(directory)

    def _write(self, directory: str | os.PathLike) -> Path:
        """Write without validating (the caller validated this very config)."""
        path = Path(directory) / CONFIG_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json_string(), encoding="utf-8")
        return path

    @classmethod
    def from_dict(cls, data: Any, *, source: str = CONFIG_NAME) -> DrafterPoolConfig:
        """Build a config from parsed JSON: the format version is checked first (a newer one is refused), then the
        types; unknown keys are ignored with one warning."""
        if not isinstance(data, dict):
            raise InvalidPoolError(
                f"{source} must hold a JSON object, but holds {type(data).__name__}. Re-save the pool with "
                "`DrafterPool.save_pretrained`."
            )
        _check_depth(data, source)
        _check_format_version(data.get("format_version"), data.get("hf_metasd_version"), source)
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
        if unknown:
            warnings.warn(
                f"{source} was written by hf_metasd {config.hf_metasd_version} (format {config.format_version}); "
                f"this is hf_metasd {__version__} (format {FORMAT_VERSION}), and it has keys this version does not "
                f"know, ignored: {unknown}. Upgrade hf_metasd to use them.",
                UserWarning,
                stacklevel=2,
            )
        return config

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> DrafterPoolConfig:
        """Read and check a `config.json` (see `from_dict`)."""
        path = Path(path)
        if not path.is_file():
            raise InvalidPoolError(
                f"a pool folder must hold `{CONFIG_NAME}`, but {str(path.parent)!r} has none. Point to a folder "
                "written by `DrafterPool.save_pretrained`, or write its config with `DrafterPoolConfig.save`."
            )
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise InvalidPoolError(
                f"{str(path)!r} must be at most {MAX_CONFIG_BYTES} bytes, but has {path.stat().st_size}. Restore the "
                "file, or re-save the pool with `DrafterPool.save_pretrained`."
            )
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, RecursionError) as err:  # bad JSON or UTF-8 (ValueErrors), nesting too deep to parse
            raise InvalidPoolError(
                f"{str(path)!r} must be valid JSON, but is not ({type(err).__name__}: {err}). Restore the file, or "
                "re-save the pool with `DrafterPool.save_pretrained`."
            ) from err
        return cls.from_dict(data, source=str(path))


# ======================================================================================================================
# checks
# ======================================================================================================================
def _check_format_version(version: Any, written_by: Any, source: str) -> None:
    """`format_version` must be an int in [1, FORMAT_VERSION]; a newer one names both versions and says to upgrade."""
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        shown = "missing" if version is None else repr(version)
        raise InvalidPoolError(f"{source} `format_version` must be an int >= 1, but is {shown}. {_RESAVE}")
    if version > FORMAT_VERSION:
        raise InvalidPoolError(
            f"{source} must be in a pool format this hf_metasd reads (format <= {FORMAT_VERSION}), but it is format "
            f"{version}, written by hf_metasd {written_by}; this is hf_metasd {__version__}, which reads format "
            f"{FORMAT_VERSION}. Upgrade hf_metasd (`pip install -U hf-metasd`) to load this pool."
        )


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


def _check_no_code(params: dict[str, Any], where: str) -> None:
    """An entry's `params` must not hold a key that asks for code (`CODE_KEYS`): refused, not ignored."""
    for key in CODE_KEYS:
        if key in params:
            raise InvalidPoolError(
                f"{where} `params` must not hold `{key}` (a pool is data: hf_metasd never runs code from it), but "
                f"holds {key}={params[key]!r}. Remove the key; every load passes `trust_remote_code=False`."
            )


def _check_depth(data: Any, source: str) -> None:
    """Lists and objects in `data` must nest at most `MAX_CONFIG_DEPTH` deep (checked without recursion)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_CONFIG_DEPTH:
                raise InvalidPoolError(
                    f"{source} must nest lists and objects at most {MAX_CONFIG_DEPTH} deep, but nests deeper. Restore "
                    f"the file, or re-save the pool with `DrafterPool.save_pretrained`."
                )
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))


def _typed(value: Any, types: tuple[type, ...], key: str, source: str) -> Any:
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
        raise InvalidPoolError(
            f"{source} `{key}` must be {names}, but is {value!r}. Fix the value, or re-save the pool with "
            "`DrafterPool.save_pretrained`."
        )
    return value


def validate_defaults(policy: Any, policy_kwargs: Any, reward: Any, num_assistant_tokens: Any) -> None:
    """The defaults a pool brings to generate (policy and its settings, reward, draft length) must be savable."""
    if not isinstance(policy, str):
        raise InvalidPoolError(
            f"pool `policy` must be a registered policy name (instances cannot be saved), but is "
            f'{type(policy).__name__}. Pass the name, e.g. "ucb", or give the instance as `meta_policy=` to generate.'
        )
    try:
        json.dumps(policy_kwargs or {})
    except (TypeError, ValueError, RecursionError) as err:
        raise InvalidPoolError(
            f"pool `policy_kwargs` must be JSON-serialisable to be saved, but is {policy_kwargs!r}. Use plain numbers, "
            "strings and lists."
        ) from err
    for key, value in (policy_kwargs or {}).items():
        check_at_most(value, f"pool `policy_kwargs[{key!r}]`", MAX_POLICY_SETTING)
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
            f"Use e.g. {DEFAULTS['num_assistant_tokens']}."
        )
    if num_assistant_tokens > MAX_NUM_ASSISTANT_TOKENS:
        raise InvalidPoolError(
            f"pool `num_assistant_tokens` must be at most {MAX_NUM_ASSISTANT_TOKENS}, but is {num_assistant_tokens!r}. "
            f"Use e.g. {DEFAULTS['num_assistant_tokens']} (pass a longer draft to `generate` itself if you mean it)."
        )


def validate_priors(priors: Any, prior_weight: Any, names: list[str], policy: str, reward: str) -> None:
    """`priors` must map the pool's arm names (its drafter names, ``#k``-suffixed where repeated as
    `hf_metasd.drafters.unique_names` does, or ``"no_draft"`` with a cost-aware reward) to means in [0, 1], for a
    policy that keeps means; `prior_weight` must be in ``(0, MAX_PRIOR_WEIGHT]`` and only comes with `priors`.

    Example:
        >>> validate_priors({"code": 0.8, "no_draft": 0.3}, 2.0, ["code", "math"], "ucb", "speed")
        >>> validate_priors({"cod": 0.8}, None, ["code", "math"], "ucb", "speed")
        Traceback (most recent call last):
        ...
        hf_metasd.errors.InvalidPoolError: pool `priors` must name the pool's drafters ['code', 'math'] or 'no_draft', but has 'cod'. Fix the name, or drop that prior.
    """
    if priors is None:
        if prior_weight is not None:
            raise InvalidPoolError(
                f"pool `prior_weight` must be None when there are no `priors`, but is {prior_weight!r}. Set `priors`, "
                "or drop `prior_weight`."
            )
        return
    if not isinstance(priors, dict):
        raise InvalidPoolError(
            f"pool `priors` must be a dict {{drafter name: prior mean reward}}, but is {type(priors).__name__}. "
            "Pass e.g. `{'code': 0.8, 'no_draft': 0.3}`."
        )
    policy_cls = POLICY_REGISTRY.get(policy)
    if priors and policy_cls is not None and not policy_cls.supports_prior:
        accepting = sorted(name for name, c in POLICY_REGISTRY.items() if c.supports_prior)
        raise InvalidPoolError(
            f"pool `priors` need a policy that keeps a mean reward per drafter, but policy {policy!r} does not. "
            f"Use one of {accepting}, or drop `priors`."
        )
    arms = unique_names(names)
    for name, value in priors.items():
        if not isinstance(name, str) or (name not in arms and name != NO_DRAFT):
            raise InvalidPoolError(
                f"pool `priors` must name the pool's drafters {arms} or {NO_DRAFT!r}, but has {name!r}. Fix the name, "
                "or drop that prior."
            )
        if name == NO_DRAFT and isinstance(reward, str) and not is_cost_aware(reward):
            raise InvalidPoolError(
                f"pool `priors` may name {NO_DRAFT!r} only with a cost-aware reward {sorted(COST_AWARE_REWARDS)} (the "
                f"only ones that can score the no-draft arm), but the pool's reward is {reward!r}. Use e.g. "
                f'reward "speed", or drop the {NO_DRAFT!r} prior.'
            )
        try:
            check_real(
                f"priors[{name!r}]",
                value,
                low=0.0,
                high=1.0,
                hint="Use the drafter's mean reward under the pool's reward, in [0, 1].",
            )
        except ValueError as err:
            raise InvalidPoolError(f"pool {err}") from err
    if prior_weight is not None:
        try:
            check_real(
                "prior_weight",
                prior_weight,
                low=0.0,
                low_open=True,
                hint="Use e.g. 2.0 (each prior counts as that many rounds), or None for the policy's default.",
            )
        except ValueError as err:
            raise InvalidPoolError(f"pool {err}") from err
        if prior_weight > MAX_PRIOR_WEIGHT:
            raise InvalidPoolError(
                f"pool `prior_weight` must be at most {MAX_PRIOR_WEIGHT:g}, but is {prior_weight!r}. Use e.g. 2.0 (each "
                "prior counts as that many rounds), or None for the policy's default."
            )


def _check_tokenizer_hash(value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not re.fullmatch(r"[0-9a-f]{64}", value)):
        raise InvalidPoolError(
            f"pool `tokenizer_hash` must be a sha256 hex digest from `tokenizer_fingerprint`, but is {value!r}. "
            "Re-save the pool with `save_pretrained(..., tokenizer=tokenizer)`, or drop `tokenizer_hash`."
        )
