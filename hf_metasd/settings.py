"""`MetaSDSettings`: every setting a MetaSD call reads, typed, with its default, help text and valid values, built
once per call with transformers' precedence and validated once.

**Precedence** (as in transformers): a call's keyword argument wins over the same key on the `GenerationConfig`
passed to `generate`, which wins over ``model.generation_config``, which wins over the pool's defaults
(`DrafterPool`), which win over the defaults below (`DEFAULTS`). `resolve_settings` applies it; a ``meta_*`` key that
is no setting is refused (`check_setting_names`), and so is a setting that earlier versions had (`RETIRED_SETTINGS`).

Each field's metadata holds its ``help`` text and its ``valid`` values; `MetaSDSettings.describe` lists them.

Example:
    >>> settings = MetaSDSettings(meta_policy="ucb", num_assistant_tokens=4)
    >>> settings.meta_policy, settings.num_assistant_tokens, settings.meta_reward
    ('ucb', 4, 'speed')
    >>> MetaSDSettings(meta_replay="yes")
    Traceback (most recent call last):
    ...
    hf_metasd.errors.MetaSDTypeError: `meta_replay` must be True, False or None (automatic), but is 'yes'. Pass a bool, or leave it out.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from .draft_length import check_draft_length_mode
from .drafters.spec import MAX_NUM_ASSISTANT_TOKENS
from .errors import MetaSDConfigError, MetaSDTypeError
from .rewards import get_reward

if TYPE_CHECKING:
    from .policies import Policy
    from .rewards import RoundFeedback

__all__ = [
    "DEFAULTS",
    "META_KWARGS",
    "RETIRED_SETTINGS",
    "SETTINGS",
    "MetaSDSettings",
    "check_setting_names",
    "resolve_settings",
]


# ---------------------------------------------------------------------- one check per field
def _typed(types: tuple[type, ...], *, valid: str, hint: str, low: float | None = None, show_type: bool = False):
    """A check: `value` is one of `types` (a bool is not an int) and, for a number, at least `low`, or a
    `MetaSDTypeError` (wrong type) / `MetaSDConfigError` (out of range) reading "`name` must be `valid`, but is V.
    `hint`"."""

    def check(name: str, value: Any) -> None:
        typed = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if typed and (low is None or value is None or value >= low):
            return
        shown = f"{type(value).__name__} {value!r}" if show_type else repr(value)
        error = MetaSDConfigError if typed else MetaSDTypeError
        raise error(f"`{name}` must be {valid}, but is {shown}. {hint}")

    return check


def _draft_tokens(name: str, value: Any) -> None:
    """An int in ``[1, MAX_NUM_ASSISTANT_TOKENS]``, the bound a pool file's draft length has: a longer draft only adds
    bookkeeping (10,000,000 made 12 new tokens take 30 s and 156 MB)."""
    _typed((int,), valid="an int >= 1", hint="Use e.g. 3.", low=1)(name, value)
    if value > MAX_NUM_ASSISTANT_TOKENS:
        raise MetaSDConfigError(
            f"`{name}` must be at most {MAX_NUM_ASSISTANT_TOKENS} (rounds that pay off draft 3 to 20 tokens), "
            f"but is {value!r}. Use e.g. 3."
        )


def _reward(name: str, value: Any) -> None:
    get_reward(value)  # a registered name or a callable, else `UnknownRewardError`


def _draft_length(name: str, value: Any) -> None:
    check_draft_length_mode(value)


_NONE = type(None)
_AUTOMATIC = "True, False or None (automatic)"


def _setting(default: Any, help: str, valid: str, check: Callable[[str, Any], None] | None = None) -> Any:
    """A settings field: its default, help text, valid values (shown by `MetaSDSettings.describe`) and its check
    (``None``: checked where it is used, see `valid`)."""
    return field(default=default, metadata={"help": help, "valid": valid, "check": check})


