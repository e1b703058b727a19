"""Continuing a conversation with a cache passed in, and the per-step `hidden_states` / `attentions`: MetaSD returns
what plain `generate` returns, and leaves the user's cache as plain `generate` leaves it."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import VOCAB, prompts, sharpen, tiny_llama
from transformers import DynamicCache

import hf_metasd
from hf_metasd import MetaSDConfigError
from hf_metasd.drafters import CorpusDrafter, PromptLookupDrafter

PROMPTS = prompts(3, seed=31, min_len=5, max_len=9)
FOLLOW_UP = torch.tensor([[7, 41, 3, 88, 19]])  # the user's next turn, appended to the first answer


@pytest.fixture(scope="module")
def perturbed(target):
    """A drafter close to the target (agrees often, not always): the target's weights plus seeded noise."""
    model = tiny_llama(0)
    model.load_state_dict(target.state_dict())
    torch.manual_seed(7)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    return model.eval()


@pytest.fixture(scope="module")
def eager_target():
    """The `target` fixture's weights with eager attention (the only implementation that returns attentions)."""
    model = sharpen(tiny_llama(0))
    model.set_attn_implementation("eager")
    return model


def _corpus(target) -> CorpusDrafter:
    """A corpus of the target's own greedy answers to the test prompts (so that it drafts, and sometimes right)."""
    answers = [target.generate(p, do_sample=False, max_new_tokens=24)[0].tolist() for p in PROMPTS]
    return CorpusDrafter.from_sequences(answers, name="corpus")


def _generate(model, input_ids, entry: str | None, **kwargs):
    """Plain `generate` (entry None), or MetaSD through `enable` or `custom_generate`; greedy unless told."""
    kwargs.setdefault("do_sample", False)
    if entry is None:
        return model.generate(input_ids, **kwargs)
    if entry == "enable":
        hf_metasd.enable()
        return model.generate(input_ids, **kwargs)
    return model.generate(input_ids, custom_generate=hf_metasd.generate, **kwargs)


def _first_turn(model, prompt, new_tokens: int = 6):
    """The first answer (plain greedy, with its cache) and the follow-up ids: the whole conversation so far."""
    first = model.generate(prompt, do_sample=False, max_new_tokens=new_tokens, return_dict_in_generate=True)
    return first, torch.cat([first.sequences, FOLLOW_UP], dim=-1)


