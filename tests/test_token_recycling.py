"""The token recycling drafter: its table by hand, what it learns from verification passes, calls that share it, both
entry points, sampling, batches, and its pool entry as untrusted data."""

from __future__ import annotations

import json
import threading

import pytest
import torch
from conftest import VOCAB, greedy, metasd_greedy, prompts
from safetensors.torch import save_file
from transformers import LogitsProcessorList, SuppressTokensLogitsProcessor

import hf_metasd
from hf_metasd import DrafterPool
from hf_metasd.drafters import RecyclingTable, TokenRecyclingDrafter
from hf_metasd.drafters import token_recycling as module
from hf_metasd.errors import DrafterCompatibilityError, InvalidPoolError

MAX_NEW = 24
PROMPTS = prompts(4, seed=99)


@pytest.fixture(autouse=True)
def _both_entry_points(entry_point):
    return entry_point


# ---------------------------------------------------------------------------------------------------- the table
def test_the_table_by_hand():
    table = RecyclingTable()
    table.learn([5, 6, 7], [6, 7, 5])
    assert table.walk(5, 2) == [6, 7]
    assert table.walk(5, 7) == [6, 7, 5, 6, 7, 5, 6]  # a cycle is walked up to the length asked
    assert table.walk(9, 3) == []  # a token it does not hold: nothing
    table.learn([5, 5], [8, 9])  # a later position overwrites an earlier one
    assert table.walk(5, 3) == [9]
    assert len(table) == 3 and table.max_token_id == 9
    tokens, following = table.rows()
    assert tokens.tolist() == [5, 6, 7] and following.tolist() == [9, 7, 5] and tokens.dtype == torch.int32


def test_observe_scores_keeps_each_fed_tokens_most_likely_next_token():
    drafter = TokenRecyclingDrafter()
    scores = torch.zeros(1, 3, 10)
    scores[0, 0, 4], scores[0, 1, 2], scores[0, 2, 9] = 1.0, 1.0, 1.0
    drafter.observe_scores(torch.tensor([[1, 4, 3]]), scores)  # 3 was drafted after 4 and rejected: still learnt
    assert drafter.table.walk(1, 5) == [4, 2] and drafter.table.walk(3, 1) == [9]
    tokens, logits = drafter.draft(torch.tensor([[7, 1]]), 3)
    assert tokens.tolist() == [[4, 2]] and logits is None


def test_a_logits_processor_cuts_the_walk_where_it_forbids_a_token():
    drafter = TokenRecyclingDrafter(table=RecyclingTable({1: 4, 4: 2, 2: 6})).spawn()
    drafter._logits_width = 10
    no_twos = LogitsProcessorList([SuppressTokensLogitsProcessor([2])])
    tokens, _ = drafter.draft(torch.tensor([[1]]), 3, logits_processor=no_twos)
    assert tokens.tolist() == [[4]]


def test_spawned_copies_share_one_table():
    drafter = TokenRecyclingDrafter()
    copy = drafter.spawn()
    copy.table.learn([1], [2])
    assert copy.table is drafter.table and drafter.table.walk(1, 1) == [2]


def test_each_reward_memory_scope_learns_into_its_own_copy_of_the_table():
    drafter = TokenRecyclingDrafter(table=RecyclingTable({1: 2}))
    with hf_metasd.reward_memory_scope("a"):
        drafter.spawn().table.learn([2], [3])  # a spawned copy learns into scope a's table
        assert drafter.table.walk(1, 3) == [2, 3]
    with hf_metasd.reward_memory_scope("b"):
        assert drafter.table.walk(1, 3) == [2]  # scope b starts from the drafter's own table, not a's
    assert drafter.table.walk(1, 3) == [2]  # the default scope's table is the drafter's own, untouched by a and b
    drafter.table.learn([2], [4])
    with hf_metasd.reward_memory_scope("c"):
        assert drafter.table.walk(1, 3) == [2, 4]  # a new scope copies the drafter's table as it is then