@dataclass(frozen=True)
class MetaSDSettings:
    """Every setting of one MetaSD call (see the module docstring for the precedence that builds it).

    Frozen and validated when built: each field's check runs in `__post_init__`, so a `MetaSDSettings` in hand holds
    valid values (`dataclasses.replace` builds a checked copy). A field's ``help`` and ``valid`` are in its metadata.
    """

    num_assistant_tokens: int = _setting(
        3,
        "tokens drafted per round; with `meta_draft_length='measured'` the most a round drafts",
        f"an int in [1, {MAX_NUM_ASSISTANT_TOKENS}]",
        _draft_tokens,
    )
    meta_policy: str | Policy = _setting(
        "ucb_scaled",
        "a registered policy name (a fresh policy per call, as in the paper) or a `Policy` instance (keeps learning "
        "across calls: the serving pattern)",
        "a registered policy name or a `Policy` instance (checked by `get_policy` when the call builds its policy)",
    )
    meta_policy_kwargs: dict[str, Any] | None = _setting(
        None,
        'settings for a policy given by name, e.g. `{"beta": 0.5}`; they belong to the policy given with them',
        "a dict of policy settings, or None",
        _typed(
            (dict, _NONE),
            valid="a dict of policy settings",
            hint='Pass e.g. `meta_policy_kwargs={"beta": 0.5}`.',
            show_type=True,
        ),
    )
    meta_reward: str | Callable[[RoundFeedback], float] = _setting(
        "speed",
        "`speed` (tokens per second of the round, comparable with plain decoding), `bd`, `be`, `eal`, `cost` or a "
        "callable `f(RoundFeedback) -> float`",
        "a name of `hf_metasd.rewards.REWARDS` or a callable",
        _reward,
    )
    meta_skinny_gemm: bool | None = _setting(
        None,
        "the CPU verification kernel (`hf_metasd.kernels`): None measures which is faster on this machine, then "
        "checks that choice on the verification passes themselves; True / False force the transposed / stock product",
        _AUTOMATIC,
        _typed((bool, _NONE), valid=_AUTOMATIC, hint="Pass a bool, or leave it out."),
    )
    meta_no_draft: bool | None = _setting(
        None,
        "whether the policy may give a round to the target alone (None: when the reward is cost-aware, as `speed`)",
        _AUTOMATIC,
        _typed((bool, _NONE), valid=_AUTOMATIC, hint="Pass a bool, or leave it out."),
    )
    meta_replay: bool | None = _setting(
        None,
        "replayed rounds: the model-free drafters that did not draft a round are scored on it in hindsight, exactly "
        "(None: on under greedy decoding with a reward and a policy that can use them; True where they cannot apply "
        "is refused)",
        _AUTOMATIC,
        _typed((bool, _NONE), valid=_AUTOMATIC, hint="Pass a bool, or leave it out."),
    )
    meta_priors: dict[str, float] | None = _setting(
        None,
        "prior mean rewards by arm name (`no_draft` for the no-draft arm), given to the policy as pseudo-observations; "
        "a pool's priors apply when the call uses the pool's reward and a fresh policy that takes priors",
        "a dict of arm name -> prior mean reward, or None",
        _typed(
            (dict, _NONE),
            valid="a dict of arm name -> prior mean reward",
            hint='Pass e.g. `{"prompt_lookup": 0.4}`.',
            show_type=True,
        ),
    )
    meta_prior_weight: float | None = _setting(
        None,
        "pseudo-observations each prior counts as (None: the policy's default, 2)",
        "a float > 0, or None",
        _typed((int, float, _NONE), valid="a float > 0 or None", hint="Pass e.g. 2.0, or leave it out.", low=1e-12),
    )
    meta_learned_priors: bool = _setting(
        True,
        "every arm without a prior from the call starts from the mean reward it earned in earlier calls of this "
        "process with the same target (`hf_metasd.reward_memory`), when the policy is given by name and takes priors",
        "True or False",
        _typed((bool,), valid="True or False", hint="Pass a bool."),
    )
    meta_reproducible: bool = _setting(
        False,
        "a sampling call with a seed repeats its output: every choice (arm, draft length) then depends only on the "
        "prompt, the seed and the tokens, not on timings or earlier calls (`hf_metasd.reproducible`)",
        "True or False",
        _typed((bool,), valid="True or False", hint="Pass a bool."),
    )
    meta_draft_length: str = _setting(
        "measured",
        "`measured`: each round drafts the length, at most `num_assistant_tokens`, that maximises expected tokens per "
        "second (`hf_metasd.draft_length`); `fixed`: always `num_assistant_tokens`",
        "'measured' or 'fixed'",
        _draft_length,
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            check = f.metadata["check"]
            if check is not None:
                check(f.name, getattr(self, f.name))

    @classmethod
    def describe(cls) -> str:
        """One line per setting: name, default, valid values, help (what `help(hf_metasd.generate)` points to).

        Example:
            >>> print(MetaSDSettings.describe().splitlines()[0])
            num_assistant_tokens (default 3; an int in [1, 128]): tokens drafted per round; ...
        """
        return "\n".join(
            f"{f.name} (default {f.default!r}; {f.metadata['valid']}): {f.metadata['help']}" for f in fields(cls)
        )


#: The library's defaults for every MetaSD setting (the last level of the precedence), from `MetaSDSettings`.
DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(MetaSDSettings)}
#: Every setting a MetaSD call reads, by name.
SETTINGS = tuple(DEFAULTS)
#: keyword arguments that only mean something together with `assistant_models`.
META_KWARGS = tuple(k for k in SETTINGS if k.startswith("meta_"))
#: settings that earlier versions had and this one no longer reads, with why: a call or `GenerationConfig` that
#: sets one is refused (`check_setting_names`); a pool file that sets one loads with a warning naming it
RETIRED_SETTINGS: dict[str, str] = {
    "meta_full_information": "a full-information policy such as `meta_policy='hedge'` scores every drafter by itself",
    "meta_warm_start": "it was never measured to help, and under the `speed` reward it fed the policy BD scores",
    "meta_confidence_stop": "measured, it changed nothing (docs/concepts.md)",
    "meta_match_routing": "measured, it changed nothing (docs/concepts.md)",
    "meta_prefill_gate": "measured, it did not help (docs/concepts.md)",
}


