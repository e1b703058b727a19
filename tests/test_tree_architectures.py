"""Token trees over the architecture matrix of `tests/test_architectures.py`: where a tree runs (attention with
rotary or absolute positions, mixtures of experts), greedy output is plain `generate`'s in float32 through both entry
points with trees of several arms verified, bfloat16 leaves it only at near-ties, and sampling runs; where it cannot
(sliding windows, ALiBi, recurrent and hybrid caches) the call verifies chains, says why, and is just as lossless.

Every verification pass costs one unit of a fake clock, whatever its width: the width policy then builds trees."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from test_architectures import (
    ENTRY_POINTS,
    FAMILIES,
    MAX_NEW,
    PROMPTS,
    RECURRENT,
    build,
    families,  # noqa: F401  (the fixture)
    metasd,
    perturbed,
    skip_if_stateful,
)

import hf_metasd
from hf_metasd.drafters import ModelDrafter, PromptLookupDrafter
from hf_metasd.lossless import check_divergence, float32_copy

N = 3
#: family -> why it verifies chains (a regular expression of its `tree_reason`)
CHAINS = {
    "mistral": r"^a sliding-window cache layer \(DynamicSlidingWindowLayer\) cannot hold a tree's branches",
    "gemma2": r"^a sliding-window cache layer \(DynamicSlidingWindowLayer\) cannot hold a tree's branches",
    "bloom": r"^ALiBi positions follow a key's index in the cache, not its depth in the tree$",
    **dict.fromkeys(RECURRENT, r"^a recurrent or hybrid cache layer \(\w+\) cannot hold a tree's branches"),
}
TREES = [family for family in FAMILIES if family not in CHAINS]


def test_the_matrix_has_tree_families_and_chain_families():
    assert len(TREES) >= 12 and {"llama", "gpt2", "opt", "mixtral", "qwen2_moe", "falcon"} <= set(TREES)
    assert set(CHAINS) <= set(FAMILIES)


def _pool(fam) -> list:
    return [ModelDrafter(fam.perturbed, name="perturbed"), PromptLookupDrafter(), ModelDrafter(fam.copy, name="copy")]


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_with_trees_is_plain_generates(families, family, entry, fake_clock):  # noqa: F811
    fam = families(family)
    skip_if_stateful(fam)
    trees = 0
    with fake_clock.charging((fam.target, 1.0)):
        for prompt, reference in zip(PROMPTS, fam.references):
            out = metasd(
                fam.target,
                prompt,
                _pool(fam),
                entry=entry,
                num_assistant_tokens=N,
                meta_tree=True,
                return_dict_in_generate=True,
            )
            hf_metasd.disable()
            assert torch.equal(out.sequences, reference), f"{family}: trees changed the greedy output"
            trees += sum(len(arms) > 1 for arms in out.metasd.tree_arms)
            if family in CHAINS:
                assert out.metasd.tree_reason is not None
                assert re.match(CHAINS[family], out.metasd.tree_reason), out.metasd.tree_reason
            else:
                assert out.metasd.tree_reason is None
    assert (trees > 0) == (family in TREES), f"{family}: {trees} tree rounds"


@pytest.mark.parametrize("family", TREES)
def test_bfloat16_trees_leave_plain_output_only_at_near_ties(family, fake_clock):
    """Every kept token is the argmax of the scores its tree pass computed, and where the output leaves plain
    bfloat16 greedy output it is a near-tie (`hf_metasd.lossless`)."""
    base = build(family).to(torch.bfloat16)
    if getattr(base, "_is_stateful", False):
        pytest.skip("stateful")
    target32 = float32_copy(base)
    pool = [
        ModelDrafter(perturbed(base), name="perturbed"),
        PromptLookupDrafter(),
        ModelDrafter(copy.deepcopy(base), name="copy"),
    ]
    errors, trees = [], 0
    with fake_clock.charging((base, 1.0)):
        for i, prompt in enumerate(PROMPTS):
            reference = base.generate(prompt, do_sample=False, max_new_tokens=MAX_NEW)
            out = metasd(
                base,
                prompt,
                pool,
                entry=ENTRY_POINTS[i % 2],
                num_assistant_tokens=N,
                meta_tree=True,
                return_dict_in_generate=True,
                output_scores=True,
            )
            hf_metasd.disable()
            chosen = torch.stack([s[0].argmax() for s in out.scores])
            assert torch.equal(out.sequences[0, prompt.shape[1] :], chosen), f"{family}: not the pass's argmax"
            divergence = check_divergence(base, reference, out.sequences, prompt.shape[1], target_float32=target32)
            if divergence is not None and not divergence.near_tie:
                errors.append(divergence.describe())
            trees += sum(len(arms) > 1 for arms in out.metasd.tree_arms)
    assert errors == [] and trees > 0


@pytest.mark.parametrize("family", TREES)
def test_sampling_with_trees_runs(families, family, fake_clock):  # noqa: F811
    fam = families(family)
    torch.manual_seed(0)
    with fake_clock.charging((fam.target, 1.0)):
        for _ in range(2):
            out = fam.target.generate(
                PROMPTS[1],
                do_sample=True,
                top_k=20,
                max_new_tokens=MAX_NEW,
                custom_generate=hf_metasd.generate,
                assistant_models=_pool(fam),
                num_assistant_tokens=N,
                meta_tree=True,
                return_dict_in_generate=True,
            )
            assert out.sequences.shape == (1, PROMPTS[1].shape[1] + MAX_NEW)
    assert sum(len(arms) > 1 for arms in out.metasd.tree_arms) > 0
