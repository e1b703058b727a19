"""Bad input: a specific exception, raised before any forward pass, whose message says what to do (pinned here)."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import greedy, metasd_greedy, prompts, tiny_llama

import hf_metasd
from hf_metasd import (
    DrafterCompatibilityError,
    MetaSDConfigError,
    PolicyArmError,
    UnknownPolicyError,
    UnknownRewardError,
)
from hf_metasd.errors import MetaSDTypeError, UnknownPolicySettingError
from hf_metasd.policies import POLICY_REGISTRY, Policy
from hf_metasd.settings import META_KWARGS, RETIRED_SETTINGS

PROMPT = prompts(1)[0]


@pytest.fixture
def forward_calls(target, drafters, target_copy):
    """Counts forward passes of every model involved."""
    calls = []
    handles = [m.register_forward_pre_hook(lambda *_: calls.append(1)) for m in (target, target_copy, *drafters)]
    yield calls
    for h in handles:
        h.remove()


def _raises_before_compute(forward_calls, exc, match, fn):
    with pytest.raises(exc, match=match):
        fn()
    assert not forward_calls, "the error must be raised before any forward pass"


def test_empty_pool(target, forward_calls):
    _raises_before_compute(
        forward_calls,
        MetaSDConfigError,
        r"`assistant_models` must hold at least one drafter, but is empty\. Pass e\.g\.",
        lambda: metasd_greedy(target, PROMPT, 5, assistant_models=[]),
    )


def test_missing_pool_with_custom_generate(target, forward_calls):
    _raises_before_compute(
        forward_calls,
        MetaSDConfigError,
        r"`assistant_models` must be given to `hf_metasd.generate`, but is None",
        lambda: metasd_greedy(target, PROMPT, 5),
    )


def test_vocab_mismatch_names_the_drafter_and_the_fix(target, drafters, forward_calls):
    other = tiny_llama(7, layers=1, vocab=50)
    other.name_or_path = "small-vocab"
    _raises_before_compute(
        forward_calls,
        DrafterCompatibilityError,
        r"drafter 'small-vocab' must have the target's vocabulary size 96, but has 50\. Use a drafter that shares",
        lambda: metasd_greedy(target, PROMPT, 5, assistant_models=[drafters[0], other]),
    )


def test_unknown_policy_lists_registered_names(target, drafters, forward_calls):
    names = re.escape(str(sorted(POLICY_REGISTRY)))
    _raises_before_compute(
        forward_calls,
        UnknownPolicyError,
        rf"`meta_policy` must be one of {names}, but is 'ucbb'\. Pick a registered name",
        lambda: metasd_greedy(target, PROMPT, 5, assistant_models=drafters, meta_policy="ucbb"),
    )
    # the fix works: a registered name
    assert (
        metasd_greedy(target, PROMPT, 5, assistant_models=drafters, meta_policy="ucb").shape[1] == PROMPT.shape[1] + 5
    )


def test_unknown_reward(target, drafters, forward_calls):
    _raises_before_compute(
        forward_calls,
        UnknownRewardError,
        r"`meta_reward` must be one of \['bd', 'be', 'cost', 'eal', 'speed'\] or a callable .*, but is 'tv'\. "
        r"Use \"speed\" \(the default\)",
        lambda: metasd_greedy(target, PROMPT, 5, assistant_models=drafters, meta_reward="tv"),
    )


def test_both_assistant_model_and_assistant_models(target, drafters, forward_calls):
    hf_metasd.enable()
    _raises_before_compute(
        forward_calls,
        MetaSDConfigError,
        r"`assistant_model` must be None when `assistant_models` is given, but both are set\. Put every drafter",
        lambda: target.generate(PROMPT, max_new_tokens=5, assistant_model=drafters[0], assistant_models=drafters),
    )


def test_meta_kwargs_without_pool(target, forward_calls):
    hf_metasd.enable()
    _raises_before_compute(
        forward_calls,
        MetaSDConfigError,
        r"`meta_policy` needs `assistant_models`, but `assistant_models` is None",
        lambda: target.generate(PROMPT, max_new_tokens=5, meta_policy="ucb"),
    )


def test_model_drafters_at_batch_size_above_one_draft_per_row(target, drafters):
    """A batch drafts with every drafter kind, each row with its own copies (tests/test_batched_heads.py): the
    output is plain batched generate's, and each row's is the row's own."""
    batch = torch.cat([PROMPT, PROMPT])
    out = metasd_greedy(target, batch, 5, assistant_models=drafters)
    assert torch.equal(out, greedy(target, batch, 5))
    for row in batch:
        alone = metasd_greedy(target, row[None], 5, assistant_models=drafters)
        assert torch.equal(alone, greedy(target, row[None], 5))


