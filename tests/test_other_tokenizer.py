"""A drafter with another tokenizer (`TokenizerBridgeDrafter`): the re-tokenisation rules on hand-made tokenizers, the
drafter's catch-up and draft, pools mixing tokenizers (lossless under every policy, sampling), the pool round trip
(the drafter's tokenizer travels with it; the target's is required at load) and the error messages. No network."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import VOCAB, greedy, lossless_under, metasd_greedy, prompts, sharpen, tiny_llama
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import (
    AutoModelForCausalLM,
    LogitsProcessorList,
    PreTrainedTokenizerFast,
    SuppressTokensLogitsProcessor,
)

import hf_metasd
from hf_metasd.drafters import DRAFTER_KINDS, ModelDrafter, PromptLookupDrafter, tokenizer_fingerprint
from hf_metasd.drafters.other_tokenizer import TokenizerBridgeDrafter
from hf_metasd.drafters.retokenize import Continuation, continuation_ids, draft_steps, leading_special_ids
from hf_metasd.errors import DrafterCompatibilityError, InvalidPoolError
from hf_metasd.policies import POLICY_REGISTRY
from hf_metasd.pool import DrafterPool, DrafterPoolConfig

MAX_NEW = 20
PROMPTS = prompts(4, seed=31)
#: the 95 printable ASCII characters: the target's ids 1..95 (conftest's prompts use ids 1..95)
CHARS = [chr(c) for c in range(32, 127)]
MERGES = [("t", "h"), ("e", " "), ("a", "n"), ("i", "n"), ("o", "n")]


# ---------------------------------------------------------------------------------------------------------------------
# tokenizers built in memory
# ---------------------------------------------------------------------------------------------------------------------
def _char_level(vocab: dict[str, int]) -> PreTrainedTokenizerFast:
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<s>"))
    raw.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    raw.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>")


def char_tokenizer() -> PreTrainedTokenizerFast:
    """The target's: ``"<s>"`` (special) at 0, one id per printable character after it: 96 ids (`VOCAB`)."""
    return _char_level({"<s>": 0, **{c: i + 1 for i, c in enumerate(CHARS)}})


def permuted_tokenizer() -> PreTrainedTokenizerFast:
    """Another id order of the same 96 tokens: the characters reversed, ``"<s>"`` last."""
    return _char_level({**{c: i for i, c in enumerate(reversed(CHARS))}, "<s>": len(CHARS)})


def merged_tokenizer() -> PreTrainedTokenizerFast:
    """A drafter's with another vocabulary: the characters reversed, ``"<s>"``, then 2-character merges (BPE)."""
    vocab = {**{c: i for i, c in enumerate(reversed(CHARS))}, "<s>": len(CHARS)}
    for a, b in MERGES:
        vocab[a + b] = len(vocab)
    raw = Tokenizer(models.BPE(vocab, MERGES))
    raw.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>")


def hello_tokenizer(*, space_marker: bool = False) -> PreTrainedTokenizerFast:
    """A BPE target whose ``"hel"`` + ``"lo"`` merge into ``"hello"``; with `space_marker`, SentencePiece-like (every
    encoding starts with ``"▁"``)."""
    vocab = {c: i for i, c in enumerate("abcdehilorsty ▁")}
    merges = [("h", "e"), ("he", "l"), ("hel", "l"), ("hell", "o")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    raw = Tokenizer(models.BPE(vocab, merges))
    if space_marker:
        raw.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=False)
        raw.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=False)
    else:
        raw.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=raw)


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level (GPT-2 style, no merges): a non-ASCII character is several tokens."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    raw = Tokenizer(models.BPE({c: i for i, c in enumerate(alphabet)}, []))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=raw)