def test_a_table_of_another_kind_is_refused():
    with pytest.raises(TypeError, match=r"`table` must be a `RecyclingTable` or None, but is dict\. Build one"):
        TokenRecyclingDrafter(table={1: 2})


def test_warm_start_reads_the_targets_greedy_next_tokens(target):
    drafter = TokenRecyclingDrafter()
    ids = greedy(target, PROMPTS[0], 8)[0].tolist()
    assert drafter.warm_start(target, [ids], chunk=5) == len(ids)
    last = target(torch.tensor([ids[5:]])).logits[0, -1].argmax().item()  # the second chunk's own pass
    assert drafter.table.walk(ids[-1], 1) == [last]
    with pytest.raises(ValueError, match=r"`chunk` must be an int >= 1, but is 0\. Use e\.g\. 1024\."):
        drafter.warm_start(target, [ids], chunk=0)


# ---------------------------------------------------------------------------------------------------- in generate
def test_it_learns_from_a_call_and_the_next_call_drafts_the_same_answer(target):
    drafter = TokenRecyclingDrafter()
    prompt = PROMPTS[1]
    reference = greedy(target, prompt, MAX_NEW)
    first = metasd_greedy(target, prompt, MAX_NEW, assistant_models=[drafter], return_dict_in_generate=True)
    assert torch.equal(first.sequences, reference) and len(drafter.table) > 0
    again = metasd_greedy(
        target,
        prompt,
        MAX_NEW,
        assistant_models=[drafter],
        meta_policy="fixed",
        num_assistant_tokens=4,
        meta_draft_length="fixed",
        return_dict_in_generate=True,
    )
    assert torch.equal(again.sequences, reference)
    stats = again.metasd
    assert sum(stats.accepted) > MAX_NEW // 2  # the table now holds this answer's next tokens
    assert len(stats.arms) < MAX_NEW


def test_concurrent_calls_share_the_table_and_stay_lossless(target):
    drafter = TokenRecyclingDrafter()
    references = [greedy(target, p, MAX_NEW) for p in PROMPTS]
    outputs: dict[int, torch.Tensor] = {}

    def run(i: int) -> None:
        outputs[i] = target.generate(
            PROMPTS[i],
            do_sample=False,
            max_new_tokens=MAX_NEW,
            custom_generate=hf_metasd.generate,
            assistant_models=[drafter],
        )

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(torch.equal(outputs[i], references[i]) for i in range(len(PROMPTS)))


def test_sampling_with_a_warm_table_keeps_its_tokens_in_the_vocabulary(target):
    drafter = TokenRecyclingDrafter()
    drafter.warm_start(target, [greedy(target, p, MAX_NEW)[0].tolist() for p in PROMPTS])
    torch.manual_seed(0)
    out = target.generate(
        PROMPTS[0],
        do_sample=True,
        top_k=10,
        max_new_tokens=MAX_NEW,
        custom_generate=hf_metasd.generate,
        assistant_models=[drafter],
        return_dict_in_generate=True,
    )
    new = out.sequences[0, PROMPTS[0].shape[1] :]
    assert new.shape[0] == MAX_NEW and int(new.max()) < VOCAB and sum(out.metasd.drafted) > 0


def test_a_batch_is_plain_batched_greedy(target):
    drafter = TokenRecyclingDrafter()
    drafter.warm_start(target, [greedy(target, p, MAX_NEW)[0].tolist() for p in PROMPTS])
    batch = torch.stack([PROMPTS[0][0, :3], PROMPTS[2][0, :3]])  # two prompts of one length: no padding
    reference = greedy(target, batch, MAX_NEW)
    out = metasd_greedy(target, batch, MAX_NEW, assistant_models=[drafter])
    assert torch.equal(out, reference)


