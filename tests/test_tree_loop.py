"""Token trees in the loop (``meta_tree=True``): greedy output is plain `generate`'s through both entry points, the
width policy builds trees where a pass's width is cheap and picks one arm where it is dear (a fake pass-cost curve),
and where a tree cannot run the call verifies chains and says why, once (sampling: `tests/test_tree_sampling.py`)."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from conftest import StopOnToken, greedy, metasd_greedy, prompts
from test_architectures import perturbed
from test_feature_head_drafter import _Spy, trained_head
from transformers import DynamicCache, LlamaForCausalLM

import hf_metasd
from hf_metasd import MetaSDTypeError
from hf_metasd.drafters import ModelDrafter, PromptLookupDrafter
from hf_metasd.feature_head import FeatureRecorder
from hf_metasd.tree import tree_unsupported

MAX_NEW = 24
PROMPTS = prompts(3, seed=41, min_len=5)
#: a verification pass that costs the same at every width (a GPU's few-token passes), and one that costs its width
FLAT, LINEAR = 1.0, [float(k) for k in range(1, 65)]


@pytest.fixture(autouse=True)
def _both(entry_point):
    """Every test here runs through both entry points (`metasd_greedy` follows the fixture)."""


def tree_rounds(stats) -> int:
    return sum(len(arms) > 1 for arms in stats.tree_arms)


def _pool(kind: str, target, drafters, target_copy) -> list:
    return {
        "models": [drafters[0], ModelDrafter(target_copy, name="copy"), drafters[1]],
        "disagreeing": [ModelDrafter(d, name=f"drafter{i}") for i, d in enumerate(drafters)],
        "noisy": [ModelDrafter(perturbed(target, scale=0.5, seed=s), name=f"noisy{s}") for s in (1, 2, 3)],
        "mixed": [drafters[0], PromptLookupDrafter(), ModelDrafter(target_copy, name="copy")],
        "model_free": [PromptLookupDrafter(), PromptLookupDrafter(1, name="unigram")],
    }[kind]


@pytest.mark.parametrize("policy", [None, "ucb"])
@pytest.mark.parametrize("pool", ["models", "disagreeing", "mixed", "model_free"])
def test_greedy_with_trees_is_plain_generate(target, drafters, target_copy, fake_clock, pool, policy):
    """Cheap width (every pass costs one unit): trees of several arms run, and the output is plain greedy output.

    Pools that hold an exact copy of the target (``models``, ``mixed``) build trees only until the copy is known to
    be accepted in full (a tree then gains nothing over its chain), so how many they build depends on what the policy
    tried first; the others build trees on every call."""
    settings = {} if policy is None else {"meta_policy": policy}
    trees = 0
    with fake_clock.charging((target, FLAT)):
        for prompt in PROMPTS:
            reference = greedy(target, prompt, MAX_NEW)
            out = metasd_greedy(
                target,
                prompt,
                MAX_NEW,
                assistant_models=_pool(pool, target, drafters, target_copy),
                meta_tree=True,
                return_dict_in_generate=True,
                **settings,
            )
            assert torch.equal(out.sequences, reference), f"{pool} pool, {policy or 'default'} policy"
            assert out.metasd.tree_reason is None
            trees += tree_rounds(out.metasd)
            hf_metasd.disable()
    if pool not in ("models", "mixed"):
        assert trees >= len(PROMPTS), f"{pool} pool: {trees} tree rounds"


def test_processors_stopping_scores_and_logits_are_plain_generates(target, drafters, target_copy, fake_clock):
    """Logits processors read each node's own sequence, a stopping criterion cuts inside a kept path, and the
    scores and logits of every kept token are those plain `generate` returns."""
    asked = {"return_dict_in_generate": True, "output_scores": True, "output_logits": True}
    processors = {"repetition_penalty": 1.5, "no_repeat_ngram_size": 3}
    pool = [drafters[0], PromptLookupDrafter(), ModelDrafter(drafters[2], name="drafter2")]  # no arm always accepted
    trees = 0
    with fake_clock.charging((target, FLAT)):
        for prompt in PROMPTS:
            plain = greedy(target, prompt, MAX_NEW, **asked, **processors)
            stop = int(plain.sequences[0, -5])
            plain_stopped = greedy(target, prompt, MAX_NEW, stopping_criteria=[StopOnToken(stop)])
            out = metasd_greedy(target, prompt, MAX_NEW, assistant_models=pool, meta_tree=True, **asked, **processors)
            assert torch.equal(out.sequences, plain.sequences)
            for name in ("scores", "logits"):
                for step, (a, b) in enumerate(zip(getattr(out, name), getattr(plain, name), strict=True)):
                    torch.testing.assert_close(a, b, atol=2e-5, rtol=0, msg=f"{name} at step {step}")
            trees += tree_rounds(out.metasd)
            stopped = metasd_greedy(
                target, prompt, MAX_NEW, assistant_models=pool, meta_tree=True, stopping_criteria=[StopOnToken(stop)]
            )
            assert torch.equal(stopped, plain_stopped)
            hf_metasd.disable()
    assert trees > 0


def test_a_passed_cache_and_feature_heads_with_trees(target, drafters, fake_clock):
    """A cache passed in is continued as plain `generate` continues it, and a feature head in the tree observes the
    target's features at every kept position (the kept path's rows of each tree pass), nothing else."""
    _Spy.log = []
    first = target.generate(PROMPTS[0], do_sample=False, max_new_tokens=5, return_dict_in_generate=True)
    prompt = torch.cat([first.sequences, torch.tensor([[9, 4]])], dim=-1)
    reference = target.generate(prompt, do_sample=False, max_new_tokens=MAX_NEW, cache=copy.deepcopy(first.cache))
    pool = [_Spy(trained_head(target), name="spy"), PromptLookupDrafter(), drafters[0]]
    with fake_clock.charging((target, FLAT)):
        for _ in range(2):  # the second call starts with the costs measured: trees from its second round
            _Spy.log = []
            out = metasd_greedy(
                target,
                prompt,
                MAX_NEW,
                assistant_models=pool,
                meta_tree=True,
                cache=copy.deepcopy(first.cache),
                return_dict_in_generate=True,
            )
            assert torch.equal(out.sequences, reference)
    assert tree_rounds(out.metasd) > 0
    # without a passed cache the features are checked against one pass over the output
    _Spy.log = []
    with fake_clock.charging((target, FLAT)):
        out = metasd_greedy(
            target, PROMPTS[1], MAX_NEW, assistant_models=pool, meta_tree=True, return_dict_in_generate=True
        )
    assert tree_rounds(out.metasd) > 0
    with torch.no_grad(), FeatureRecorder(target, (1, 2)) as recorder:
        target(out.sequences)
    features = torch.cat([f for f, _, _ in _Spy.log], dim=1)
    assert torch.equal(torch.cat([n for _, n, _ in _Spy.log], dim=1), out.sequences[:, 1:])
    torch.testing.assert_close(features, recorder.features()[:, :-1], atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------------------------------------
# the width policy on a fake pass-cost curve
# ---------------------------------------------------------------------------------------------------------------------
def _calls(target, pool, fake_clock, units, n: int = 3):
    stats = []
    with fake_clock.charging((target, units)):
        for prompt in PROMPTS[:n]:
            out = metasd_greedy(
                target, prompt, MAX_NEW, assistant_models=pool, meta_tree=True, return_dict_in_generate=True
            )
            assert torch.equal(out.sequences, greedy(target, prompt, MAX_NEW))
            stats.append(out.metasd)
    return stats


def test_cheap_width_builds_trees_of_several_arms(target, drafters, target_copy, fake_clock):
    """Three noisy copies of the target, none of them right every time: once the pass costs are measured, every
    drafting round but the call's first verifies a tree of several of them, and each is kept now and then."""
    pool = _pool("noisy", target, drafters, target_copy)
    stats = _calls(target, pool, fake_clock, FLAT)
    last = stats[-1]
    drafting = [r for r, arms in enumerate(last.tree_arms) if arms and r > 0]
    assert drafting and all(len(last.tree_arms[r]) >= 2 for r in drafting)
    assert all(len(last.tree_arms[r]) == len(last.tree_lengths[r]) for r in range(last.rounds))
    assert all(last.tree_widths[r] <= 1 + sum(last.tree_lengths[r]) for r in range(last.rounds))
    # every other arm in a tree is scored (a side observation); the kept path follows more than one arm
    assert all(set(last.tree_rewards[r]) == set(last.tree_arms[r][1:]) for r in drafting)
    assert len({arm for s in stats for arm in s.path_arms if arm is not None}) >= 2
    summary = last.summary()
    assert f"trees: {tree_rounds(last)} of {last.rounds} rounds verified several arms" in summary
    assert "noisy1 in" in summary and last.to_dict()["tree_widths"] == last.tree_widths