class TableTokenizer:
    """A tokenizer that is a table (encode) and concatenation (decode): for a rule no real tokenizer here triggers."""

    def __init__(self, pieces: list[str], table: dict[str, list[int]]) -> None:
        self.pieces, self.table = pieces, table

    def encode(self, text, add_special_tokens=False):
        return self.table[text]

    def decode(self, ids, skip_special_tokens=False, clean_up_tokenization_spaces=False):
        return "".join(self.pieces[i] for i in ids)


# ---------------------------------------------------------------------------------------------------------------------
# drafters
# ---------------------------------------------------------------------------------------------------------------------
def merged_drafter(seed: int = 6, name: str = "other_tok") -> TokenizerBridgeDrafter:
    """A random 1-layer drafter with the merged tokenizer (it disagrees with the target: losslessness, not speed)."""
    tokenizer = merged_tokenizer()
    model = sharpen(tiny_llama(seed, layers=1, vocab=len(tokenizer)))
    return TokenizerBridgeDrafter(model, tokenizer, target_tokenizer=char_tokenizer(), name=name)


def other_tokenizer_pool(target) -> list[TokenizerBridgeDrafter]:
    """The `FACTORIES` entry of tests/test_drafters.py: the target is a tiny Llama without a tokenizer."""
    return [merged_drafter()]


def permuted_copy(target, name: str = "copy") -> TokenizerBridgeDrafter:
    """The target itself in the permuted vocabulary: it agrees with the target by construction."""
    tokenizer, target_tokenizer = permuted_tokenizer(), char_tokenizer()
    theirs = target_tokenizer.get_vocab()
    order = torch.tensor([theirs[tok] for tok, _ in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])])
    model = tiny_llama(0)
    model.load_state_dict(target.state_dict())
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight[order])
        model.lm_head.weight.copy_(target.lm_head.weight[order])
    return TokenizerBridgeDrafter(model, tokenizer, target_tokenizer=target_tokenizer, name=name)


@pytest.fixture(scope="module")
def references(target):
    return [greedy(target, p, MAX_NEW) for p in PROMPTS]


pytestmark = pytest.mark.usefixtures("no_network")


def test_the_kind_is_registered_and_exported():
    assert DRAFTER_KINDS["other_tokenizer"] is TokenizerBridgeDrafter is hf_metasd.TokenizerBridgeDrafter
    assert TokenizerBridgeDrafter.returns_logits is False


# ---------------------------------------------------------------------------------------------------------------------
# re-tokenisation rules
# ---------------------------------------------------------------------------------------------------------------------
def test_the_test_tokenizers_round_trip_and_differ():
    target, drafter = char_tokenizer(), merged_tokenizer()
    text = "the thin one and another, then!"
    for tok in (target, drafter, permuted_tokenizer()):
        assert tok.decode(tok.encode(text)) == text
    assert len(target) == VOCAB and len(drafter) == VOCAB + len(MERGES)
    assert len(drafter.encode(text)) < len(target.encode(text))  # the merges make it coarser
    assert tokenizer_fingerprint(target) != tokenizer_fingerprint(permuted_tokenizer())


def test_a_continuation_on_a_token_boundary_is_exact():
    tok = char_tokenizer()
    context = tok.encode("Hello")
    assert continuation_ids(tok, context, " world", complete=True) == Continuation(tok.encode(" world"), "exact")
    # not complete: the last token may be an incomplete word and is dropped
    assert continuation_ids(tok, context, " world") == Continuation(tok.encode(" worl"), "exact")


def test_a_continuation_that_resegments_the_last_token_is_bridged():
    tok = hello_tokenizer()
    context = tok.encode("a hel")
    assert tok.convert_ids_to_tokens(context)[-1] == "hel"
    assert tok.convert_ids_to_tokens(tok.encode("a hello there")) == ["a", " ", "hello", " ", "t", "he", "r", "e"]
    ids, rule = continuation_ids(tok, context, "lo there", complete=True)
    # the target holds "hel" and cannot produce "hello": "lo" is bridged on its own, then the canonical rest
    assert rule == "bridged" and tok.convert_ids_to_tokens(ids) == ["l", "o", " ", "t", "he", "r", "e"]
    assert tok.decode(context + ids) == "a hello there"


