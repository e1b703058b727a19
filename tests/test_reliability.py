"""Calls that must not fail halfway: stop strings on both entry points, a drafter that yields NaN, and settings
MetaSD cannot serve (refused before any compute, with what to do)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import VOCAB, greedy, metasd_greedy, prompts, sharpen, tiny_llama
from test_generate_features import _tokenizer
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteriaList
from transformers.generation.stopping_criteria import StopStringCriteria

import hf_metasd
from hf_metasd import DrafterCompatibilityError, MetaSDConfigError
from hf_metasd.drafters import ModelDrafter

PROMPTS = prompts(4, seed=2024)


@pytest.fixture
def forward_calls(target, drafters, target_copy):
    """Counts forward passes of the target and of the drafter models."""
    calls = []
    handles = [m.register_forward_pre_hook(lambda *_: calls.append(1)) for m in (target, target_copy, *drafters)]
    yield calls
    for handle in handles:
        handle.remove()


def _call(entry: str, target, prompt, max_new_tokens: int, **kwargs):
    """`generate` through ``custom_generate=hf_metasd.generate`` or through `hf_metasd.enable()`."""
    if entry == "custom_generate":
        return target.generate(prompt, max_new_tokens=max_new_tokens, custom_generate=hf_metasd.generate, **kwargs)
    hf_metasd.enable()
    return target.generate(prompt, max_new_tokens=max_new_tokens, **kwargs)


# ---------------------------------------------------------------------- stop strings
def _stop_string(target, tokenizer, prompt) -> str:
    """The 5th token of the target's greedy answer, as text: plain generate with it stops early."""
    reference = greedy(target, prompt, 20)
    return tokenizer.convert_ids_to_tokens([int(reference[0, prompt.shape[1] + 4])])[0]


def test_stop_strings_through_custom_generate_are_refused_before_compute(target, target_copy, forward_calls):
    tokenizer = _tokenizer(VOCAB)
    with pytest.raises(
        MetaSDConfigError,
        match=r"`stop_strings` must be passed through `hf_metasd.enable\(\)` \(transformers does not hand a callable "
        r"`custom_generate` the `tokenizer`\), but are \['a'\] with `custom_generate=hf_metasd.generate`\. Call "
        r"`hf_metasd.enable\(\)` first .* pass `stopping_criteria=StoppingCriteriaList\(\[StopStringCriteria.*, or use "
        r"a `custom_generate` repository folder \(`hf-metasd custom-generate-repo FOLDER`",
    ):
        metasd_greedy(target, PROMPTS[0], 20, assistant_models=[target_copy], stop_strings=["a"], tokenizer=tokenizer)
    assert not forward_calls, "the error must be raised before any forward pass"


@pytest.mark.parametrize("do_sample", [False, True])
def test_stop_strings_through_custom_generate_after_enable_stop_where_plain_generate_stops(
    target, target_copy, do_sample
):
    # the first fix the message gives: with `enable()`, the very call that was refused works
    tokenizer = _tokenizer(VOCAB)
    prompt = PROMPTS[1]
    stop = _stop_string(target, tokenizer, prompt)
    plain = greedy(target, prompt, 20, stop_strings=[stop], tokenizer=tokenizer)
    assert plain.shape[1] < prompt.shape[1] + 20
    hf_metasd.enable()
    kwargs = {"assistant_models": [target_copy], "stop_strings": [stop], "tokenizer": tokenizer}
    out = target.generate(prompt, do_sample=do_sample, max_new_tokens=20, custom_generate=hf_metasd.generate, **kwargs)
    if do_sample:  # the call stops at the first occurrence of the stop string, as plain generate does
        text = tokenizer.decode(out[0, prompt.shape[1] :])
        assert text.endswith(stop) and stop not in text[: -len(stop)] or out.shape[1] == prompt.shape[1] + 20
    else:
        assert torch.equal(out, plain)


def test_a_stop_string_criterion_through_custom_generate_stops_where_plain_generate_stops(target, target_copy):
    # the second fix the message gives, without `enable()`
    tokenizer = _tokenizer(VOCAB)
    prompt = PROMPTS[1]
    stop = _stop_string(target, tokenizer, prompt)
    plain = greedy(target, prompt, 20, stop_strings=[stop], tokenizer=tokenizer)
    criteria = StoppingCriteriaList([StopStringCriteria(tokenizer, [stop])])
    out = metasd_greedy(target, prompt, 20, assistant_models=[target_copy], stopping_criteria=criteria)
    assert torch.equal(out, plain)


