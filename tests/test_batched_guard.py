"""Batches remember what their drafting guard found (`hf_metasd.batched.lengths.GuardMemory`): after a call measured
drafting slower than plain rounds at a batch size, the next calls with that pool run plain batched `generate`'s own
loop, and drafting is measured again after 1, 2, 4, ... such calls; output is plain batched greedy either way."""

from __future__ import annotations

import torch
from conftest import greedy, metasd_greedy, sharpen, tiny_llama

from hf_metasd.batched.lengths import MAX_PLAIN_CALLS, GuardMemory
from hf_metasd.drafters import ModelDrafter

BATCH = torch.tensor([[5, 9, 14, 3, 7, 21], [8, 2, 30, 11, 4, 6]])
MAX_NEW = 24


def _call(target, pool, fake_clock, drafter_units: float):
    """One batch call on a fake clock: a target pass costs 1, a drafter forward `drafter_units`."""
    with fake_clock.charging((target, 1.0), (pool[0].model, drafter_units)):
        return metasd_greedy(target, BATCH, MAX_NEW, assistant_models=pool, return_dict_in_generate=True)


def test_a_slow_drafting_batch_makes_the_next_calls_plain_until_it_is_measured_again(target, fake_clock):
    pool = [ModelDrafter(sharpen(tiny_llama(2, layers=1)), name="slow")]
    reference = greedy(target, BATCH, MAX_NEW)
    reasons, stopped = [], []
    for _ in range(6):
        out = _call(target, pool, fake_clock, drafter_units=3.0)  # every draft costs three passes: never pays
        assert torch.equal(out.sequences, reference)
        reasons.append(out.metasd.plain_reason)
        stopped.append(out.metasd.drafting_stopped_after)
    plain = [
        r is not None and r.startswith("every round: an earlier call with this pool measured drafting")
        for r in reasons
    ]
    # drafts (slower: the guard stops it), 1 plain call, drafts (its lengths now draft nothing: counts as slower),
    # 2 plain calls, drafts again
    assert plain == [False, True, False, True, True, False]
    assert stopped[0] is not None


def test_a_call_that_drafts_to_its_end_lets_the_next_calls_draft(target, fake_clock):
    pool = [ModelDrafter(sharpen(tiny_llama(2, layers=1)), name="cheap")]
    _call(target, pool, fake_clock, drafter_units=3.0)  # slower: the next call runs plain
    assert _call(target, pool, fake_clock, drafter_units=0.0).metasd.plain_reason is not None
    memory = GuardMemory(next(iter(_keys(target))), pool)
    memory.record(stopped=False, rounds=8)  # as a call that drafted to its end records it
    assert _call(target, pool, fake_clock, drafter_units=0.0).metasd.plain_reason is None


def test_the_memory_backs_off_to_its_cap(target):
    from hf_metasd.drafters import PromptLookupDrafter

    key, pool = torch.nn.Linear(1, 1), [PromptLookupDrafter()]
    runs = []
    for _ in range(8):
        GuardMemory(key, pool).record(stopped=True, rounds=4)
        runs.append(GuardMemory(key, pool).next_check)
        while GuardMemory(key, pool).plain():
            pass
    assert runs == [1, 2, 4, 8, 16, MAX_PLAIN_CALLS, MAX_PLAIN_CALLS, MAX_PLAIN_CALLS]
    GuardMemory(key, pool).record(stopped=False, rounds=2)  # too few rounds to judge: nothing changes
    GuardMemory(key, pool).record(stopped=True, rounds=4)
    assert GuardMemory(key, pool).next_check == MAX_PLAIN_CALLS


def _keys(target):
    from hf_metasd.batched.call import _BATCH_KEYS

    return _BATCH_KEYS[target].values()