def test_a_bridge_the_tokenizer_spells_otherwise_abstains():
    tok = hello_tokenizer(space_marker=True)  # encoding "lo" alone gives "▁lo": it would read " lo"
    context = tok.encode("say hel")
    assert tok.convert_ids_to_tokens(tok.encode("lo")) == ["▁", "l", "o"]
    assert continuation_ids(tok, context, "lo there", complete=True) == Continuation([], "none")


def test_a_window_that_starts_mid_word_still_maps_exactly():
    tok = hello_tokenizer(space_marker=True)
    context = tok.encode("this is a story")
    # the last 3 tokens start mid-word ("o r y"): re-encoded alone they gain a "▁", yet only the ends are compared
    assert tok.encode(tok.decode(context[-3:]))[0] != context[-3]
    ids, rule = continuation_ids(tok, context, " hello there", lookbehind=3, complete=True)
    assert rule == "exact" and tok.decode(context + ids) == "this is a story hello there"
    assert ids == tok.encode("this is a story hello there")[len(context) :]


def test_an_inner_resegmentation_with_a_boundary_at_the_end_continues_exactly():
    # "ab" alone is a + b, "abc" is ab + c: the context's tokens change, but a boundary stays at its end
    tok = TableTokenizer(["a", "b", "c", "ab"], {"ab": [0, 1], "abc": [3, 2], "c": [2]})
    assert continuation_ids(tok, [0, 1], "c", complete=True) == Continuation([2], "exact")


def test_incomplete_characters_are_never_proposed():
    tok = byte_tokenizer()
    cafe = tok.encode("café!")
    assert len(cafe) == 6  # "é" is two byte tokens
    ids, rule = continuation_ids(tok, tok.encode("caf"), "é!", complete=True)
    assert rule == "exact" and ids == cafe[3:]
    # the target stopped inside "é": nothing maps until it completes the character
    assert continuation_ids(tok, cafe[:4], "!", complete=True) == Continuation([], "none")
    # a draft that ends inside a character (U+FFFD) is cut before it
    assert continuation_ids(tok, tok.encode("caf"), "\ufffd", complete=True) == Continuation([], "none")
    assert continuation_ids(tok, tok.encode("ca"), "f\ufffd", complete=True) == Continuation(tok.encode("f"), "exact")
    assert continuation_ids(tok, tok.encode("ca"), "") == Continuation([], "none")


def test_special_tokens_of_the_context_are_re_read_as_themselves():
    tok = char_tokenizer()
    context = [0, *tok.encode("ab")]  # "<s>ab"
    assert continuation_ids(tok, context, "cd", complete=True) == Continuation(tok.encode("cd"), "exact")


def test_leading_special_ids_and_draft_steps():
    assert leading_special_ids(char_tokenizer()) == []
    raw = Tokenizer(models.WordLevel({"<s>": 0, "</s>": 1, "a": 2}, unk_token="<s>"))
    raw.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    assert leading_special_ids(PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="</s>")) == []  # EOS after
    assert draft_steps(3, 0, 10) == 1 and draft_steps(1, 10, 0) == 8  # at least one, at most 4 per token asked
    assert draft_steps(4, 60, 100) == 3  # ceil(5 * 0.6)


# ---------------------------------------------------------------------------------------------------------------------
# the drafter
# ---------------------------------------------------------------------------------------------------------------------
def _ids(tokenizer, text: str) -> torch.Tensor:
    return torch.tensor([tokenizer.encode(text)])