# ---------------------------------------------------------------------------------------------------- pool entry
def test_a_pool_saves_and_loads_the_table(target, tmp_path):
    drafter = TokenRecyclingDrafter(name="recycled", table=RecyclingTable({3: 4, 4: 5}))
    DrafterPool([drafter], target=target).save_pretrained(tmp_path / "pool")
    entry = json.loads((tmp_path / "pool" / "config.json").read_text())["drafters"][0]
    assert entry["kind"] == "token_recycling" and entry["path"] == "recycling/recycled" and entry["stored"]
    [loaded] = DrafterPool.from_pretrained(str(tmp_path / "pool"), target=target).drafters
    assert isinstance(loaded, TokenRecyclingDrafter) and loaded.table.walk(3, 3) == [4, 5]


def _write(folder, **arrays):
    folder.mkdir(parents=True, exist_ok=True)
    save_file(arrays, str(folder / "table.safetensors"))


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"tokens": torch.tensor([1, 2], dtype=torch.int32)}, r"must hold `tokens` and `next_tokens`"),
        (
            {"tokens": torch.tensor([1], dtype=torch.int64), "next_tokens": torch.tensor([2], dtype=torch.int64)},
            r"`tokens` must be a 1-D int32 array, but is torch\.int64",
        ),
        (
            {"tokens": torch.tensor([1, 2], dtype=torch.int32), "next_tokens": torch.tensor([2], dtype=torch.int32)},
            r"must have one length of at most",
        ),
        (
            {"tokens": torch.tensor([-1], dtype=torch.int32), "next_tokens": torch.tensor([2], dtype=torch.int32)},
            r"every id must be >= 0",
        ),
        (
            {
                "tokens": torch.tensor([1, 1], dtype=torch.int32),
                "next_tokens": torch.tensor([2, 3], dtype=torch.int32),
            },
            r"`tokens` must hold each token once",
        ),
    ],
)
def test_a_stored_table_is_read_as_untrusted_data(target, tmp_path, arrays, message):
    DrafterPool([TokenRecyclingDrafter(name="r")], target=target).save_pretrained(tmp_path / "pool")
    _write(tmp_path / "pool" / "recycling" / "r", **arrays)
    with pytest.raises(InvalidPoolError, match=r"drafter 'r'.* must find a readable table at .*" + message):
        DrafterPool.from_pretrained(str(tmp_path / "pool"), target=target)


def test_a_table_over_the_row_limit_is_refused(target, tmp_path, monkeypatch):
    DrafterPool([TokenRecyclingDrafter(name="r", table=RecyclingTable({1: 2, 2: 3}))], target=target).save_pretrained(
        tmp_path / "pool"
    )
    monkeypatch.setattr(module, "MAX_ROWS", 1)
    with pytest.raises(InvalidPoolError, match=r"must have one length of at most 1, but have 2 and 2"):
        DrafterPool.from_pretrained(str(tmp_path / "pool"), target=target)


def test_a_table_with_ids_beyond_the_targets_vocabulary_is_refused_before_compute(target):
    drafter = TokenRecyclingDrafter(name="big", table=RecyclingTable({1: VOCAB + 5}))
    with pytest.raises(
        DrafterCompatibilityError,
        match=rf"drafter 'big' must hold token ids below the target's vocabulary size {VOCAB}, but its table holds id "
        rf"{VOCAB + 5}\. Warm it with the target's own tokens, or start it empty\.",
    ):
        metasd_greedy(target, PROMPTS[0], 4, assistant_models=[drafter])
    drafter.table = RecyclingTable()  # the fix: a table of the target's own tokens
    assert torch.equal(metasd_greedy(target, PROMPTS[0], 4, assistant_models=[drafter]), greedy(target, PROMPTS[0], 4))


def test_a_stored_entry_without_its_file_or_with_params_is_refused(target, tmp_path):
    DrafterPool([TokenRecyclingDrafter(name="r")], target=target).save_pretrained(tmp_path / "pool")
    config = json.loads((tmp_path / "pool" / "config.json").read_text())
    config["drafters"][0]["params"] = {"top_k": 3}
    (tmp_path / "pool" / "config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidPoolError, match=r"must have no `params`, but has \['top_k'\]\. Drop them"):
        DrafterPool.from_pretrained(str(tmp_path / "pool"), target=target)