@pytest.mark.parametrize("bad", [0, -2, 2.5])
def test_num_assistant_tokens_below_one(target, drafters, forward_calls, bad):
    _raises_before_compute(
        forward_calls,
        MetaSDConfigError,
        rf"`num_assistant_tokens` must be an int >= 1, but is {bad}\. Use e\.g\. 3",
        lambda: metasd_greedy(target, PROMPT, 5, assistant_models=drafters, num_assistant_tokens=bad),
    )


@pytest.mark.parametrize("entry", ["custom_generate", "enable"])
def test_num_assistant_tokens_above_the_pools_bound_is_refused(target, drafters, forward_calls, entry):
    """A draft length passed to `generate` has the bound a pool file's has (`MAX_NUM_ASSISTANT_TOKENS`, 128):
    10,000,000 made 12 new tokens take 30 s and 156 MB."""
    _raises_before_compute(
        forward_calls,
        MetaSDConfigError,
        r"^`num_assistant_tokens` must be at most 128 \(rounds that pay off draft 3 to 20 tokens\), "
        r"but is 10000000\. Use e\.g\. 3\.$",
        lambda: _generate(entry, target, PROMPT, 5, assistant_models=drafters, num_assistant_tokens=10**7),
    )
    from transformers import GenerationConfig

    config = GenerationConfig(num_assistant_tokens=129, max_new_tokens=5)
    _raises_before_compute(
        forward_calls,
        MetaSDConfigError,
        r"`num_assistant_tokens` must be at most 128 .*, but is 129\.",
        lambda: _generate(entry, target, PROMPT, 5, assistant_models=drafters, generation_config=config),
    )
    # the fix: a draft length within the bound (the longest allowed works)
    out = _generate(entry, target, PROMPT, 5, assistant_models=drafters, num_assistant_tokens=128)
    assert torch.equal(out, greedy(target, PROMPT, 5))


@pytest.mark.parametrize("entry", ["custom_generate", "enable"])
def test_a_policy_of_the_wrong_type_is_a_metasd_type_error(target, drafters, forward_calls, entry):
    names = re.escape(str(sorted(POLICY_REGISTRY)))
    _raises_before_compute(
        forward_calls,
        MetaSDTypeError,
        rf"^`meta_policy` must be a registered name or a `Policy` instance, but is int 42\. Use one of {names} or "
        r"subclass `hf_metasd\.policies\.Policy`\.$",
        lambda: _generate(entry, target, PROMPT, 5, assistant_models=drafters, meta_policy=42),
    )
    _raises_before_compute(
        forward_calls,
        MetaSDTypeError,
        r"^`meta_policy_kwargs` must have setting names \(str\) as keys, but has 1\.",
        lambda: _generate(
            entry, target, PROMPT, 5, assistant_models=drafters, meta_policy="ucb", meta_policy_kwargs={1: 2}
        ),
    )
    # the fix: a registered name
    out = _generate(entry, target, PROMPT, 5, assistant_models=drafters, meta_policy="ucb")
    assert torch.equal(out, greedy(target, PROMPT, 5))


def test_beam_search_is_refused(target, drafters, forward_calls):
    _raises_before_compute(
        forward_calls,
        MetaSDConfigError,
        r"`num_beams` must be 1 for MetaSD, but is 2",
        lambda: metasd_greedy(target, PROMPT, 5, assistant_models=drafters, num_beams=2),
    )


def test_wrong_type_in_pool(target, drafters, forward_calls):
    _raises_before_compute(
        forward_calls,
        TypeError,
        r"`assistant_models\[1\]` must be a `Drafter`, a transformers causal LM or a peft model, but is str",
        lambda: metasd_greedy(target, PROMPT, 5, assistant_models=[drafters[0], "gpt2"]),
    )


def test_policy_selecting_an_arm_out_of_range_is_named(target, drafters):
    class Broken(Policy):
        name = "broken"

        def select(self):
            return 7

    with pytest.raises(PolicyArmError, match=r"policy 'broken' must select an arm in \[0, 4\), but selected 7\. Fix"):
        metasd_greedy(target, PROMPT, 5, assistant_models=drafters, meta_policy=Broken())


