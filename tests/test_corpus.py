"""Corpus drafter: the suffix array, the match and the vote on hand-made corpora, files, online growth, threads, and
the lossless check with a tiny target."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch
from conftest import VOCAB, greedy, metasd_greedy, prompts
from transformers import LogitsProcessorList, SuppressTokensLogitsProcessor

import hf_metasd
from hf_metasd.drafters import DRAFTER_KINDS, CorpusDrafter, CorpusIndex, corpus_index
from hf_metasd.drafters.corpus_index import CORPUS_FILE, build_suffix_array
from hf_metasd.errors import DrafterCompatibilityError


def _draft(drafter: CorpusDrafter, context: list[int], num_tokens: int = 8, **kwargs) -> list[int]:
    tokens, logits = drafter.draft(torch.tensor([context]), num_tokens, **kwargs)
    assert logits is None and tokens.shape[0] == 1 and tokens.dtype == torch.long
    return tokens[0].tolist()


# ---------------------------------------------------------------------------------------------------------------------
# the index
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(5))
def test_suffix_array_sorts_the_suffixes_lexicographically(seed):
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 3, size=int(rng.integers(1, 60)))  # tiny alphabet: long repeats, many rounds
    expected = sorted(range(len(values)), key=lambda i: values[i:].tolist())
    assert build_suffix_array(values).tolist() == expected


def test_suffix_array_of_nothing_and_of_one_value():
    assert build_suffix_array(np.zeros(0, dtype=np.int64)).tolist() == []
    assert build_suffix_array(np.array([7, 7, 7])).tolist() == [2, 1, 0]


def test_match_finds_the_longest_suffix_and_its_occurrences():
    index = CorpusIndex.from_sequences([[1, 2, 3, 4], [5, 2, 3, 6], [2, 3, 7]])
    assert index.num_documents == 3 and index.num_tokens == 11 and index.max_token_id == 7
    m, lo, hi = index.match([3, 2, 9])  # context "... 9 2 3": "2 3" occurs 3 times, "9 2 3" never
    assert (m, hi - lo) == (2, 3)
    assert sorted(index.continuations(lo, hi, 64, 2)) == [[4, -1], [6, -1], [7, -1]]
    m, lo, hi = index.match([3, 2, 1])
    assert (m, hi - lo) == (3, 1)
    assert index.match([8, 3])[0] == 0  # 8 is nowhere
    assert index.match([])[0] == 0 and CorpusIndex.from_sequences([]).match([1])[0] == 0


@pytest.mark.parametrize("seed", range(3))
def test_match_agrees_with_a_brute_force_search_on_random_corpora(seed):
    rng = np.random.default_rng(seed)
    documents = [rng.integers(0, 4, size=int(rng.integers(0, 30))).tolist() for _ in range(12)]
    index = CorpusIndex.from_sequences(documents)
    for _ in range(100):
        context = rng.integers(0, 4, size=int(rng.integers(1, 10))).tolist()
        expected_m, expected_support = 0, 0
        for m in range(len(context), 0, -1):  # the longest suffix of the context inside one document
            needle = context[-m:]
            support = sum(doc[i : i + m] == needle for doc in documents for i in range(len(doc) - m + 1))
            if support:
                expected_m, expected_support = m, support
                break
        m, lo, hi = index.match(context[::-1])
        assert (m, hi - lo) == (expected_m, expected_support)


def test_continuations_are_evenly_spaced_when_capped():
    index = CorpusIndex.from_sequences([[1, t] for t in range(10, 20)])
    m, lo, hi = index.match([1])
    assert (m, hi - lo) == (1, 10)
    rows = index.continuations(lo, hi, 5, 1)
    assert len(rows) == 5 and len({r[0] for r in rows}) == 5  # five different occurrences, not the first five twice


# ---------------------------------------------------------------------------------------------------------------------
# the draft, on hand-made corpora
# ---------------------------------------------------------------------------------------------------------------------
def test_the_longest_match_wins_over_more_frequent_shorter_ones():
    drafter = CorpusDrafter.from_sequences([[2, 3, 9, 9], [2, 3, 9, 9], [2, 3, 9, 9], [1, 2, 3, 4, 5]])
    assert _draft(drafter, [1, 2, 3]) == [4, 5]  # "1 2 3" (once) beats "2 3" (four times)
    assert (drafter.last_match_length, drafter.last_support) == (3, 1)
    assert _draft(drafter, [7, 2, 3]) == [9, 9]  # only "2 3" matches: 9 9 has 3 of 4 votes
    assert (drafter.last_match_length, drafter.last_support) == (2, 4)


def test_votes_take_the_most_frequent_token_and_break_ties_to_the_lowest_id():
    drafter = CorpusDrafter.from_sequences([[1, 2, 8, 1], [1, 2, 8, 2], [1, 2, 6, 3], [1, 2, 6, 4], [1, 2, 7]])
    # position 0: 8 and 6 tie with 2 votes each (7 has 1): 6 wins; position 1: 3 and 4 tie: 3 wins
    assert _draft(drafter, [1, 2]) == [6, 3]
    assert drafter.last_support == 5
    reordered = CorpusDrafter.from_sequences([[1, 2, 6, 4], [1, 2, 7], [1, 2, 8, 2], [1, 2, 6, 3], [1, 2, 8, 1]])
    assert _draft(reordered, [1, 2]) == [6, 3]  # deterministic: the corpus order does not matter


def test_a_document_end_loses_ties_and_stops_the_draft_when_it_wins():
    drafter = CorpusDrafter.from_sequences([[1, 2], [1, 2, 5]])
    assert _draft(drafter, [1, 2]) == [5]  # one "end" vote against one 5: the token wins
    ending = CorpusDrafter.from_sequences([[1, 2], [1, 2], [1, 2, 5]])
    assert _draft(ending, [1, 2]) == []  # "end" has 2 of 3 votes: nothing to propose


def test_min_frequency_shortens_the_draft_where_the_occurrences_disagree():
    sequences = [[1, 2, 3, 4, 5], [1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 3, 7, 8]]
    assert _draft(CorpusDrafter.from_sequences(sequences), [1, 2]) == [3, 4, 5]  # default 0.25
    assert _draft(CorpusDrafter.from_sequences(sequences, min_frequency=0.0), [1, 2]) == [3, 4, 5]
    assert _draft(CorpusDrafter.from_sequences(sequences, min_frequency=0.7), [1, 2]) == [3, 4]  # 4: 3/4, 5: 2/3
    assert _draft(CorpusDrafter.from_sequences(sequences, min_frequency=0.8), [1, 2]) == [3]  # 4: 3/4 < 0.8
    assert _draft(CorpusDrafter.from_sequences(sequences, min_frequency=1.0), [1, 2]) == [3]


def test_the_drafter_abstains_below_min_match_length():
    sequences = [[5, 6, 7, 8]]
    assert _draft(CorpusDrafter.from_sequences(sequences), [1, 7]) == []  # "7" alone: m = 1 < 2
    assert CorpusDrafter.from_sequences(sequences).draft(torch.tensor([[1, 7]]), 3)[0].shape == (1, 0)
    assert _draft(CorpusDrafter.from_sequences(sequences, min_match_length=1), [1, 7]) == [8]
    strict = CorpusDrafter.from_sequences(sequences, min_match_length=3)
    assert _draft(strict, [9, 6, 7]) == [] and strict.last_match_length == 2
    assert _draft(strict, [5, 6, 7]) == [8]


def test_matches_and_continuations_never_cross_a_document_boundary():
    drafter = CorpusDrafter.from_sequences([[1, 2], [3, 4, 5]], min_match_length=1)
    assert _draft(drafter, [1, 2]) == []  # "1 2" ends its document: no continuation into the next one
    assert _draft(drafter, [2, 3]) == [4, 5] and drafter.last_match_length == 1  # "2 3" spans two documents
    assert _draft(drafter, [9, 3, 4]) == [5] and drafter.last_match_length == 2
    assert _draft(drafter, [3, 4, 5]) == []  # the last document's end too


def test_num_tokens_and_max_match_length_cap_the_round():
    drafter = CorpusDrafter.from_sequences([list(range(1, 30))], max_match_length=4)
    assert _draft(drafter, [1, 2, 3], 5) == [4, 5, 6, 7, 8]
    assert _draft(drafter, [1, 2, 3], 1) == [4]
    assert _draft(drafter, [1, 2, 3], 0) == []
    assert _draft(drafter, [9, 10, 11, 12, 13], 2) == [14, 15] and drafter.last_match_length == 4


def test_logits_processors_cut_the_draft_before_the_first_forbidden_token(target):
    drafter = CorpusDrafter.from_sequences([[1, 2, 3, 4, 5]]).spawn(target)  # the copy knows the logits width
    processors = LogitsProcessorList([SuppressTokensLogitsProcessor([5])])
    assert _draft(drafter, [1, 2], logits_processor=processors) == [3, 4]
    assert _draft(drafter, [1, 2], logits_processor=LogitsProcessorList()) == [3, 4, 5]
    suppress_first = LogitsProcessorList([SuppressTokensLogitsProcessor([3])])
    assert _draft(drafter, [1, 2], logits_processor=suppress_first) == []
    with_vocab = CorpusDrafter.from_sequences([[1, 2, 3, 4, 5]], vocab_size=VOCAB)  # before any spawn
    assert _draft(with_vocab, [1, 2], logits_processor=processors) == [3, 4]


def test_without_the_logits_width_processors_warn_and_the_draft_is_uncut(target):
    drafter = CorpusDrafter.from_sequences([[1, 2, 3, 4, 5]])
    processors = LogitsProcessorList([SuppressTokensLogitsProcessor([5])])
    with pytest.warns(
        UserWarning, match=r"cannot apply the logits processors .* Draft with `drafter\.spawn\(target\)`"
    ):
        assert _draft(drafter, [1, 2], logits_processor=processors) == [3, 4, 5]
    assert _draft(drafter.spawn(target), [1, 2], logits_processor=processors) == [3, 4]  # the fix it suggests
    assert _draft(drafter.spawn(), [1, 2]) == [3, 4, 5]


def test_the_drafter_is_registered_and_its_config_is_json():
    drafter = CorpusDrafter.from_sequences([[1, 2, 3]], name="code", min_frequency=0.25, vocab_size=VOCAB)
    assert DRAFTER_KINDS["corpus"] is CorpusDrafter and drafter.kind == "corpus" and drafter.name == "code"
    assert drafter.returns_logits is False and drafter.vocab_size == VOCAB
    assert json.loads(json.dumps(drafter.config())) == {
        "max_match_length": 16,
        "min_match_length": 2,
        "max_occurrences": 64,
        "min_frequency": 0.25,
        "context_lookup": False,
        "online_tokens": 0,
        "vocab_size": VOCAB,
    }
    assert drafter.catch_up(torch.tensor([[1, 2]])) is None and drafter.last_catch_up_tokens == 0


# ---------------------------------------------------------------------------------------------------------------------
# settings and compatibility errors
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "error", "match", "fix"),
    [
        ({"max_match_length": 0}, ValueError, r"`max_match_length` must be an int >= 1, but is 0\. Use e\.g\. 16", 16),
        ({"max_match_length": 2.0}, TypeError, r"`max_match_length` must be an int, but is float 2\.0\. Use", 16),
        ({"min_match_length": 0}, ValueError, r"`min_match_length` must be an int >= 1, but is 0\. Use e\.g\. 2", 2),
        (
            {"min_match_length": 20},
            ValueError,
            r"`min_match_length` must be <= `max_match_length` \(16\), but is 20\. Lower `min_match_length`",
            2,
        ),
        ({"max_occurrences": -3}, ValueError, r"`max_occurrences` must be an int >= 1, but is -3\. Use e\.g\. 64", 64),
        (
            {"min_frequency": 1.5},
            ValueError,
            r"`min_frequency` must be a float in \[0, 1\], but is 1\.5\. Use e\.g\. 0\.25\.",
            0.25,
        ),
        (
            {"min_frequency": "high"},
            TypeError,
            r"`min_frequency` must be a float, but is str 'high'\. Use e\.g\. 0\.25\.",
            0.25,
        ),
        ({"online_tokens": -1}, ValueError, r"`online_tokens` must be an int >= 0, but is -1\. Use e\.g\. 100000", 0),
        ({"online_tokens": True}, TypeError, r"`online_tokens` must be an int, but is bool True\. Use e\.g\.", 0),
        (
            {"context_lookup": "yes"},
            TypeError,
            r"`context_lookup` must be True or False, but is 'yes'\. Pass a bool\.",
            True,
        ),
        ({"vocab_size": 0}, ValueError, r"`vocab_size` must be an int >= 1, but is 0\. Use e\.g\. 49152", VOCAB),
        (
            {"vocab_size": 4},
            ValueError,
            r"`vocab_size` must exceed every corpus token id, but is 4 while the corpus holds id 5\. Pass the target",
            VOCAB,
        ),
    ],
)
def test_bad_settings_are_refused_with_the_fix(kwargs, error, match, fix):
    with pytest.raises(error, match=match):
        CorpusDrafter.from_sequences([[1, 2, 3, 4, 5]], **kwargs)
    fixed = CorpusDrafter.from_sequences([[1, 2, 3, 4, 5]], **dict.fromkeys(kwargs, fix))  # the suggested fix works
    assert _draft(fixed, [1, 2], 2) == [3, 4]


@pytest.mark.parametrize(
    ("sequences", "error", "match"),
    [
        ("1 2 3", TypeError, r"`sequences` must be a list of token-id lists, but is str\. Pass e\.g\."),
        ([[1, 2], "ab"], TypeError, r"`sequences\[1\]` must be a list of token ids, but is str\. Pass e\.g\."),
        ([[1, 2], [[1, 2]]], TypeError, r"`sequences\[1\]` must be a flat list of int token ids, but has shape"),
        ([[1, 2], [0.5]], TypeError, r"`sequences\[1\]` must be a flat list of int token ids, but has shape \(1,\)"),
        ([[1, -100]], ValueError, r"`sequences\[0\]` must hold token ids in \[0, 2147483647\], but holds -100\. Pass"),
    ],
)
def test_bad_corpora_are_refused(sequences, error, match):
    with pytest.raises(error, match=match):
        CorpusDrafter.from_sequences(sequences)


def test_index_must_be_a_corpus_index():
    with pytest.raises(TypeError, match=r"`index` must be a `CorpusIndex`, but is list\. Build the drafter with"):
        CorpusDrafter([[1, 2, 3]])


def test_corpora_accept_tensors_arrays_and_empty_documents():
    drafter = CorpusDrafter.from_sequences([torch.tensor([1, 2, 3]), np.array([4, 5], dtype=np.int64), []])
    assert drafter.index.documents() == [[1, 2, 3], [4, 5], []] and _draft(drafter, [1, 2]) == [3]
    assert _draft(CorpusDrafter.from_sequences([]), [1, 2]) == []


def test_check_compatible_has_no_side_effects_and_names_the_fix(target):
    drafter = CorpusDrafter.from_sequences([[1, 2, 3]])
    before = dict(vars(drafter))
    drafter.check_compatible(target)  # VOCAB-wide target, ids below it: fine
    assert vars(drafter) == before
    CorpusDrafter.from_sequences([[1, 2, 3]], vocab_size=VOCAB).check_compatible(target)
    with pytest.raises(DrafterCompatibilityError, match=r"must have the target's vocabulary size 96, but has 97\."):
        CorpusDrafter.from_sequences([[1, 2, 3]], vocab_size=VOCAB + 1).check_compatible(target)
    with pytest.raises(
        DrafterCompatibilityError,
        match=r"drafter 'corpus' must hold token ids below the target's vocabulary size 96, but its corpus holds id "
        r"200\. Build the corpus with the target's tokenizer\.",
    ):
        CorpusDrafter.from_sequences([[1, 200]]).check_compatible(target)


# ---------------------------------------------------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------------------------------------------------
def test_save_corpus_and_from_folder_round_trip_without_rebuilding(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    sequences = [rng.integers(0, 6, size=int(rng.integers(0, 40))).tolist() for _ in range(30)]
    drafter = CorpusDrafter.from_sequences(sequences, vocab_size=VOCAB)
    path = drafter.save_corpus(tmp_path / "code")
    assert path == tmp_path / "code" / CORPUS_FILE and path.is_file()

    def no_rebuild(values):
        raise AssertionError("from_folder rebuilt the suffix array")

    monkeypatch.setattr(corpus_index, "build_suffix_array", no_rebuild)
    loaded = CorpusDrafter.from_folder(tmp_path / "code", name="code")
    assert loaded.index.documents() == sequences and loaded.vocab_size == VOCAB and loaded.name == "code"
    assert loaded.config() == drafter.config()
    for _ in range(50):
        context = rng.integers(0, 6, size=int(rng.integers(1, 12))).tolist()
        assert _draft(loaded, context, 6) == _draft(drafter, context, 6)
    other = CorpusDrafter.from_folder(tmp_path / "code", vocab_size=100, max_match_length=8)  # settings override
    assert other.config() == {**drafter.config(), "vocab_size": 100, "max_match_length": 8}


def test_truncated_or_foreign_corpus_files_are_refused_with_the_fix(tmp_path):
    drafter = CorpusDrafter.from_sequences([[1, 2, 3, 4]] * 50)
    path = drafter.save_corpus(tmp_path)
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(ValueError, match=r"corpus\.safetensors' must be a readable safetensors file, but reading it"):
        CorpusDrafter.from_folder(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"`folder` must hold `corpus\.safetensors`, but .* does not exist\."):
        CorpusDrafter.from_folder(tmp_path / "nowhere")

    from safetensors.numpy import save_file

    save_file({"tokens": np.zeros(3, dtype=np.int32)}, str(path))
    with pytest.raises(
        ValueError, match=r"must be a corpus written by `save_corpus`, but its metadata format is None"
    ):
        CorpusDrafter.from_folder(tmp_path)
    arrays = drafter.index.arrays()
    save_file({**arrays, "suffix_array": np.zeros_like(arrays["suffix_array"])}, str(path), metadata=_META)
    with pytest.raises(ValueError, match=r"but its `suffix_array` is not a permutation of range\(250\)\. Re-create"):
        CorpusDrafter.from_folder(tmp_path)
    shuffled = np.random.default_rng(0).permutation(arrays["suffix_array"]).astype(np.int32)
    save_file({**arrays, "suffix_array": shuffled}, str(path), metadata=_META)
    with pytest.raises(ValueError, match=r"but its `suffix_array` is not sorted\. Re-create it with"):
        CorpusDrafter.from_folder(tmp_path)
    save_file({**arrays, "offsets": arrays["offsets"][:-1]}, str(path), metadata=_META)
    with pytest.raises(ValueError, match=r"but its `offsets` are not the non-decreasing document starts"):
        CorpusDrafter.from_folder(tmp_path)
    drafter.save_corpus(tmp_path)  # the fix: write it again
    assert _draft(CorpusDrafter.from_folder(tmp_path), [1, 2]) == [3, 4]


_META = {"format": "hf_metasd.corpus", "version": "1"}


# ---------------------------------------------------------------------------------------------------------------------
# online growth, spawn, threads
# ---------------------------------------------------------------------------------------------------------------------
def test_online_growth_is_off_by_default():
    drafter = CorpusDrafter.from_sequences([[1, 2, 3]])
    drafter.on_generation_end(torch.tensor([[9, 9, 5, 6, 7]]), 2)
    assert drafter.online_held_tokens == 0 and _draft(drafter, [5, 6]) == []


def test_online_growth_is_bounded_in_tokens_and_used_by_later_queries():
    drafter = CorpusDrafter.from_sequences([[1, 2, 3]], online_tokens=8)
    clone = drafter.spawn()  # copies made before the growth see it too
    assert _draft(drafter, [5, 6]) == []
    drafter.on_generation_end(torch.tensor([[9, 9, 5, 6, 7]]), 2)  # the prompt (9 9) is not stored
    assert drafter.online_held_tokens == 3
    assert _draft(drafter, [5, 6]) == [7] and _draft(clone, [5, 6]) == [7]
    assert _draft(drafter, [1, 2]) == [3]  # the static corpus still answers
    drafter.on_generation_end(torch.tensor([[9, 10, 11, 12, 13]]), 1)  # 3 + 4 tokens: both kept
    assert drafter.online_held_tokens == 7 and _draft(drafter, [5, 6]) == [7] and _draft(drafter, [10, 11]) == [12, 13]
    drafter.on_generation_end(torch.tensor([[20, 21, 22]]), 0)  # 10 > 8: the oldest document goes
    assert drafter.online_held_tokens == 7 and _draft(drafter, [5, 6]) == [] and _draft(drafter, [21]) == []
    assert _draft(drafter, [20, 21]) == [22]
    drafter.on_generation_end(torch.tensor([list(range(30, 50))]), 0)  # longer than the store: its first 8 tokens
    assert drafter.online_held_tokens == 8 and _draft(drafter, [36, 37]) == [] and _draft(drafter, [35, 36]) == [37]


def test_online_and_static_matches_of_equal_length_vote_together():
    drafter = CorpusDrafter.from_sequences([[1, 2, 3], [1, 2, 3]], online_tokens=100)
    for _ in range(3):
        drafter.on_generation_end(torch.tensor([[1, 2, 4]]), 0)
    assert _draft(drafter, [1, 2]) == [4] and drafter.last_support == 5  # 4 has 3 of 5 votes
    drafter.on_generation_end(torch.tensor([[7, 1, 2, 5]]), 0)
    assert _draft(drafter, [7, 1, 2]) == [5] and drafter.last_support == 1  # the longer online match wins


def test_spawn_shares_the_index_and_copies_are_independent():
    drafter = CorpusDrafter.from_sequences([[1, 2, 3, 4], [5, 6, 7]], online_tokens=10)
    a, b = drafter.spawn(), drafter.spawn()
    assert a.index is drafter.index and b.index is drafter.index and a._online is drafter._online
    assert _draft(a, [1, 2]) == [3, 4] and _draft(b, [9, 5, 6]) == [7]
    assert (a.last_match_length, a.last_support) == (2, 1) and b.last_match_length == 2
    assert drafter.last_match_length == 0  # the shared drafter's telemetry is untouched
    _draft(b, [8, 8])
    assert a.last_match_length == 2 and b.last_match_length == 0


def test_concurrent_drafts_on_spawned_copies_agree_with_sequential_ones():
    rng = np.random.default_rng(1)
    sequences = [rng.integers(0, 8, size=50).tolist() for _ in range(40)]
    drafter = CorpusDrafter.from_sequences(sequences, online_tokens=500)
    contexts = [rng.integers(0, 8, size=10).tolist() for _ in range(60)]
    expected = [_draft(drafter, c, 5) for c in contexts]
    results: dict[int, list[list[int]]] = {}
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            mine = drafter.spawn()
            results[k] = [_draft(mine, c, 5) for c in contexts]
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and all(results[k] == expected for k in range(4))

    # generation ends racing with drafts: the store stays bounded and consistent
    def grow(k: int) -> None:
        for i in range(25):
            drafter.on_generation_end(torch.tensor([[k, i, 100 + k, 200 + i]]), 0)
            drafter.spawn().draft(torch.tensor([[k, i]]), 2)

    threads = [threading.Thread(target=grow, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert drafter.online_held_tokens <= 500 and drafter.online_held_tokens == 4 * 25 * 4
    assert _draft(drafter, [3, 24], 2) == [103, 224]


# ---------------------------------------------------------------------------------------------------------------------
# context lookup
# ---------------------------------------------------------------------------------------------------------------------
def _context_ends(context: np.ndarray, m: int) -> list[int]:
    """Brute force: where an earlier occurrence of the last `m` tokens of `context` ends."""
    n = len(context)
    return [i for i in range(m - 1, n - 1) if context[i - m + 1 : i + 1].tolist() == context[n - m :].tolist()]


@pytest.mark.parametrize("seed", range(4))
def test_context_match_agrees_with_a_brute_force_search(seed):
    rng = np.random.default_rng(seed)
    for _ in range(30):
        context = rng.integers(0, 3, size=int(rng.integers(1, 40)))
        expected = max((m for m in range(1, min(6, len(context)) + 1) if _context_ends(context, m)), default=0)
        m, ends = corpus_index.context_match(context, 6)
        assert m == expected and ends.tolist() == (_context_ends(context, m) if m else [])


def test_context_lookup_is_off_by_default_and_then_the_context_is_not_searched():
    drafter = CorpusDrafter.from_sequences([[1, 2, 3, 4]])
    assert drafter.context_lookup is False
    assert _draft(drafter, [7, 8, 9, 7, 8], 3) == []  # "7 8" occurs in the context, not in the corpus


def test_context_lookup_drafts_from_the_context_when_the_corpus_has_no_match():
    drafter = CorpusDrafter.from_sequences([[1, 2, 3, 4]], context_lookup=True)
    assert _draft(drafter, [7, 8, 9, 7, 8], 3) == [9, 7, 8]  # continuations stop where the context ends
    assert (drafter.last_match_length, drafter.last_support) == (2, 1)
    assert _draft(drafter, [5, 6, 5], 2) == [6, 5]  # a one-token match drafts (below min_match_length = 2)
    assert _draft(drafter, [5, 6], 2) == [] and drafter.last_match_length == 0  # 6 never occurred before


def test_context_lookup_the_longer_match_wins_and_equal_ones_vote_together():
    drafter = CorpusDrafter.from_sequences([[1, 2, 3, 4, 5], [2, 3, 4, 9]], context_lookup=True)
    # corpus "2 3 4" (3 tokens, then 5 or 9) beats the context's "3 4" (then 6)
    assert _draft(drafter, [3, 4, 6, 2, 3, 4], 1) in ([5], [9]) and drafter.last_match_length == 3
    # the context's "8 2 3" (3 tokens, then 7) beats the corpus's "2 3"
    assert _draft(drafter, [8, 2, 3, 7, 8, 2, 3], 1) == [7] and drafter.last_match_length == 3
    # equal: the corpus's "2 3" twice (then 4) and the context's "2 3" three times (then 6): 6 wins the vote 3 to 2
    assert _draft(drafter, [2, 3, 6, 2, 3, 6, 2, 3, 6, 0, 2, 3], 1) == [6]
    assert (drafter.last_match_length, drafter.last_support) == (2, 5)
    # the corpus's "2 3" twice (then 4) against the context's once (then 6): 4
    assert _draft(drafter, [2, 3, 6, 0, 2, 3], 1) == [4]


def test_context_lookup_round_trips_through_a_pool(tmp_path, target):
    drafter = CorpusDrafter.from_sequences([[1, 2, 3, 4]], context_lookup=True, vocab_size=VOCAB, name="c")
    pool = hf_metasd.DrafterPool([drafter], target=target)
    pool.save_pretrained(tmp_path)
    (loaded,) = hf_metasd.DrafterPool.from_pretrained(str(tmp_path), target=target).drafters
    assert loaded.context_lookup is True and loaded.config() == drafter.config()


# ---------------------------------------------------------------------------------------------------------------------
# lossless with a tiny target
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("context_lookup", [False, True])
def test_greedy_output_is_the_targets_own_with_a_corpus_of_its_answers(target, context_lookup):
    known, new = prompts(6, seed=7), prompts(3, seed=8)
    answers = [greedy(target, p, 20)[0, p.shape[1] :].tolist() for p in known]
    drafter = CorpusDrafter.from_sequences(answers, vocab_size=VOCAB, name="answers", context_lookup=context_lookup)
    accepted = 0
    for prompt in known + new:
        out = metasd_greedy(target, prompt, 20, assistant_models=[drafter], return_dict_in_generate=True)
        assert torch.equal(out.sequences, greedy(target, prompt, 20)), "the corpus drafter changed the greedy output"
        accepted += sum(out.metasd.accepted)
    assert accepted > 0  # the drafter really drafted tokens the target kept


@pytest.mark.parametrize("context_lookup", [False, True])
def test_greedy_output_is_the_targets_own_under_logits_processors_and_sampling_runs(target, context_lookup):
    known = prompts(4, seed=7)
    answers = [greedy(target, p, 20)[0, p.shape[1] :].tolist() for p in known]
    drafter = CorpusDrafter.from_sequences(answers, context_lookup=context_lookup)
    kwargs = {"repetition_penalty": 1.3, "no_repeat_ngram_size": 3}
    for prompt in known:
        out = metasd_greedy(target, prompt, 20, assistant_models=[drafter], **kwargs)
        assert torch.equal(out, greedy(target, prompt, 20, **kwargs))
    torch.manual_seed(0)
    out = target.generate(
        known[0],
        do_sample=True,
        top_k=20,
        max_new_tokens=20,
        custom_generate=hf_metasd.generate,
        assistant_models=[drafter],
    )
    assert out.shape == (1, known[0].shape[1] + 20) and torch.equal(out[:, : known[0].shape[1]], known[0])


def test_online_growth_through_generate_drafts_an_answer_seen_in_an_earlier_call(target):
    drafter = CorpusDrafter.from_sequences([], online_tokens=1000, vocab_size=VOCAB)
    prompt = prompts(1, seed=9)[0]
    reference = greedy(target, prompt, 20)
    first = metasd_greedy(target, prompt, 20, assistant_models=[drafter], return_dict_in_generate=True)
    assert torch.equal(first.sequences, reference) and sum(first.metasd.accepted) == 0  # nothing to draft from yet
    assert drafter.online_held_tokens == 20  # the generated part, not the prompt
    # the drafter alone (a fixed policy), so that what is tested is the corpus, not how soon a policy retries it
    second = metasd_greedy(
        target, prompt, 20, assistant_models=[drafter], return_dict_in_generate=True, meta_policy="fixed"
    )
    assert torch.equal(second.sequences, reference) and sum(second.metasd.accepted) > 0
