"""``meta_reproducible=True``: a seeded sampling call repeats its output, through both entry points and in a batch, and
whatever earlier calls learnt; what it refuses; the user's model is left as it came."""

from __future__ import annotations

import pytest
import torch
from conftest import prompts, sharpen, tiny_llama

import hf_metasd
from hf_metasd.drafters import ModelDrafter, PromptLookupDrafter, TokenRecyclingDrafter
from hf_metasd.errors import MetaSDConfigError
from hf_metasd.policies import get_policy

MAX_NEW = 20
PROMPT = torch.tensor([[7, 3, 11, 4, 19, 8, 23, 5, 7, 3, 11, 4]])


@pytest.fixture
def pool():
    return [
        ModelDrafter(sharpen(tiny_llama(2, layers=1)), name="small"),
        PromptLookupDrafter(),
        TokenRecyclingDrafter(),
    ]


def sample(target, input_ids, pool, entry: str, seed: int, **kwargs):
    torch.manual_seed(seed)
    common = {"do_sample": True, "top_k": 20, "max_new_tokens": MAX_NEW, "assistant_models": pool, **kwargs}
    if entry == "enable":
        hf_metasd.enable()
        return target.generate(input_ids, **common)
    return target.generate(input_ids, custom_generate=hf_metasd.generate, **common)


@pytest.mark.parametrize("entry", ["custom_generate", "enable"])
@pytest.mark.parametrize("policy", ["ucb_scaled", "throughput", "thompson"])
def test_the_same_seed_gives_the_same_output_whatever_earlier_calls_learnt(target, pool, entry, policy):
    outputs = []
    for _ in range(3):
        outputs.append(sample(target, PROMPT, pool, entry, seed=5, meta_reproducible=True, meta_policy=policy))
        # an ordinary call in between: it measures costs, learns rewards and grows the recycling table
        sample(target, prompts(1, seed=3)[0], pool, entry, seed=1, meta_policy=policy)
    assert all(torch.equal(out, outputs[0]) for out in outputs)
    other = sample(target, PROMPT, pool, entry, seed=6, meta_reproducible=True, meta_policy=policy)
    assert other.shape == outputs[0].shape  # another seed: another sample (of the same distribution)


@pytest.mark.parametrize("entry", ["custom_generate", "enable"])
def test_a_batch_of_two_repeats_too(target, pool, entry):
    batch = torch.stack([PROMPT[0, :6], PROMPT[0, 4:10]])
    first = sample(target, batch, pool, entry, seed=9, meta_reproducible=True)
    sample(target, batch, pool, entry, seed=2)  # an ordinary batch call in between
    again = sample(target, batch, pool, entry, seed=9, meta_reproducible=True)
    assert torch.equal(first, again)


def test_greedy_output_stays_plain_greedy(target, pool):
    reference = target.generate(PROMPT, do_sample=False, max_new_tokens=MAX_NEW)
    out = target.generate(
        PROMPT,
        do_sample=False,
        max_new_tokens=MAX_NEW,
        custom_generate=hf_metasd.generate,
        assistant_models=pool,
        meta_reproducible=True,
    )
    assert torch.equal(out, reference)


def test_the_call_leaves_the_model_without_hooks_and_teaches_no_later_call(target, pool):
    hooks = dict(target._forward_pre_hooks)
    sample(target, PROMPT, pool, "custom_generate", seed=5, meta_reproducible=True)
    assert dict(target._forward_pre_hooks) == hooks
    assert len(pool[2].table) == 0  # token recycling learnt into the call's own copy of its table


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"meta_skinny_gemm": True}, r"`meta_skinny_gemm` must not be True with `meta_reproducible=True`"),
        ({"meta_learned_priors": True}, r"`meta_learned_priors` must not be True with `meta_reproducible=True`"),
        ({"meta_policy": get_policy("ucb")}, r"`meta_policy` must be a policy name with `meta_reproducible=True`"),
        ({"meta_reproducible": "yes"}, r"`meta_reproducible` must be True or False, but is 'yes'"),
    ],
)
def test_what_cannot_repeat_is_refused_before_any_compute(target, pool, kwargs, message):
    calls = []
    handle = target.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises((MetaSDConfigError, TypeError), match=message):
            sample(target, PROMPT, pool, "custom_generate", seed=0, **{"meta_reproducible": True, **kwargs})
    finally:
        handle.remove()
    assert not calls
    # the fix: drop the setting
    fixed = {k: v for k, v in kwargs.items() if k != "meta_reproducible"}
    fixed.pop("meta_skinny_gemm", None), fixed.pop("meta_learned_priors", None)
    if "meta_policy" in fixed:
        fixed["meta_policy"] = "ucb"
    sample(target, PROMPT, pool, "custom_generate", seed=0, meta_reproducible=True, **fixed)