def test_policy_bound_to_another_pool_size(target, drafters):
    policy = hf_metasd.get_policy("ucb")
    policy.reset(2)
    with pytest.raises(
        ValueError,
        match=r"`meta_policy` was bound to 2 arms, but this call has 4 \(3 drafters \+ the no-draft arm\)\. Call",
    ):
        metasd_greedy(target, PROMPT, 5, assistant_models=drafters, meta_policy=policy)
    policy.reset(4)  # the fix: 3 drafters + the no-draft arm
    metasd_greedy(target, PROMPT, 5, assistant_models=drafters, meta_policy=policy)


def test_errors_refine_builtins():
    assert issubclass(MetaSDConfigError, ValueError)
    assert issubclass(UnknownPolicyError, ValueError) and issubclass(UnknownPolicyError, KeyError)
    assert issubclass(DrafterCompatibilityError, ValueError)
    assert issubclass(PolicyArmError, IndexError)
    assert issubclass(hf_metasd.MetaSDDrafterError, MetaSDConfigError)


# ---------------------------------------------------------------------------------------------------------------------
# arguments that mean another assisted-decoding method: refused on both entry points
# ---------------------------------------------------------------------------------------------------------------------
def _generate(entry: str, target, input_ids, max_new_tokens: int, **kwargs):
    """Greedy `generate` through `custom_generate=hf_metasd.generate` or through `hf_metasd.enable()`."""
    if entry == "enable":
        hf_metasd.enable()
        return target.generate(input_ids, do_sample=False, max_new_tokens=max_new_tokens, **kwargs)
    return metasd_greedy(target, input_ids, max_new_tokens, **kwargs)


ENTRIES = ["custom_generate", "enable"]


@pytest.mark.parametrize("entry", ENTRIES)
def test_assistant_model_with_assistant_models_is_refused_on_both_entry_points(target, drafters, entry, forward_calls):
    # with `custom_generate`, hf_metasd reads `assistant_model` from transformers' `generate` frame
    _raises_before_compute(
        forward_calls,
        MetaSDConfigError,
        r"`assistant_model` must be None when `assistant_models` is given, but both are set\. Put every drafter in "
        r"`assistant_models=\[\.\.\.\]`\.",
        lambda: _generate(entry, target, PROMPT, 5, assistant_model=drafters[0], assistant_models=drafters[1:]),
    )
    # the fix: every drafter in `assistant_models`
    out = _generate(entry, target, PROMPT, 5, assistant_models=drafters)
    assert torch.equal(out, greedy(target, PROMPT, 5))


@pytest.mark.parametrize("entry", ENTRIES)
def test_prompt_lookup_num_tokens_with_assistant_models_is_refused_on_both_entry_points(
    target, drafters, entry, forward_calls
):
    # both messages name the value and the pool drafter that replaces it (their last sentences differ in wording)
    _raises_before_compute(
        forward_calls,
        MetaSDConfigError,
        r"`prompt_lookup_num_tokens` must be None when `assistant_models` is given, but is 3\. "
        r".*`hf_metasd\.drafters\.PromptLookupDrafter\(\)`",
        lambda: _generate(entry, target, PROMPT, 5, prompt_lookup_num_tokens=3, assistant_models=drafters),
    )
    # the fix: the prompt-lookup drafter in the pool
    pool = [*drafters, hf_metasd.drafters.PromptLookupDrafter(num_output_tokens=3)]
    assert torch.equal(_generate(entry, target, PROMPT, 5, assistant_models=pool), greedy(target, PROMPT, 5))


def test_assistant_tokenizer_with_assistant_models_is_refused_through_enable(target, drafters, forward_calls):
    # Only `enable()` can refuse it: with `custom_generate=hf_metasd.generate`, transformers pops `assistant_tokenizer`
    # from the call's kwargs and hands a callable decoding method only the arguments in its signature, so hf_metasd
    # never sees it (and transformers' frame does not keep it either). Nothing to test on that path.
    _raises_before_compute(
        forward_calls,
        MetaSDConfigError,
        r"`assistant_tokenizer` must be None when `assistant_models` is given, but is set\. A drafter with another "
        r"tokenizer carries its own: build it as a drafter of the pool\.",
        lambda: _generate("enable", target, PROMPT, 5, assistant_tokenizer=object(), assistant_models=drafters),
    )
    # the fix: drop it (these drafters share the target's tokenizer)
    assert torch.equal(_generate("enable", target, PROMPT, 5, assistant_models=drafters), greedy(target, PROMPT, 5))