# ---------------------------------------------------------------------- names and precedence
def check_setting_names(keys: Any, where: str, *, unknown: bool = True) -> None:
    """Refuse a removed setting (`RETIRED_SETTINGS`, saying why it was removed) among `keys`, and with `unknown` a
    ``meta_*`` key that is no setting (the message lists the settings and names the closest one). `where` names the
    keys' place in the message.

    Example:
        >>> check_setting_names(["meta_policy", "max_new_tokens"], "`generate`'s keyword arguments")
        >>> check_setting_names(["meta_polcy"], "`generate`'s keyword arguments")
        Traceback (most recent call last):
        ...
        hf_metasd.errors.MetaSDConfigError: `generate`'s keyword arguments must use the MetaSD settings [...], but has unknown ['meta_polcy']. Did you mean 'meta_policy'? Fix the spelling or drop the key.
    """
    retired = [k for k in keys if k in RETIRED_SETTINGS]
    if retired:
        raise MetaSDConfigError(
            f"{where} must not set `{retired[0]}`, but set it: the setting was removed "
            f"({RETIRED_SETTINGS[retired[0]]}). Drop it."
        )
    wrong = sorted(k for k in keys if isinstance(k, str) and k.startswith("meta_") and k not in SETTINGS)
    if unknown and wrong:
        close = difflib.get_close_matches(wrong[0], META_KWARGS, n=1)
        raise MetaSDConfigError(
            f"{where} must use the MetaSD settings {sorted(META_KWARGS)}, but has unknown {wrong}. "
            + (f"Did you mean {close[0]!r}? " if close else "")
            + "Fix the spelling or drop the key."
        )


def _config_value(generation_config: Any, key: str) -> Any:
    """A setting from the call's merged `GenerationConfig` (passed config over the model's), or None if unset.

    transformers fills `num_assistant_tokens` with its global default (20) when nothing set it; that value is
    treated as unset, so the pool's draft length applies (pass ``num_assistant_tokens=20`` to `generate` to ask for
    exactly 20).
    """
    value = getattr(generation_config, key, None)
    if key == "num_assistant_tokens" and value is not None:
        defaults = generation_config._get_default_generation_params()
        if value == defaults.get("num_assistant_tokens"):
            return None
    return value


def resolve_settings(
    call: Mapping[str, Any], generation_config: Any = None, pool_defaults: Mapping[str, Any] | None = None
) -> MetaSDSettings:
    """The call's `MetaSDSettings`, each setting from the first level that sets it (not None): `call` (the keyword
    arguments of `generate`) > `generation_config` (the call's merged `GenerationConfig`) > `pool_defaults` > the
    defaults. ``meta_policy_kwargs`` come from the level that gave the policy (a call that names a policy without
    settings gets that policy's defaults, not the pool's settings for another policy).

    Example:
        >>> from transformers import GenerationConfig
        >>> settings = resolve_settings({"meta_reward": "be"}, GenerationConfig(meta_policy="exp3"),
        ...                             {"num_assistant_tokens": 4, "meta_policy": "ucb"})
        >>> settings.meta_reward, settings.meta_policy, settings.num_assistant_tokens
        ('be', 'exp3', 4)
    """
    config: dict[str, Any] = {}
    if generation_config is not None:
        check_setting_names(vars(generation_config), "the `GenerationConfig`")
        config = {key: _config_value(generation_config, key) for key in SETTINGS}
    levels = [call, config, pool_defaults or {}]
    values: dict[str, Any] = {}
    for key in SETTINGS:
        given = [level[key] for level in levels if level.get(key) is not None]
        if given:
            values[key] = given[0]
    policy_level = next((level for level in levels if level.get("meta_policy") is not None), None)
    if policy_level is not None:
        kwargs = policy_level.get("meta_policy_kwargs")
        values["meta_policy_kwargs"] = kwargs if kwargs is not None else call.get("meta_policy_kwargs")
    return MetaSDSettings(**values)