def test_dear_width_picks_one_arm(target, drafters, target_copy, fake_clock):
    """A pass costs its width: no tree pays (the width policy prices wider passes on the measured slope), so every
    round is a chain, as without trees."""
    pool = _pool("noisy", target, drafters, target_copy)
    stats = _calls(target, pool, fake_clock, LINEAR)
    assert [tree_rounds(s) for s in stats] == [0, 0, 0]
    assert all(s.tree_reason is None for s in stats)
    assert "trees:" not in stats[-1].summary()


# ---------------------------------------------------------------------------------------------------------------------
# where a tree cannot run: chains, and why, once
# ---------------------------------------------------------------------------------------------------------------------
def test_where_a_tree_cannot_run_the_call_verifies_chains_and_says_why(target, drafters, target_copy, fake_clock):
    pool = _pool("mixed", target, drafters, target_copy)
    prompt = PROMPTS[0]
    reference = greedy(target, prompt, MAX_NEW)
    cases = {
        "one drafter": ({"assistant_models": pool[:1]}, r"^the pool has one drafter$"),
        "hidden states": (
            {"output_hidden_states": True},
            r"^per-step attentions and hidden states are split from chain passes$",
        ),
        "padded": (
            {"attention_mask": torch.cat([torch.zeros(1, 1), torch.ones(1, prompt.shape[1] - 1)], 1).long()},
            r"^a padded attention mask \(a tree pass attends to every cached position\)$",
        ),
    }
    with fake_clock.charging((target, FLAT)):
        for what, (kwargs, reason) in cases.items():
            kwargs = {"assistant_models": pool, **kwargs}
            out = metasd_greedy(target, prompt, MAX_NEW, meta_tree=True, return_dict_in_generate=True, **kwargs)
            plain = greedy(target, prompt, MAX_NEW, **{k: v for k, v in kwargs.items() if k != "assistant_models"})
            assert torch.equal(out.sequences, plain if isinstance(plain, torch.Tensor) else plain.sequences), what
            assert tree_rounds(out.metasd) == 0, what
            assert re.match(reason, out.metasd.tree_reason or ""), (what, out.metasd.tree_reason)
            assert f"trees: none ({out.metasd.tree_reason})" in out.metasd.summary()
            hf_metasd.disable()
    assert torch.equal(reference, greedy(target, prompt, MAX_NEW))
    # without `meta_tree` nothing is said
    out = metasd_greedy(target, prompt, MAX_NEW, assistant_models=pool, return_dict_in_generate=True)
    assert out.metasd.tree_reason is None and out.metasd.tree_arms == [] and "trees" not in out.metasd.summary()