def _layers(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _assert_same_cache(ours: DynamicCache, plain: DynamicCache) -> None:
    assert ours.get_seq_length() == plain.get_seq_length()
    for (keys, values), (plain_keys, plain_values) in zip(_layers(ours), _layers(plain), strict=True):
        assert keys.shape == plain_keys.shape and values.shape == plain_values.shape
        torch.testing.assert_close(keys, plain_keys, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(values, plain_values, atol=1e-5, rtol=1e-4)


def _pool(kind: str, target, target_copy, perturbed) -> tuple[list, dict]:
    if kind == "mixed":  # a model drafter, prompt lookup and a corpus drafter, with the default policy
        return [perturbed, PromptLookupDrafter(), _corpus(target)], {}
    if kind == "mixed_round_robin":
        return [perturbed, PromptLookupDrafter(), _corpus(target)], {"meta_policy": "round_robin"}
    if kind == "copy":  # every draft accepted: long rounds, the first one included
        return [target_copy], {"meta_policy": "fixed", "meta_draft_length": "fixed"}
    # every round a plain target step (the no-draft arm)
    return [PromptLookupDrafter()], {"meta_policy": "fixed", "meta_policy_kwargs": {"arm": 1}, "meta_no_draft": True}


# ---------------------------------------------------------------------- a cache passed in
@pytest.mark.parametrize("entry", ["enable", "custom_generate"])
@pytest.mark.parametrize("kind", ["mixed", "mixed_round_robin", "copy", "no_draft_only"])
def test_a_passed_cache_continues_like_plain_generate_and_is_left_as_plain_leaves_it(
    target, target_copy, perturbed, entry, kind
):
    pool, settings = _pool(kind, target, target_copy, perturbed)
    for prompt in PROMPTS:
        first, follow_up = _first_turn(target, prompt)
        plain_cache, meta_cache = copy.deepcopy(first.cache), copy.deepcopy(first.cache)
        plain = _generate(target, follow_up, None, max_new_tokens=14, cache=plain_cache, return_dict_in_generate=True)
        out = _generate(
            target,
            follow_up,
            entry,
            max_new_tokens=14,
            cache=meta_cache,
            assistant_models=pool,
            num_assistant_tokens=4,
            return_dict_in_generate=True,
            **settings,
        )
        assert torch.equal(plain.sequences, _generate(target, follow_up, None, max_new_tokens=14))
        assert torch.equal(out.sequences, plain.sequences), kind
        # plain generate fills the passed cache in place and returns it: so does MetaSD, with the same positions
        assert plain.cache is plain_cache and out.cache is meta_cache
        assert meta_cache.get_seq_length() == out.sequences.shape[1] - 1
        _assert_same_cache(meta_cache, plain_cache)
        if kind == "copy":  # the drafter prefills the whole conversation on its own cache: its first draft is right
            assert out.metasd.accepted[0] == 4
        if kind == "no_draft_only":
            assert set(out.metasd.arms) == {1} and out.metasd.drafter_names[1] == "no_draft"


def test_the_deprecated_past_key_values_name_and_a_tensor_output(target, perturbed):
    """``past_key_values=`` (the name transformers still accepts) and the plain tensor output, through `enable`."""
    first, follow_up = _first_turn(target, PROMPTS[0])
    plain_cache, meta_cache = copy.deepcopy(first.cache), copy.deepcopy(first.cache)
    with pytest.warns(FutureWarning):
        plain = _generate(target, follow_up, None, max_new_tokens=12, past_key_values=plain_cache)
    with pytest.warns(FutureWarning):
        out = _generate(
            target, follow_up, "enable", max_new_tokens=12, past_key_values=meta_cache, assistant_models=[perturbed]
        )
    assert torch.equal(out, plain)
    _assert_same_cache(meta_cache, plain_cache)


@pytest.mark.parametrize("padded", [False, True])
def test_only_the_new_tokens_with_the_whole_attention_mask(target, perturbed, padded):
    """plain `generate` also continues from the new tokens alone when the attention mask covers the cached positions
    (padding included): MetaSD feeds them all, and keeps the mask's cached part."""
    prompt = PROMPTS[1]
    mask = torch.ones_like(prompt)
    if padded:  # a left-padded first turn
        prompt = torch.cat([torch.zeros(1, 2, dtype=torch.long), prompt], -1)
        mask = torch.cat([torch.zeros(1, 2, dtype=torch.long), mask], -1)
    first = target.generate(
        prompt, attention_mask=mask, do_sample=False, max_new_tokens=6, return_dict_in_generate=True
    )
    new_mask = torch.cat([mask, torch.ones(1, 6 + FOLLOW_UP.shape[1], dtype=torch.long)], -1)
    plain_cache, meta_cache = copy.deepcopy(first.cache), copy.deepcopy(first.cache)
    kwargs = {"attention_mask": new_mask, "max_new_tokens": 12}
    plain = _generate(target, FOLLOW_UP, None, cache=plain_cache, **kwargs)
    out = _generate(
        target,
        FOLLOW_UP,
        "custom_generate",
        cache=meta_cache,
        assistant_models=[perturbed, PromptLookupDrafter()],
        **kwargs,
    )
    assert plain.shape[1] == FOLLOW_UP.shape[1] + 12
    assert torch.equal(out, plain)
    _assert_same_cache(meta_cache, plain_cache)


def test_a_cache_that_holds_the_whole_input_is_refused(target, perturbed):
    first, _ = _first_turn(target, PROMPTS[0])
    full = first.sequences[:, : first.cache.get_seq_length()]  # every position cached: no token left to feed
    cache = copy.deepcopy(first.cache)
    with pytest.raises(
        MetaSDConfigError,
        match=r"`cache` must hold fewer positions than `input_ids` \(\d+\), but holds \d+\. Pass the whole",
    ):
        _generate(target, full, "custom_generate", max_new_tokens=4, cache=cache, assistant_models=[perturbed])
    assert cache.get_seq_length() == first.cache.get_seq_length()  # refused before any forward pass


@pytest.mark.parametrize("entry", ["enable", "custom_generate"])
def test_sampling_with_a_passed_cache(target, perturbed, entry):
    """Smoke: sampling runs, counts `max_new_tokens` from the follow-up, and leaves the cache one short of it."""
    first, follow_up = _first_turn(target, PROMPTS[2])
    cache = copy.deepcopy(first.cache)
    torch.manual_seed(0)
    out = _generate(
        target,
        follow_up,
        entry,
        do_sample=True,
        max_new_tokens=10,
        cache=cache,
        assistant_models=[perturbed, PromptLookupDrafter()],
        return_dict_in_generate=True,
    )
    assert out.sequences.shape[1] == follow_up.shape[1] + 10
    assert torch.equal(out.sequences[:, : follow_up.shape[1]], follow_up)
    assert out.cache is cache and cache.get_seq_length() == out.sequences.shape[1] - 1
    assert all(int(t) < VOCAB for t in out.sequences[0])


# ---------------------------------------------------------------------- hidden states and attentions
def _assert_same_steps(ours, plain) -> None:
    """Per generated token, per layer: the same shapes and (to rounding) the same values."""
    assert len(ours) == len(plain)
    for step, (our_step, plain_step) in enumerate(zip(ours, plain, strict=True)):
        assert len(our_step) == len(plain_step)
        for layer, (a, b) in enumerate(zip(our_step, plain_step, strict=True)):
            assert a.shape == b.shape, (step, layer)
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=f"step {step}, layer {layer}")


@pytest.mark.parametrize("with_cache", [False, True])
@pytest.mark.parametrize("drafter", ["copy", "perturbed"])
def test_hidden_states_and_attentions_are_plain_generates_per_step(
    eager_target, target_copy, perturbed, drafter, with_cache
):
    prompt = PROMPTS[0]
    cache_kwargs = [{}, {}]
    if with_cache:
        first, prompt = _first_turn(eager_target, prompt)
        cache_kwargs = [{"cache": copy.deepcopy(first.cache)}, {"cache": copy.deepcopy(first.cache)}]
    kwargs = {
        "max_new_tokens": 11,
        "return_dict_in_generate": True,
        "output_hidden_states": True,
        "output_attentions": True,
    }
    plain = _generate(eager_target, prompt, None, **kwargs, **cache_kwargs[0])
    out = _generate(
        eager_target,
        prompt,
        "custom_generate",
        assistant_models=[target_copy if drafter == "copy" else perturbed],
        meta_policy="fixed",
        meta_no_draft=False,
        meta_draft_length="fixed",
        num_assistant_tokens=4,
        **kwargs,
        **cache_kwargs[1],
    )
    assert torch.equal(out.sequences, plain.sequences)
    assert out.metasd.rounds >= 3  # later rounds too
    if drafter == "copy":  # the first round accepts every drafted token
        assert out.metasd.accepted[0] == 4
    else:  # rounds that reject part of the draft
        assert any(a < d for a, d in zip(out.metasd.accepted, out.metasd.drafted))
    _assert_same_steps(out.hidden_states, plain.hidden_states)
    _assert_same_steps(out.attentions, plain.attentions)


@pytest.mark.parametrize("entry", ["enable", "custom_generate"])
@pytest.mark.parametrize("drafter", ["copy", "perturbed"])
def test_a_left_padded_prompts_first_step_is_plain_generates(eager_target, target_copy, perturbed, drafter, entry):
    """A left-padded prompt (batch size 1, zeros at the left of the mask): its masked rows see no key, so each
    attends evenly to every key of its pass; plain `generate`'s prefill holds the prompt alone, and so must the pass
    the first step's attentions and hidden states come from (the candidates then go through a pass of their own)."""
    prompt = torch.cat([torch.zeros(1, 3, dtype=torch.long), PROMPTS[1]], dim=-1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(PROMPTS[1])], dim=-1)
    kwargs = {
        "attention_mask": mask,
        "max_new_tokens": 11,
        "return_dict_in_generate": True,
        "output_hidden_states": True,
        "output_attentions": True,
        "output_scores": True,
    }
    plain = _generate(eager_target, prompt, None, **kwargs)
    out = _generate(
        eager_target,
        prompt,
        entry,
        assistant_models=[target_copy if drafter == "copy" else perturbed],
        meta_policy="fixed",
        meta_no_draft=False,
        meta_draft_length="fixed",
        num_assistant_tokens=4,
        **kwargs,
    )
    assert torch.equal(out.sequences, plain.sequences)
    assert out.metasd.drafted[0] == 4  # the first round drafts: two passes
    if drafter == "copy":  # and keeps drafted tokens: its steps come from both passes
        assert out.metasd.accepted[0] >= 1
    else:  # rejects them: its one step comes from the prompt's pass
        assert out.metasd.accepted[0] == 0
    _assert_same_steps(out.hidden_states, plain.hidden_states)
    _assert_same_steps(out.attentions, plain.attentions)
    for ours, theirs in zip(out.scores, plain.scores, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)
