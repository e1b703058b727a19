"""`MetaSDSettings`: one typed, frozen, validated object per call, built with transformers' precedence."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest
import torch
from conftest import greedy, metasd_greedy, prompts
from transformers import GenerationConfig

import hf_metasd
from hf_metasd.errors import MetaSDConfigError, MetaSDTypeError, UnknownRewardError
from hf_metasd.settings import (
    DEFAULTS,
    META_KWARGS,
    RETIRED_SETTINGS,
    SETTINGS,
    MetaSDSettings,
    check_setting_names,
    resolve_settings,
)

PROMPT = prompts(1)[0]


def test_defaults_settings_and_meta_kwargs_come_from_the_dataclass():
    fields = dataclasses.fields(MetaSDSettings)
    assert list(DEFAULTS) == [f.name for f in fields] == list(SETTINGS)
    assert dataclasses.asdict(MetaSDSettings()) == DEFAULTS
    assert tuple(name for name in SETTINGS if name != "num_assistant_tokens") == META_KWARGS
    assert hf_metasd.generation.DEFAULTS is DEFAULTS and hf_metasd.generation.SETTINGS is SETTINGS
    assert not set(RETIRED_SETTINGS) & set(SETTINGS)


def test_every_setting_has_help_and_valid_values_and_describe_lists_them():
    lines = MetaSDSettings.describe().splitlines()
    assert len(lines) == len(SETTINGS)
    for f, line in zip(dataclasses.fields(MetaSDSettings), lines):
        assert f.metadata["help"] and f.metadata["valid"]
        assert line.startswith(f"{f.name} (default {f.default!r}; {f.metadata['valid']}): ")


def test_generate_names_every_setting_and_every_removed_one_in_its_signature():
    # transformers hands a callable `custom_generate` only the keyword arguments its signature names
    parameters = inspect.signature(hf_metasd.generate).parameters
    assert set(SETTINGS) <= set(parameters) and set(RETIRED_SETTINGS) <= set(parameters)
    assert all(parameters[name].default is None for name in (*SETTINGS, *RETIRED_SETTINGS))


def test_settings_are_frozen_and_a_replaced_copy_is_checked_again():
    settings = MetaSDSettings(meta_policy="ucb")
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.meta_policy = "exp3"
    assert dataclasses.replace(settings, num_assistant_tokens=5).num_assistant_tokens == 5
    with pytest.raises(
        MetaSDConfigError, match=r"`num_assistant_tokens` must be an int >= 1, but is 0\. Use e\.g\. 3"
    ):
        dataclasses.replace(settings, num_assistant_tokens=0)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_assistant_tokens": 2.5}, r"`num_assistant_tokens` must be an int >= 1, but is 2\.5\. Use e\.g\. 3\."),
        ({"num_assistant_tokens": True}, r"`num_assistant_tokens` must be an int >= 1, but is True\."),
        (
            {"meta_replay": "yes"},
            r"`meta_replay` must be True, False or None \(automatic\), but is 'yes'\. Pass a bool",
        ),
        ({"meta_no_draft": 1}, r"`meta_no_draft` must be True, False or None \(automatic\), but is 1\."),
        ({"meta_skinny_gemm": "on"}, r"`meta_skinny_gemm` must be True, False or None \(automatic\), but is 'on'\."),
        ({"meta_learned_priors": None}, r"`meta_learned_priors` must be True or False, but is None\. Pass a bool\."),
        (
            {"meta_policy_kwargs": "beta=1"},
            r"`meta_policy_kwargs` must be a dict of policy settings, but is str 'beta=1'\. Pass e\.g\. "
            r"`meta_policy_kwargs=\{\"beta\": 0\.5\}`\.",
        ),
        (
            {"meta_priors": [0.4]},
            r"`meta_priors` must be a dict of arm name -> prior mean reward, but is list \[0\.4\]\. Pass e\.g\. "
            r"`\{\"prompt_lookup\": 0\.4\}`\.",
        ),
        (
            {"meta_prior_weight": "2"},
            r"`meta_prior_weight` must be a float > 0 or None, but is '2'\. Pass e\.g\. 2\.0",
        ),
    ],
)
def test_a_setting_of_the_wrong_type_is_a_type_error(changes, message):
    with pytest.raises(MetaSDTypeError, match=message) as err:
        MetaSDSettings(**changes)
    assert isinstance(err.value, TypeError) and isinstance(err.value, MetaSDConfigError)


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"num_assistant_tokens": 0}, MetaSDConfigError, r"`num_assistant_tokens` must be an int >= 1, but is 0\."),
        ({"meta_prior_weight": 0.0}, MetaSDConfigError, r"`meta_prior_weight` must be a float > 0 or None, but is 0"),
        (
            {"meta_reward": "tv"},
            UnknownRewardError,
            r"`meta_reward` must be one of \[.*'speed'\] or a callable .*, but is 'tv'",
        ),
        (
            {"meta_draft_length": "auto"},
            MetaSDConfigError,
            r"`meta_draft_length` must be one of \['measured', 'fixed'\]",
        ),
    ],
)
def test_a_setting_out_of_range_is_a_value_error(changes, error, message):
    with pytest.raises(error, match=message) as err:
        MetaSDSettings(**changes)
    assert isinstance(err.value, ValueError) and not isinstance(err.value, MetaSDTypeError)


def test_a_prior_weight_out_of_range_is_refused_before_compute_and_a_positive_one_works(target, drafters):
    calls = []
    handle = target.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(MetaSDConfigError, match=r"`meta_prior_weight` must be a float > 0 or None, but is -1\."):
            metasd_greedy(target, PROMPT, 4, assistant_models=drafters, meta_prior_weight=-1)
    finally:
        handle.remove()
    assert not calls
    # the fix: a positive weight
    out = metasd_greedy(
        target, PROMPT, 4, assistant_models=drafters, meta_prior_weight=2.0, return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, greedy(target, PROMPT, 4))


def test_the_precedence_is_call_then_configs_then_pool_then_defaults():
    config = GenerationConfig(meta_policy="exp3", meta_reward="be", num_assistant_tokens=5)
    pool = {"meta_policy": "ucb", "meta_policy_kwargs": {"beta": 0.1}, "num_assistant_tokens": 4, "meta_reward": "bd"}
    settings = resolve_settings({"meta_reward": "eal", "meta_draft_length": None}, config, pool)
    assert (settings.meta_reward, settings.meta_policy, settings.num_assistant_tokens) == ("eal", "exp3", 5)
    assert settings.meta_policy_kwargs is None  # the pool's settings were for its own policy, not exp3
    assert settings.meta_draft_length == DEFAULTS["meta_draft_length"]
    from_pool = resolve_settings({}, GenerationConfig(), pool)
    assert (from_pool.meta_policy, from_pool.meta_policy_kwargs, from_pool.num_assistant_tokens) == (
        "ucb",
        {"beta": 0.1},
        4,
    )
    assert resolve_settings({}) == MetaSDSettings()


def test_setting_names_refuse_removed_and_misspelt_settings():
    check_setting_names(["meta_policy", "max_new_tokens", "meta_polcy"], "x", unknown=False)  # only removed ones
    with pytest.raises(
        MetaSDConfigError, match=r"^x must use the MetaSD settings \[.*\], but has unknown \['meta_polcy'\]"
    ):
        check_setting_names(["meta_policy", "meta_polcy"], "x")
    with pytest.raises(
        MetaSDConfigError, match=r"^x must not set `meta_warm_start`, but set it: the setting was removed"
    ):
        check_setting_names(["meta_warm_start"], "x", unknown=False)


def test_a_misspelt_setting_names_the_closest_setting_and_a_stranger_key_only_the_list():
    valid = re.escape(str(sorted(META_KWARGS)))
    with pytest.raises(
        MetaSDConfigError,
        match=rf"^x must use the MetaSD settings {valid}, but has unknown \['meta_polcy'\]\. Did you mean "
        r"'meta_policy'\? Fix the spelling or drop the key\.$",
    ):
        check_setting_names(["meta_polcy"], "x")
    with pytest.raises(
        MetaSDConfigError,
        match=rf"^x must use the MetaSD settings {valid}, but has unknown \['meta_zzz'\]\. Fix the spelling or drop "
        r"the key\.$",
    ):
        check_setting_names(["meta_zzz"], "x")


def test_the_generator_takes_one_settings_object():
    from hf_metasd.candidate_generator import MetaCandidateGenerator
    from hf_metasd.drafters import PromptLookupDrafter
    from hf_metasd.policies import get_policy

    generator = MetaCandidateGenerator(
        [PromptLookupDrafter()], get_policy("ucb"), MetaSDSettings(num_assistant_tokens=2, meta_reward="be")
    )
    assert generator.num_assistant_tokens == 2 and generator.stats.reward == "be" and not generator.no_draft
    with pytest.raises(MetaSDTypeError, match=r"`settings` must be a `MetaSDSettings`, but is dict\. Build one with"):
        MetaCandidateGenerator([PromptLookupDrafter()], get_policy("ucb"), {"num_assistant_tokens": 2})