def test_catch_up_crops_the_cache_where_the_own_ids_re_segment():
    drafter = merged_drafter().spawn()
    target_tok = drafter.target_tokenizer
    drafter.catch_up(_ids(target_tok, "say t"))
    assert drafter._own[0].tolist() == drafter.tokenizer.encode("say t")
    # one more target character re-segments the drafter's last token: "t" becomes "th"
    longer = _ids(target_tok, "say th")
    assert drafter.tokenizer.convert_ids_to_tokens(drafter.tokenizer.encode("say th"))[-1] == "th"
    drafter.catch_up(longer)
    assert drafter.last_catch_up_tokens == 1  # "t" dropped from the cache, "th" ingested
    assert drafter._inner._cache.get_seq_length() == len(drafter.tokenizer.encode("say th"))
    fresh = merged_drafter().spawn()
    assert torch.equal(drafter.draft(longer, 4)[0], fresh.draft(longer, 4)[0])


def test_a_drafter_that_agrees_by_construction_is_accepted(target, references):
    drafter = permuted_copy(target)
    drafted = accepted = 0
    for prompt, reference in zip(PROMPTS, references):
        out = metasd_greedy(target, prompt, MAX_NEW, assistant_models=[drafter], return_dict_in_generate=True)
        assert torch.equal(out.sequences, reference)
        drafted += sum(out.metasd.drafted)
        accepted += sum(out.metasd.accepted)
    assert drafted > 0 and accepted >= 0.8 * drafted


def test_the_drafter_proposes_at_most_num_tokens_or_abstains(target):
    drafter = permuted_copy(target).spawn(target)
    ids = _ids(drafter.target_tokenizer, "the cat sat on the")
    assert drafter.draft(ids, 0)[0].shape == (1, 0)
    tokens, logits = drafter.draft(ids, 2)
    assert tokens.shape == (1, 2) and logits is None and drafter.last_continuation.rule == "exact"
    # a context of special tokens only has no text: nothing to draft from
    tokens, _ = drafter.draft(torch.tensor([[0, 0]]), 3)
    assert tokens.shape == (1, 0) and drafter.last_continuation == Continuation([], "none")


def test_a_drafted_end_token_keeps_the_last_candidate_and_processors_cut(target, monkeypatch):
    drafter = merged_drafter().spawn(target)
    own, target_tok = drafter.tokenizer, drafter.target_tokenizer
    ids = _ids(target_tok, "say")
    drafter.catch_up(ids)
    drafted = [*own.encode(" then"), own.bos_token_id, *own.encode("xx")]
    monkeypatch.setattr(drafter._inner, "draft", lambda own_ids, n, **kw: (torch.tensor([drafted]), None))
    tokens, _ = drafter.draft(ids, 8)
    assert tokens[0].tolist() == target_tok.encode(" then")  # complete: nothing dropped, nothing after "<s>"
    assert drafter.draft(ids, 3)[0][0].tolist() == target_tok.encode(" th")  # at most num_tokens
    processors = LogitsProcessorList([SuppressTokensLogitsProcessor(target_tok.encode("h"))])
    assert drafter.draft(ids, 8, logits_processor=processors)[0][0].tolist() == target_tok.encode(" t")


def test_per_call_copies_have_their_own_state():
    shared = merged_drafter()
    a, b = shared.spawn(), shared.spawn()
    a.catch_up(PROMPTS[0])
    assert a._inner is not shared._inner and a._inner._cache is not None
    assert b._inner._cache is None and shared._inner._cache is None and b._context is None
    assert a.model is b.model is shared.model  # one set of weights


# ---------------------------------------------------------------------------------------------------------------------
# pools mixing tokenizers
# ---------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mixed(target):
    """Two other-tokenizer arms (one random with merges, one agreeing), a same-tokenizer model, prompt lookup."""
    return [
        merged_drafter(),
        permuted_copy(target),
        ModelDrafter(sharpen(tiny_llama(2, layers=1)), name="small"),
        PromptLookupDrafter(),
    ]


