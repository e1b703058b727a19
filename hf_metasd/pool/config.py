"""A pool's `config.json`: `DrafterPoolConfig` (the file of `DrafterSpec` entries), its validation and versions.

The file is sorted, indented JSON. `DrafterPoolConfig.validate` runs before every save and every load and reads
nothing: the checks every entry gets live here (a registered kind, paths that stay inside the pool, no key that asks
for code, at most `MAX_ARMS` arms), the checks of one kind live on the kind (`Drafter.validate_spec`), so this module
names no kind.

**A pool is data, and bounded.** A pool comes from the Hub: its file is untrusted input (`hf_metasd.untrusted`
says what loading one reads). Every number it sets has a range checked on load, and on save, so that a pool that
saves also loads: the top-level ones are in `DrafterPoolConfig` (`MAX_NUM_ASSISTANT_TOKENS`, `MAX_PRIOR_WEIGHT`,
`MAX_POLICY_SETTING`, `MAX_ARMS`), each kind documents the ranges of its `params` in its `to_spec` and checks them in
its `validate_spec` (upper bounds with `hf_metasd.drafters.spec.check_at_most`, the rest in its constructor). The
whole table is in docs/tutorials/pool_hub.md ("What a pool file may hold").

Versions: `format_version` is the layout version (`FORMAT_VERSION`). A file of a newer format is refused with the
versions to upgrade to; a file of a readable format that holds keys this version does not know (written by a newer
hf_metasd that added optional fields) loads with **one** warning naming them all, and so does a file that sets a
setting this version retired (`hf_metasd.settings.RETIRED_SETTINGS`): the keys are dropped, the pool loads.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import settings
from .._validation import check_real
from .._version import __version__
from ..drafters import DRAFTER_KINDS, tokenizer_fingerprint, unique_names
from ..drafters.spec import MAX_NUM_ASSISTANT_TOKENS, DrafterSpec, check_at_most, check_inside
from ..errors import DrafterCompatibilityError, InvalidPoolError, InvalidPoolTypeError, MetaSDConfigError
from ..policies import POLICY_REGISTRY, get_policy
from ..rewards import COST_AWARE_REWARDS, REWARDS, get_reward, is_cost_aware
from ..settings import DEFAULTS
from ..untrusted import nests_deeper

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

    Policy, reward and draft length default to `hf_metasd.settings.DEFAULTS`. A file written by a newer hf_metasd
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

    def check_tokenizer(self, tokenizer: Any) -> None:
        """A tokenizer given at load must be the one the pool was saved with (when the pool recorded one), else
        `DrafterCompatibilityError`."""
        if tokenizer is None or self.tokenizer_hash is None:
            return
        given = tokenizer_fingerprint(tokenizer)
        if given != self.tokenizer_hash:
            raise DrafterCompatibilityError(
                f"pool `tokenizer` must be the tokenizer the pool was saved with (fingerprint {self.tokenizer_hash}), "
                f"but the given one has fingerprint {given}: same-size vocabularies with other tokens would make "
                "every draft wrong. Load the pool for the target it was built for "
                f"({self.target or 'config.json `target`'}) with that target's tokenizer, or re-save the pool with "
                "`save_pretrained(..., tokenizer=tokenizer)` once its drafters use this tokenizer."
            )

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
        types; keys this version does not know (written by a newer one) and settings it no longer reads
        (`hf_metasd.settings.RETIRED_SETTINGS`) are dropped with one warning naming them."""
        if not isinstance(data, dict):
            raise InvalidPoolTypeError(
                f"{source} must hold a JSON object, but holds {type(data).__name__}. Re-save the pool with "
                "`DrafterPool.save_pretrained`."
            )
        if nests_deeper(data, MAX_CONFIG_DEPTH):
            raise InvalidPoolError(
                f"{source} must nest lists and objects at most {MAX_CONFIG_DEPTH} deep, but nests deeper. Restore the "
                f"file, or re-save the pool with `DrafterPool.save_pretrained`."
            )
        _check_format_version(data.get("format_version"), data.get("hf_metasd_version"), source)
        unknown = [k for k in data if k not in _TOP_TYPES]
        retired = [k for k in unknown if k in settings.RETIRED_SETTINGS]  # read now: the list grows with versions
        unknown = [k for k in unknown if k not in retired]
        kwargs = {k: _typed(data[k], _TOP_TYPES[k], k, source) for k in _TOP_TYPES if k in data}
        specs = []
        for i, entry in enumerate(kwargs.get("drafters", [])):
            where = f"drafters[{i}]"
            if not isinstance(entry, dict):
                raise InvalidPoolTypeError(
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
        if unknown or retired:
            warnings.warn(_dropped_keys_message(config, source, unknown, retired), UserWarning, stacklevel=2)
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
        raise _error(version is not None and not _is_int(version))(
            f"{source} `format_version` must be an int >= 1, but is {shown}. {_RESAVE}"
        )
    if version > FORMAT_VERSION:
        raise InvalidPoolError(
            f"{source} must be in a pool format this hf_metasd reads (format <= {FORMAT_VERSION}), but it is format "
            f"{version}, written by hf_metasd {written_by}; this is hf_metasd {__version__}, which reads format "
            f"{FORMAT_VERSION}. Upgrade hf_metasd (`pip install -U hf-metasd`) to load this pool."
        )


def _dropped_keys_message(config: DrafterPoolConfig, source: str, unknown: list[str], retired: list[str]) -> str:
    """The one warning of `DrafterPoolConfig.from_dict` for the keys it dropped: settings this version retired (with
    why, where `RETIRED_SETTINGS` says), and keys it does not know (written by a newer version)."""
    parts = []
    if retired:
        why = settings.RETIRED_SETTINGS
        reasons = [f"{k} ({why[k]})" if isinstance(why, dict) and why.get(k) else k for k in retired]
        parts.append(
            f"{source} sets {retired}, settings this hf_metasd {__version__} no longer reads; they are dropped: "
            f"{'; '.join(reasons)}. Re-save the pool with `DrafterPool.save_pretrained` to drop them from the file."
        )
    if unknown:
        parts.append(
            f"{source} was written by hf_metasd {config.hf_metasd_version} (format {config.format_version}); this is "
            f"hf_metasd {__version__} (format {FORMAT_VERSION}), and it has keys this version does not know, "
            f"ignored: {unknown}. Upgrade hf_metasd to use them."
        )
    return " ".join(parts)


def _check_no_code(params: dict[str, Any], where: str) -> None:
    """An entry's `params` must not hold a key that asks for code (`CODE_KEYS`): refused, not ignored."""
    for key in CODE_KEYS:
        if key in params:
            raise InvalidPoolError(
                f"{where} `params` must not hold `{key}` (a pool is data: hf_metasd never runs code from it), but "
                f"holds {key}={params[key]!r}. Remove the key; every load passes `trust_remote_code=False`."
            )


def _typed(value: Any, types: tuple[type, ...], key: str, source: str) -> Any:
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
        raise InvalidPoolTypeError(
            f"{source} `{key}` must be {names}, but is {value!r}. Fix the value, or re-save the pool with "
            "`DrafterPool.save_pretrained`."
        )
    return value


def validate_defaults(policy: Any, policy_kwargs: Any, reward: Any, num_assistant_tokens: Any) -> None:
    """The defaults a pool brings to generate (policy and its settings, reward, draft length) must be savable."""
    if not isinstance(policy, str):
        raise InvalidPoolTypeError(
            f"pool `policy` must be a registered policy name (instances cannot be saved), but is "
            f'{type(policy).__name__}. Pass the name, e.g. "ucb", or give the instance as `meta_policy=` to generate.'
        )
    try:
        json.dumps(policy_kwargs or {})
    except (TypeError, ValueError, RecursionError) as err:
        raise InvalidPoolTypeError(
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
        raise InvalidPoolTypeError(
            f"pool `reward` must be a reward name in {sorted(REWARDS)} (callables cannot be saved), but is "
            f"{type(reward).__name__}. Use a name, or pass the callable as `meta_reward=` to generate."
        )
    try:
        get_reward(reward)
    except MetaSDConfigError as err:
        raise InvalidPoolError(f"pool reward {reward!r} is invalid: {err}") from err
    if not _is_int(num_assistant_tokens) or num_assistant_tokens < 1:
        raise _error(not _is_int(num_assistant_tokens))(
            f"pool `num_assistant_tokens` must be an int >= 1, but is {num_assistant_tokens!r}. "
            f"Use e.g. {DEFAULTS['num_assistant_tokens']}."
        )
    if num_assistant_tokens > MAX_NUM_ASSISTANT_TOKENS:
        raise InvalidPoolError(
            f"pool `num_assistant_tokens` must be at most {MAX_NUM_ASSISTANT_TOKENS}, but is {num_assistant_tokens!r}. "
            f"Use e.g. {DEFAULTS['num_assistant_tokens']} (`generate` refuses a longer draft too)."
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
        raise InvalidPoolTypeError(
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
            raise _error(not isinstance(name, str))(
                f"pool `priors` must name the pool's drafters {arms} or {NO_DRAFT!r}, but has {name!r}. Fix the name, "
                "or drop that prior."
            )
        if name == NO_DRAFT and isinstance(reward, str) and not is_cost_aware(reward):
            raise InvalidPoolError(
                f"pool `priors` may name {NO_DRAFT!r} only with a cost-aware reward {sorted(COST_AWARE_REWARDS)} (the "
                f"only ones that can score the no-draft arm), but the pool's reward is {reward!r}. Use e.g. "
                f'reward "speed", or drop the {NO_DRAFT!r} prior.'
            )
        hint = "Use the drafter's mean reward under the pool's reward, in [0, 1]."
        _check_pool_real(f"priors[{name!r}]", value, low=0.0, high=1.0, hint=hint)
    if prior_weight is not None:
        hint = "Use e.g. 2.0 (each prior counts as that many rounds), or None for the policy's default."
        _check_pool_real("prior_weight", prior_weight, low=0.0, low_open=True, hint=hint)
        if prior_weight > MAX_PRIOR_WEIGHT:
            raise InvalidPoolError(
                f"pool `prior_weight` must be at most {MAX_PRIOR_WEIGHT:g}, but is {prior_weight!r}. Use e.g. 2.0 (each "
                "prior counts as that many rounds), or None for the policy's default."
            )


def _check_pool_real(name: str, value: Any, **bounds: Any) -> None:
    """`hf_metasd._validation.check_real` for a pool field: its message as an `InvalidPoolError` (an
    `InvalidPoolTypeError` when `value` is no number)."""
    try:
        check_real(name, value, **bounds)
    except ValueError as err:
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        raise _error(not is_number)(f"pool {err}") from err


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _error(wrong_type: bool) -> type[InvalidPoolError]:
    """`InvalidPoolTypeError` (also a `TypeError`) for a value of the wrong type, else `InvalidPoolError`."""
    return InvalidPoolTypeError if wrong_type else InvalidPoolError


def _check_tokenizer_hash(value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not re.fullmatch(r"[0-9a-f]{64}", value)):
        raise _error(not isinstance(value, str))(
            f"pool `tokenizer_hash` must be a sha256 hex digest from `tokenizer_fingerprint`, but is {value!r}. "
            "Re-save the pool with `save_pretrained(..., tokenizer=tokenizer)`, or drop `tokenizer_hash`."
        )
