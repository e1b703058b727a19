"""What a call learns about a drafter (round costs, acceptance counts, learned priors) stays with that
drafter: keyed by `hf_metasd.costs.object_key` of the object holding its weights or corpus, never by an id a new
object can reuse, and swept out of the per-process caches once that object is gone."""

from __future__ import annotations

import gc

import pytest
import torch
from conftest import greedy, metasd_greedy, prompts, sharpen, tiny_llama

import hf_metasd.costs as costs
import hf_metasd.draft_length as draft_length
import hf_metasd.reward_memory as reward_memory
from hf_metasd import CorpusDrafter
from hf_metasd.costs import object_key, target_cache

PROMPT = prompts(1, seed=11)[0]
KWARGS = {"meta_reward": "bd", "meta_policy": "ucb_scaled", "return_dict_in_generate": True}


@pytest.fixture(scope="module")
def own_target():
    """A target of this module alone, so that its caches hold only what these tests put there."""
    return sharpen(tiny_llama(0))


def _maps(target) -> dict[str, dict]:
    """The target's map in each per-process cache, fetched (and so swept) as a call would."""
    return {
        "round costs": target_cache(costs._CACHE, target),
        "acceptance counts": target_cache(draft_length._CACHE, target),
        "learned rewards": target_cache(reward_memory._STORES.setdefault(None, type(costs._CACHE)()), target),
    }


# ---------------------------------------------------------------------- through generate
def test_brand_new_drafters_start_from_nothing_and_leave_nothing_behind(own_target):
    answer = greedy(own_target, PROMPT, 8)[0].tolist()
    started_from_another = []
    for i in range(250):  # each drafter is dropped before the next is made: their ids are reused
        drafter = CorpusDrafter.from_sequences([answer], name="c")
        out = metasd_greedy(own_target, PROMPT, 2, assistant_models=[drafter], **KWARGS)
        if out.metasd.learned_priors:
            started_from_another.append(i)
    assert out.metasd.pulls[0] > 0  # the drafter drafted, so it left rewards and costs behind
    assert started_from_another == []
    del drafter, out
    gc.collect()
    # what is left is not the drafters' (the verification costs by length are the target's)
    left = {name: [key for key in entries if key[0] != "verify"] for name, entries in _maps(own_target).items()}
    assert left == {name: [] for name in left}


def test_the_drafter_the_user_holds_keeps_what_it_learnt(own_target):
    answer = greedy(own_target, PROMPT, 8)[0].tolist()
    drafter = CorpusDrafter.from_sequences([answer], name="kept")
    metasd_greedy(own_target, PROMPT, 4, assistant_models=[drafter], **KWARGS)
    gc.collect()
    again = metasd_greedy(own_target, PROMPT, 4, assistant_models=[drafter], **KWARGS).metasd
    assert set(again.learned_priors) == {"kept"}


# ---------------------------------------------------------------------- the keys
def test_an_object_key_is_one_per_live_object_and_never_reused():
    layer = torch.nn.Linear(1, 1)
    assert object_key(layer) is object_key(layer) and object_key(layer).alive
    ids, keys = [], []
    for _ in range(50):
        other = torch.nn.Linear(1, 1)
        ids.append(id(other))
        keys.append(object_key(other))
        del other
    assert len(set(ids)) < len(ids)  # ids were reused ...
    assert len({id(key) for key in keys}) == len(keys)  # ... keys were not
    assert not any(key.alive for key in keys)


def test_an_object_that_cannot_be_weakly_referenced_gets_a_fresh_collected_key_every_time():
    holder = object()  # no weak references
    first, second = object_key(holder), object_key(holder)
    assert first is not second and not first.alive and not second.alive


# ---------------------------------------------------------------------- the maps
def test_a_map_is_swept_of_collected_objects_when_fetched():
    owner, live, gone = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    store = type(costs._CACHE)()
    entries = target_cache(store, owner)
    entries[(("model", object_key(live)), 1)] = 1.0
    entries[("accept", None, ("model", object_key(gone)), "match class", 2)] = 2.0
    entries["plain"] = 3.0
    del gone
    gc.collect()
    assert target_cache(store, owner) == {(("model", object_key(live)), 1): 1.0, "plain": 3.0}


def test_a_map_keeps_at_most_max_entries_dropping_the_oldest_written(monkeypatch):
    monkeypatch.setattr(costs, "MAX_ENTRIES", 3)
    owner, store = torch.nn.Linear(1, 1), type(costs._CACHE)()
    entries = target_cache(store, owner)
    for i in range(5):
        entries[i] = float(i)
    assert list(target_cache(store, owner)) == [2, 3, 4]