@pytest.mark.parametrize("policy", sorted(POLICY_REGISTRY))
def test_a_pool_mixing_tokenizers_is_lossless_under_every_policy(target, references, mixed, policy):
    calls = lossless_under(target, PROMPTS, references, mixed, policy, MAX_NEW, arm=0, what="a pool mixing tokenizers")
    asked = {a for stats in calls for a, d in zip(stats.arms, stats.drafted) if d > 0}
    assert calls[-1].drafter_names == ["other_tok", "copy", "small", "prompt_lookup", "no_draft"]
    assert asked & {0, 1}, f"{policy} never let an other-tokenizer arm draft"


def test_round_robin_lets_both_other_tokenizer_arms_draft_and_the_agreeing_one_is_accepted(target, references, mixed):
    accepted = {0: 0, 1: 0}
    drafted = {0: 0, 1: 0}
    for prompt, reference in zip(PROMPTS, references):
        out = metasd_greedy(
            target, prompt, MAX_NEW, assistant_models=mixed, meta_policy="round_robin", return_dict_in_generate=True
        )
        assert torch.equal(out.sequences, reference)
        for arm, d, a in zip(out.metasd.arms, out.metasd.drafted, out.metasd.accepted):
            if arm in drafted:
                drafted[arm] += d
                accepted[arm] += a
    assert drafted[0] > 0 and drafted[1] > 0 and accepted[1] > 0


@pytest.mark.parametrize("seed", range(4))
def test_sampling_smoke(target, mixed, seed):
    torch.manual_seed(seed)
    prompt = PROMPTS[seed % len(PROMPTS)]
    out = target.generate(
        prompt,
        do_sample=True,
        top_k=20,
        max_new_tokens=MAX_NEW,
        custom_generate=hf_metasd.generate,
        assistant_models=mixed,
        meta_policy="round_robin",
        return_dict_in_generate=True,
    )
    assert out.sequences.shape == (1, prompt.shape[1] + MAX_NEW)
    assert torch.equal(out.sequences[:, : prompt.shape[1]], prompt) and int(out.sequences.max()) < VOCAB
    stats = out.metasd
    assert {a for a, d in zip(stats.arms, stats.drafted) if d > 0} >= {0, 1}


# ---------------------------------------------------------------------------------------------------------------------
# pool round trip
# ---------------------------------------------------------------------------------------------------------------------
def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


@pytest.fixture
def referenced(tmp_path):
    """A pool whose other-tokenizer drafter references its model folder (the default save)."""
    tokenizer = merged_tokenizer()
    sharpen(tiny_llama(7, layers=1, vocab=len(tokenizer))).save_pretrained(tmp_path / "drafter")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "drafter")
    drafter = TokenizerBridgeDrafter(model, tokenizer, target_tokenizer=char_tokenizer(), name="other")
    return drafter, tmp_path