# ---------------------------------------------------------------------------------------------------------------------
# MetaSD settings of the wrong type or value
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", sorted(RETIRED_SETTINGS))
@pytest.mark.parametrize("where", ["custom_generate", "enable", "generation_config"])
def test_a_removed_setting_is_refused_with_why_and_what_to_do(target, drafters, forward_calls, key, where):
    setting = {key: 4 if key == "meta_warm_start" else True}
    place = "`generate`'s keyword arguments"
    if where == "generation_config":
        from transformers import GenerationConfig

        setting, place = {"generation_config": GenerationConfig(**setting)}, "the `GenerationConfig`"
    _raises_before_compute(
        forward_calls,
        MetaSDConfigError,
        rf"^{place} must not set `{key}`, but set it: the setting was removed "
        rf"\({re.escape(RETIRED_SETTINGS[key])}\)\. Drop it\.$",
        lambda: _generate(where, target, PROMPT, 5, assistant_models=drafters, **setting),
    )
    # the fix: drop it (for full information, a full-information policy such as hedge scores every drafter)
    assert torch.equal(_generate(where, target, PROMPT, 5, assistant_models=drafters), greedy(target, PROMPT, 5))


@pytest.mark.parametrize("where", ["custom_generate", "enable", "generation_config"])
def test_a_misspelt_setting_is_refused_with_the_valid_ones_and_the_closest_on_every_way_in(
    target, drafters, forward_calls, where
):
    """Issue 50: through ``custom_generate=hf_metasd.generate`` a misspelt keyword got transformers' generic "not used
    by the model" message; every way in now says what `enable()` says."""
    setting, place = {"meta_polcy": "ucb"}, "`generate`'s keyword arguments"
    if where == "generation_config":
        from transformers import GenerationConfig

        setting, place = {"generation_config": GenerationConfig(**setting)}, "the `GenerationConfig`"
    _raises_before_compute(
        forward_calls,
        MetaSDConfigError,
        rf"^{place} must use the MetaSD settings {re.escape(str(sorted(META_KWARGS)))}, but has unknown "
        r"\['meta_polcy'\]\. Did you mean 'meta_policy'\? Fix the spelling or drop the key\.$",
        lambda: _generate(where, target, PROMPT, 5, assistant_models=drafters, **setting),
    )
    fixed = _generate(where, target, PROMPT, 5, assistant_models=drafters, meta_policy="ucb")  # the fix
    assert torch.equal(fixed, greedy(target, PROMPT, 5))


def test_a_removed_setting_without_assistant_models_is_refused_too(target):
    hf_metasd.enable()
    try:
        with pytest.raises(MetaSDConfigError, match=r"must not set `meta_warm_start`, but set it: the setting was"):
            target.generate(PROMPT, max_new_tokens=5, do_sample=False, meta_warm_start=4)
    finally:
        hf_metasd.disable()


def test_unknown_policy_setting_names_the_policy_the_key_and_the_valid_settings(target, drafters, forward_calls):
    _raises_before_compute(
        forward_calls,
        UnknownPolicySettingError,
        r"`meta_policy_kwargs` for 'ucb' must use the settings \['beta', 'seed'\], but has unknown 'betta'\. "
        r"Did you mean 'beta'\? See `help\(UCB\)`",
        lambda: metasd_greedy(
            target, PROMPT, 5, assistant_models=drafters, meta_policy="ucb", meta_policy_kwargs={"betta": 1}
        ),
    )
    # the fix: the suggested name
    out = metasd_greedy(
        target,
        PROMPT,
        5,
        assistant_models=drafters,
        meta_policy="ucb",
        meta_policy_kwargs={"beta": 1},
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, greedy(target, PROMPT, 5)) and out.metasd.policy == "ucb"


def test_policy_settings_given_as_a_string_are_refused(target, drafters, forward_calls):
    _raises_before_compute(
        forward_calls,
        TypeError,
        r"`meta_policy_kwargs` must be a dict of policy settings, but is str 'beta=1'\. "
        r"Pass e\.g\. `meta_policy_kwargs=\{\"beta\": 0\.5\}`\.",
        lambda: metasd_greedy(target, PROMPT, 5, assistant_models=drafters, meta_policy_kwargs="beta=1"),
    )
    out = metasd_greedy(target, PROMPT, 5, assistant_models=drafters, meta_policy_kwargs={"beta": 0.5})
    assert torch.equal(out, greedy(target, PROMPT, 5))


