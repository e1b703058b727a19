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
from hf_metasd.policies import POLICY_REGISTRY, Policy

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


def test_batch_size_above_one_and_the_suggested_fix(target, drafters, forward_calls):
    batch = torch.cat([PROMPT, PROMPT])
    _raises_before_compute(
        forward_calls,
        MetaSDConfigError,
        r"batch size must be 1 for MetaSD \(batched drafting is not supported yet\), but is 2\. Call `generate` once",
        lambda: metasd_greedy(target, batch, 5, assistant_models=drafters),
    )
    # the fix: one call per prompt
    for row in batch:
        out = metasd_greedy(target, row[None], 5, assistant_models=drafters)
        assert torch.equal(out, greedy(target, row[None], 5))


@pytest.mark.parametrize("bad", [0, -2, 2.5])
def test_num_assistant_tokens_below_one(target, drafters, forward_calls, bad):
    _raises_before_compute(
        forward_calls,
        MetaSDConfigError,
        rf"`num_assistant_tokens` must be an int >= 1, but is {bad}\. Use e\.g\. 3",
        lambda: metasd_greedy(target, PROMPT, 5, assistant_models=drafters, num_assistant_tokens=bad),
    )


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