def test_a_pool_references_the_model_and_carries_the_drafters_tokenizer(target, references, referenced):
    drafter, tmp_path = referenced
    DrafterPool([drafter, PromptLookupDrafter()], target=target).save_pretrained(tmp_path / "pool")
    assert _files(tmp_path / "pool") == [
        "README.md",
        "config.json",
        "drafters/other/tokenizer/tokenizer.json",
        "drafters/other/tokenizer/tokenizer_config.json",
    ]
    spec = json.loads((tmp_path / "pool/config.json").read_text())["drafters"][0]
    assert (spec["kind"], spec["path"], spec["stored"]) == ("other_tokenizer", str(tmp_path / "drafter"), False)
    assert spec["params"] == {
        "dtype": "float32",
        "lookbehind": 10,
        "target_tokenizer": None,
        "target_tokenizer_hash": tokenizer_fingerprint(char_tokenizer()),
        "tokenizer": "drafters/other/tokenizer",
    }
    with pytest.raises(
        DrafterCompatibilityError,
        match=r"drafter 'other' \(drafters\[0\]\) needs `tokenizer=` \(the target's tokenizer\) to load: it drafts "
        r"with its own tokenizer .* Pass `DrafterPool\.from_pretrained\(\.\.\., tokenizer=target_tokenizer\)`\.",
    ):
        DrafterPool.from_pretrained(tmp_path / "pool", target=target)
    with pytest.raises(
        DrafterCompatibilityError,
        match=rf"drafter 'other' \(drafters\[0\]\) must be loaded with the target's tokenizer it was saved for "
        rf"\(fingerprint {tokenizer_fingerprint(char_tokenizer())}\), but `tokenizer=` has fingerprint "
        rf"{tokenizer_fingerprint(permuted_tokenizer())}\. Pass the target's own tokenizer",
    ):
        DrafterPool.from_pretrained(tmp_path / "pool", target=target, tokenizer=permuted_tokenizer())
    # the fix: the target's tokenizer (an equal copy)
    outside = {str(tmp_path / "drafter"): tmp_path / "drafter"}  # the caller allows the local reference
    loaded = DrafterPool.from_pretrained(
        tmp_path / "pool", target=target, tokenizer=char_tokenizer(), local_paths=outside
    )
    mine = loaded.drafters[0]
    assert type(mine) is TokenizerBridgeDrafter and mine.source["path"] == str(tmp_path / "drafter")
    assert mine.tokenizer.get_vocab() == drafter.tokenizer.get_vocab()
    ids = torch.cat([PROMPTS[0], references[0][:, PROMPTS[0].shape[1] :]], dim=1)
    assert torch.equal(mine.spawn().draft(ids, 4)[0], drafter.spawn().draft(ids, 4)[0])
    assert torch.equal(metasd_greedy(target, PROMPTS[0], MAX_NEW, assistant_models=loaded), references[0])
    loaded.save_pretrained(tmp_path / "again")  # a reference stays a reference
    assert (tmp_path / "pool/config.json").read_text() == (tmp_path / "again/config.json").read_text()


def test_a_stored_pool_carries_the_targets_tokenizer_once(target, references, tmp_path):
    pool = DrafterPool([merged_drafter(name="a"), permuted_copy(target, name="b")], target=target)
    pool.save_pretrained(tmp_path, store_weights=True)
    files = _files(tmp_path)
    assert [f for f in files if f.startswith("tokenizers/")] == [
        "tokenizers/target/tokenizer.json",
        "tokenizers/target/tokenizer_config.json",
    ]
    assert {"drafters/a/model.safetensors", "drafters/b/tokenizer/tokenizer.json"} <= set(files)
    loaded = DrafterPool.from_pretrained(tmp_path, target=target)  # no `tokenizer=` needed: it is stored
    a, b = loaded.drafters
    assert a.target_tokenizer is b.target_tokenizer  # read once
    assert tokenizer_fingerprint(a.target_tokenizer) == tokenizer_fingerprint(char_tokenizer())
    for prompt, reference in zip(PROMPTS[:2], references):
        assert torch.equal(metasd_greedy(target, prompt, MAX_NEW, assistant_models=loaded), reference)
    given = char_tokenizer()
    assert DrafterPool.from_pretrained(tmp_path, target=target, tokenizer=given).drafters[0].target_tokenizer is given


def test_a_missing_tokenizer_folder_names_the_drafter_and_the_fix(target, tmp_path):
    DrafterPool([merged_drafter(name="x")], target=target).save_pretrained(tmp_path / "pool", store_weights=True)
    folder = tmp_path / "pool/drafters/x/tokenizer"
    shutil.move(folder, tmp_path / "saved")
    with pytest.raises(
        InvalidPoolError,
        match=r"drafter 'x' \(drafters\[0\]\) must find its tokenizer in the pool folder at "
        r"'drafters/x/tokenizer', but it is missing\. Restore the folder",
    ):
        DrafterPool.from_pretrained(tmp_path / "pool", target=target)
    shutil.move(tmp_path / "saved", folder)  # the fix: restore it
    assert len(DrafterPool.from_pretrained(tmp_path / "pool", target=target)) == 1