def test_a_reward_outside_the_unit_interval_is_refused_at_the_first_update(target, drafters):
    calls = []

    def too_big(feedback):
        calls.append(feedback.arm)
        return 2.0

    with pytest.raises(
        ValueError,
        match=r"`reward` must be in \[0, 1\] for the 'ucb' policy, but is 2\.0\. Use a reward in \[0, 1\] "
        r"\(BE, BD or the normalised cost reward\) or rescale yours\.",
    ):
        metasd_greedy(target, PROMPT, 5, assistant_models=drafters, meta_policy="ucb", meta_reward=too_big)
    assert calls == [0]  # refused at the first update: the first round's reward, arm 0 (UCB tries arms in order)

    # the fix: rescale it into [0, 1]
    policy = hf_metasd.get_policy("ucb")
    out = metasd_greedy(
        target, PROMPT, 5, assistant_models=drafters, meta_policy=policy, meta_reward=lambda f: too_big(f) / 2
    )
    assert torch.equal(out, greedy(target, PROMPT, 5))
    assert sum(policy.counts) >= 1 and all(s == c for s, c in zip(policy.sums, policy.counts))  # every reward was 1


@pytest.mark.parametrize("key", ["meta_skinny_gemm", "meta_no_draft"])
def test_tri_state_settings_must_be_a_bool_or_none(target, drafters, forward_calls, key):
    _raises_before_compute(
        forward_calls,
        MetaSDConfigError,
        rf"`{key}` must be True, False or None \(automatic\), but is 'yes'\. Pass a bool, or leave it out\.",
        lambda: metasd_greedy(target, PROMPT, 5, assistant_models=drafters, **{key: "yes"}),
    )
    for value in (True, False):  # the fix: a bool (the default reward, "speed", has the no-draft arm)
        out = metasd_greedy(target, PROMPT, 5, assistant_models=drafters, return_dict_in_generate=True, **{key: value})
        assert torch.equal(out.sequences, greedy(target, PROMPT, 5))
        if key == "meta_no_draft":
            assert (out.metasd.drafter_names[-1] == "no_draft") is value
        else:
            assert out.metasd.kernel == ("skinny" if value else "stock")


# ---------------------------------------------------------------------------------------------------------------------
# a reward callable's return, a prior's value: named as the call knows them
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("returned", "shown"), [("x", "str 'x'"), (float("nan"), "float nan"), (None, "NoneType None")]
)
def test_a_reward_callable_must_return_a_finite_number(target, drafters, returned, shown):
    with pytest.raises(
        MetaSDTypeError if isinstance(returned, (str, type(None))) else MetaSDConfigError,
        match=rf"`meta_reward` must return a finite float, but <lambda> returned {shown}\. Return the round's reward "
        r"as a number, e\.g\. `float\(\.\.\.\)`\.",
    ):
        metasd_greedy(target, PROMPT, 5, assistant_models=drafters, meta_policy="ucb", meta_reward=lambda f: returned)
    out = metasd_greedy(target, PROMPT, 5, assistant_models=drafters, meta_policy="ucb", meta_reward=lambda f: 0.5)
    assert torch.equal(out, greedy(target, PROMPT, 5))  # the fix: a number


@pytest.mark.parametrize(
    ("value", "error", "shown"),
    [(float("nan"), MetaSDConfigError, "nan"), ("0.4", MetaSDTypeError, "'0.4'"), (1.5, MetaSDConfigError, "1.5")],
)
def test_a_prior_must_be_a_finite_number_in_the_policys_range(target, drafters, forward_calls, value, error, shown):
    _raises_before_compute(
        forward_calls,
        error,
        rf"`meta_priors\['no_draft'\]` must be a float in \[0, 1\] \(the 'ucb' policy's reward range\), but is "
        rf"{shown}\. Give the arm's expected reward, e\.g\. 0\.4, or leave the arm out\.",
        lambda: metasd_greedy(
            target, PROMPT, 5, assistant_models=drafters, meta_policy="ucb", meta_priors={"no_draft": value}
        ),
    )
    out = metasd_greedy(target, PROMPT, 5, assistant_models=drafters, meta_policy="ucb", meta_priors={"no_draft": 0.4})
    assert torch.equal(out, greedy(target, PROMPT, 5))  # the fix