# ---------------------------------------------------------------------- a drafter that yields NaN
@pytest.fixture(scope="module")
def nan_drafter():
    """A drafter model whose weights are all NaN: every logit it computes is NaN."""
    model = tiny_llama(5, layers=1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(float("nan"))
    return model


@pytest.mark.parametrize("entry", ["custom_generate", "enable"])
def test_a_nan_drafter_abstains_and_greedy_output_is_plain(target, drafters, nan_drafter, entry):
    prompt = PROMPTS[2]
    out = _call(
        entry,
        target,
        prompt,
        16,
        do_sample=False,
        assistant_models=[nan_drafter, drafters[0]],
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, greedy(target, prompt, 16))
    _assert_abstained(out.metasd)


def _assert_abstained(stats) -> None:
    """The policy asked the NaN drafter (arm 0), which abstained every time: it never drafted a token."""
    assert any(0 in arms for arms in stats.abstained)
    assert all(n == 0 for arm, n in zip(stats.arms, stats.drafted) if arm == 0)


@pytest.mark.parametrize("entry", ["custom_generate", "enable"])
def test_a_nan_drafter_abstains_under_sampling(target, drafters, nan_drafter, entry):
    prompt = PROMPTS[3]
    torch.manual_seed(0)
    out = _call(
        entry,
        target,
        prompt,
        16,
        do_sample=True,
        assistant_models=[nan_drafter, drafters[0]],
        return_dict_in_generate=True,
    )
    assert out.sequences.shape[1] == prompt.shape[1] + 16
    _assert_abstained(out.metasd)


@pytest.mark.parametrize(
    "settings",
    [{"meta_policy": "hedge", "meta_reward": "bd"}],  # full information (hedge) scores every drafter's logits
    ids=["full_information"],
)
@pytest.mark.parametrize("do_sample", [False, True])
def test_a_nan_drafter_is_not_scored_on_logits_it_did_not_have(target, drafters, nan_drafter, settings, do_sample):
    prompt = PROMPTS[2]
    torch.manual_seed(0)
    out = _call(
        "custom_generate",
        target,
        prompt,
        12,
        assistant_models=[nan_drafter, drafters[0]],
        do_sample=do_sample,
        return_dict_in_generate=True,
        **settings,
    )
    if not do_sample:
        assert torch.equal(out.sequences, greedy(target, prompt, 12))
    assert out.sequences.shape[1] == prompt.shape[1] + 12
    observed = out.metasd.counterfactual_rewards
    assert any(observed), "the other drafter is observed"
    assert all(0 not in rewards and all(math.isfinite(r) for r in rewards.values()) for rewards in observed)


class _MaskAllAfter(LogitsProcessor):
    """Masks every token (all logits -inf) once the sequence is longer than `length`: no distribution to draft from."""

    def __init__(self, length: int):
        self.length = length

    def __call__(self, input_ids, scores):
        return torch.full_like(scores, float("-inf")) if input_ids.shape[1] > self.length else scores


@pytest.mark.parametrize("do_sample", [False, True])
def test_a_draft_ends_before_the_first_step_without_a_distribution(drafters, do_sample):
    prompt = PROMPTS[0]
    drafter = ModelDrafter(drafters[0]).spawn()
    drafter.catch_up(prompt)
    # steps 1 and 2 have a distribution, step 3 (the sequence is then prompt + 2 tokens long) has none
    processors = LogitsProcessorList([_MaskAllAfter(prompt.shape[1] + 1)])
    tokens, logits = drafter.draft(prompt, 5, logits_processor=processors, do_sample=do_sample)
    assert tokens.shape == (1, 2) and logits.shape == (1, 2, VOCAB)
    assert torch.isfinite(logits.amax(-1)).all()
    # the drafter's cache still serves the next round (it is cropped to what the sequence keeps)
    tokens, _ = drafter.draft(torch.cat([prompt, tokens], dim=-1), 3, do_sample=do_sample)
    assert tokens.shape == (1, 3)


# ---------------------------------------------------------------------- refused before compute
@pytest.mark.parametrize("entry", ["custom_generate", "enable"])
@pytest.mark.parametrize("how", ["kwarg", "generation_config"])
def test_use_cache_false_is_refused_before_compute(target, drafters, forward_calls, entry, how):
    kwargs = {"use_cache": False} if how == "kwarg" else {"generation_config": GenerationConfig(use_cache=False)}
    with pytest.raises(
        MetaSDConfigError,
        match=r"`use_cache` must be True for MetaSD \(the target verifies each draft on its KV cache and rolls it "
        r"back past rejected tokens\), but is False\. Drop `use_cache=False`",
    ):
        _call(entry, target, PROMPTS[0], 5, assistant_models=drafters, **kwargs)
    assert not forward_calls, "the error must be raised before any forward pass"


@pytest.mark.parametrize("entry", ["custom_generate", "enable"])
def test_a_drafter_on_the_meta_device_is_refused_before_compute(target, drafters, forward_calls, entry):
    with torch.device("meta"):
        shell = sharpen(tiny_llama(9, layers=1))
    shell.name_or_path = "no-weights"
    with pytest.raises(
        DrafterCompatibilityError,
        match=r"drafter 'no-weights' must hold its weights on a real device, but is on the `meta` device \(built "
        r"under `torch.device\(\"meta\"\)`, or loaded without weights\)\. Build or load it on a real device",
    ):
        _call(entry, target, PROMPTS[0], 5, assistant_models=[drafters[0], shell])
    assert not forward_calls, "the error must be raised before any forward pass"
    assert issubclass(DrafterCompatibilityError, MetaSDConfigError)