@pytest.mark.parametrize(
    ("params", "match"),
    [
        (
            {},
            r"drafter 'x' \(drafters\[0\]\) must have `params\.tokenizer` \(the drafter's tokenizer folder inside the "
            r"pool\), but has None\. Re-save the pool",
        ),
        ({"tokenizer": "../elsewhere"}, r"`params\.tokenizer` must be a relative path inside the pool folder"),
        ({"tokenizer": "t", "target_tokenizer": "/abs"}, r"`params\.target_tokenizer` must be a relative path"),
    ],
)
def test_an_entry_is_validated_before_anything_is_read(params, match):
    from hf_metasd.pool import DrafterSpec

    config = DrafterPoolConfig([DrafterSpec("other_tokenizer", "x", path="drafters/x", stored=True, params=params)])
    with pytest.raises(InvalidPoolError, match=match):
        config.validate()
    DrafterPoolConfig([DrafterSpec("other_tokenizer", "x", path="m", params={"tokenizer": "t"})]).validate()  # fixed


# ---------------------------------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------------------------------
def test_construction_errors_name_the_fix():
    tokenizer = merged_tokenizer()
    model = tiny_llama(1, layers=1, vocab=len(tokenizer))
    with pytest.raises(TypeError, match=r"`tokenizer` must be a transformers tokenizer .* but is str\. Pass e\.g\."):
        TokenizerBridgeDrafter(model, "gpt2")
    with pytest.raises(TypeError, match=r"`target_tokenizer` must be a transformers tokenizer .* but is int"):
        TokenizerBridgeDrafter(model, tokenizer, target_tokenizer=3)
    with pytest.raises(ValueError, match=r"`lookbehind` must be an int >= 1 .* but is 0\. Use e\.g\. 10\."):
        TokenizerBridgeDrafter(model, tokenizer, lookbehind=0)
    with pytest.raises(TypeError, match=r"`lookbehind` must be an int >= 1 .* but is '10'\. Use e\.g\. 10\."):
        TokenizerBridgeDrafter(model, tokenizer, lookbehind="10")
    with pytest.raises(
        DrafterCompatibilityError,
        match=r"drafter 'small' must have a `tokenizer` whose ids fit its model's vocabulary size 96, but the "
        r"tokenizer has 101 tokens\. Pass the drafter model's own tokenizer\.",
    ):
        TokenizerBridgeDrafter(tiny_llama(1, layers=1), tokenizer, name="small")
    assert TokenizerBridgeDrafter(model, tokenizer, lookbehind=10).lookbehind == 10  # the fixes


def test_a_drafter_without_the_targets_tokenizer_is_refused_before_any_compute(target, references):
    tokenizer = merged_tokenizer()
    model = sharpen(tiny_llama(1, layers=1, vocab=len(tokenizer)))
    drafter = TokenizerBridgeDrafter(model, tokenizer, name="d")
    match = (
        r"drafter 'd' must have the target's tokenizer to map its drafts into the target's vocabulary, but was "
        r"built without one \(`target_tokenizer=None`\)\. Pass `TokenizerBridgeDrafter\(model, tokenizer, "
        r"target_tokenizer=target_tokenizer\)`"
    )
    with pytest.raises(DrafterCompatibilityError, match=match):
        drafter.check_compatible(target)
    assert drafter._context is None and drafter._inner._cache is None  # no side effect
    with pytest.raises(DrafterCompatibilityError, match=match):
        metasd_greedy(target, PROMPTS[0], MAX_NEW, assistant_models=[drafter])
    with pytest.raises(DrafterCompatibilityError, match=match):
        drafter.catch_up(PROMPTS[0])
    fixed = TokenizerBridgeDrafter(model, tokenizer, target_tokenizer=char_tokenizer(), name="d")
    assert torch.equal(metasd_greedy(target, PROMPTS[0], MAX_NEW, assistant_models=[fixed]), references[0])