def test_a_batch_verifies_chains_and_says_why(target, drafters, target_copy):
    pool = _pool("mixed", target, drafters, target_copy)
    batch = torch.stack([PROMPTS[0][0, :5], PROMPTS[1][0, :5]])
    plain = target.generate(batch, do_sample=False, max_new_tokens=8, attention_mask=torch.ones_like(batch))
    out = metasd_greedy(
        target,
        batch,
        8,
        assistant_models=pool,
        meta_tree=True,
        attention_mask=torch.ones_like(batch),
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, plain)
    for row in out.metasd.rows:
        assert row.tree_reason == "a batch (B > 1) verifies each row's chain in its one pass"
        assert tree_rounds(row) == 0


def test_attention_that_takes_no_dense_mask_and_other_caches_are_refused_a_tree(target):
    """`tree_unsupported` names the reason: an attention implementation without a dense mask, a cache without plain
    layers, extra model inputs, no `position_ids` or `cache` in `forward`."""
    ids = torch.tensor([[1, 2, 3]])
    cache = DynamicCache(config=target.config)
    assert tree_unsupported(target, cache, {}, ids) is None
    flash = copy.deepcopy(target)
    flash.config._attn_implementation = "flash_attention_2"
    assert tree_unsupported(flash, cache, {}, ids) == (
        "the attention implementation 'flash_attention_2' takes no custom 4-D mask (only ['eager', 'sdpa'])"
    )
    assert tree_unsupported(target, cache, {"token_type_ids": ids}, ids) == (
        "model inputs besides the ids and the mask (['token_type_ids']) are not fed to a tree pass"
    )
    assert tree_unsupported(target, object(), {}, ids) == "its cache (object) has no layers of keys and values"

    class NoPositions(LlamaForCausalLM):
        def forward(self, input_ids=None, attention_mask=None, cache=None, **kwargs):
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, cache=cache, **kwargs)

    assert tree_unsupported(NoPositions(target.config), cache, {}, ids) == (
        "NoPositions.forward takes no `position_ids` (a node's position is its depth)"
    )

    class OldCacheName(LlamaForCausalLM):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, **kwargs):
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, cache=past_key_values, **kwargs)

    assert tree_unsupported(OldCacheName(target.config), cache, {}, ids) == (
        "OldCacheName.forward takes no `cache` argument (a tree pass hands it the cache by that name)"
    )


def test_eager_attention_runs_trees(target, drafters, target_copy, fake_clock):
    eager = copy.deepcopy(target)
    eager.set_attn_implementation("eager")
    pool = _pool("disagreeing", target, drafters, target_copy)
    stats = _calls(eager, pool, fake_clock, FLAT, n=2)
    assert tree_rounds(stats[-1]) > 0


def test_meta_tree_must_be_a_bool(target, drafters):
    with pytest.raises(MetaSDTypeError, match=r"^`meta_tree` must be True or False, but is 'yes'\. Pass a bool\.$"):
        metasd_greedy(target, PROMPTS[0], 4, assistant_models=drafters, meta_tree="yes")