def test_a_target_tokenizer_wider_than_the_target_is_refused(target):
    drafter = TokenizerBridgeDrafter(
        tiny_llama(1, layers=1), permuted_tokenizer(), target_tokenizer=merged_tokenizer(), name="d"
    )
    with pytest.raises(
        DrafterCompatibilityError,
        match=r"drafter 'd' must have a `target_tokenizer` whose ids fit the target's vocabulary size 96, but it has "
        r"101 tokens\. Pass the target's own tokenizer\.",
    ):
        drafter.check_compatible(target)
    drafter.target_tokenizer = char_tokenizer()  # the fix
    drafter.check_compatible(target)


def _split_tokenizer(pattern: str) -> PreTrainedTokenizerFast:
    """The permuted vocabulary, pre-tokenized by `pattern` (a regular expression of tokenizers' Oniguruma)."""
    raw = Tokenizer(models.WordLevel({**{c: i for i, c in enumerate(reversed(CHARS))}, "<s>": len(CHARS)}, "<s>"))
    raw.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), "isolated")
    raw.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>")


PANICKED = (
    r"drafter 'd' must have tokenizers that read every text, but one panicked {doing} \(PanicException: Onig: "
    r"Regex search error: retry-limit-in-match over\)\. Use tokenizers whose regular expressions \(pre-tokenizer, "
    r"normalizer\) match in linear time, or take this drafter out of the pool\."
)


@pytest.mark.parametrize("entry", ["custom_generate", "enable"])
def test_a_tokenizer_that_panics_is_named_before_any_forward_pass_of_the_target(target, references, entry):
    """A pattern that backtracks without end makes tokenizers panic (pyo3's PanicException, a BaseException that
    ``except Exception`` lets through): built in-process (no pool load checks its patterns), the drafter turns it
    into a DrafterCompatibilityError, at construction where a short text already panics, else where a prompt
    does, before the target's first forward pass."""
    model = tiny_llama(1, layers=1)
    short = re.escape("reading a short text")
    exponential = r"(\S|\s|.)*\p{Sm}"  # no math symbol in a short text: exponential, then a panic
    with pytest.raises(DrafterCompatibilityError, match=PANICKED.format(doing=short)):
        TokenizerBridgeDrafter(model, _split_tokenizer(exponential), target_tokenizer=char_tokenizer(), name="d")
    drafter = TokenizerBridgeDrafter(
        model, permuted_tokenizer(), target_tokenizer=_split_tokenizer(exponential), name="d"
    )
    with pytest.raises(DrafterCompatibilityError, match=PANICKED.format(doing=short)):
        drafter.check_compatible(target)
    # `(a+)+b` reads a short text, and panics on 34 a's
    drafter = TokenizerBridgeDrafter(model, _split_tokenizer("(a+)+b"), target_tokenizer=char_tokenizer(), name="d")
    prompt = torch.tensor([char_tokenizer().encode("a" * 40)])
    passes = []
    handle = target.register_forward_pre_hook(lambda *args: passes.append(1))
    try:
        with pytest.raises(
            DrafterCompatibilityError, match=PANICKED.format(doing=r"re-reading the 40 tokens of the sequence")
        ):
            if entry == "enable":
                hf_metasd.enable()
                target.generate(prompt, do_sample=False, max_new_tokens=5, assistant_models=[drafter])
            else:
                metasd_greedy(target, prompt, 5, assistant_models=[drafter])
    finally:
        handle.remove()
    assert passes == []
    # the fix: a tokenizer whose pattern matches in linear time
    drafter = TokenizerBridgeDrafter(model, _split_tokenizer("."), target_tokenizer=char_tokenizer(), name="d")
    assert torch.equal(metasd_greedy(target, prompt, 5, assistant_models=[drafter]), greedy(target, prompt, 5))
