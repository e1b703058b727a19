"""Drafter kinds: the lossless contract over every registered kind and a mixed pool, then each kind's own behaviour."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from conftest import VOCAB, greedy, lossless_under, metasd_greedy, prompts, sharpen, tiny_llama
from peft import LoraConfig, get_peft_model
from test_feature_head_adapters import adapter_arms
from test_other_tokenizer import other_tokenizer_pool
from transformers import GPT2Config, GPT2LMHeadModel, LogitsProcessorList, SuppressTokensLogitsProcessor
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

import hf_metasd
from hf_metasd.drafters import (
    DRAFTER_KINDS,
    CorpusDrafter,
    DrafterSpec,
    EarlyExitDrafter,
    LoraDrafter,
    ModelDrafter,
    PromptLookupDrafter,
    TokenRecyclingDrafter,
    as_drafters,
    prompt_lookup_candidates,
    register_drafter_kind,
    registry,
)
from hf_metasd.errors import DrafterCompatibilityError, DuplicateDrafterKindError
from hf_metasd.policies import POLICY_REGISTRY

MAX_NEW = 24
PROMPTS = prompts(10)
LORA = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)


def _peft_model(seed: int = 1, adapters: tuple[str, ...] = ("code", "math")):
    """A 1-layer base with distinct random adapters (init_lora_weights=False: they change the output)."""
    torch.manual_seed(seed)
    peft_model = get_peft_model(sharpen(tiny_llama(seed, layers=1)), LORA, adapter_name=adapters[0])
    for name in adapters[1:]:
        peft_model.add_adapter(name, LORA)
    return peft_model.eval()


#: kind -> pool of that kind for the session target. A newly registered kind fails `test_every_kind_is_covered`.
FACTORIES = {
    "assistant_model": lambda target: [ModelDrafter(sharpen(tiny_llama(2, layers=1)), name="small")],
    "lora": lambda target: LoraDrafter.from_peft_model(_peft_model()),
    "prompt_lookup": lambda target: [PromptLookupDrafter()],
    "early_exit": lambda target: [EarlyExitDrafter(target, num_layers=1)],
    # an EAGLE-3-style head trained for ~1 s on the target's own answers (cached per target), and two task adapters
    # on it: three arms on one resident head
    "feature_head": adapter_arms,
    # a corpus of the target's own answers to other prompts: it matches and drafts
    "corpus": lambda target: [
        CorpusDrafter.from_sequences(
            [greedy(target, p, MAX_NEW)[0, p.shape[1] :].tolist() for p in prompts(6, seed=7)]
        )
    ],
    # a drafter with its own tokenizer (other ids, 2-character merges); the tokenizers are built in memory
    "other_tokenizer": other_tokenizer_pool,
    # a table of the target's own next tokens, warmed on its answers to other prompts: it drafts from the start
    "token_recycling": lambda target: [_warm_recycling(target)],
}


def _warm_recycling(target) -> TokenRecyclingDrafter:
    drafter = TokenRecyclingDrafter()
    drafter.warm_start(target, [greedy(target, p, MAX_NEW)[0].tolist() for p in prompts(6, seed=7)])
    return drafter


@pytest.fixture(scope="module")
def references(target):
    return [greedy(target, p, MAX_NEW) for p in PROMPTS]


def test_every_kind_is_covered():
    assert sorted(FACTORIES) == sorted(DRAFTER_KINDS)


# ---------------------------------------------------------------------------------------------------------------------
# the registry of kinds, and the layering: drafters own their pool entry, the pool builds on them
# ---------------------------------------------------------------------------------------------------------------------
def test_every_built_in_kind_is_registered_once_under_its_own_name():
    assert all(cls.kind == kind for kind, cls in DRAFTER_KINDS.items())
    assert len(set(DRAFTER_KINDS.values())) == len(DRAFTER_KINDS)


def test_a_kind_name_is_refused_when_another_class_holds_it(monkeypatch):
    monkeypatch.setattr(registry, "DRAFTER_KINDS", dict(DRAFTER_KINDS))  # what this test registers does not stay

    class MyLookup(PromptLookupDrafter):
        kind = "prompt_lookup"

    with pytest.raises(
        DuplicateDrafterKindError,
        match=r"`kind` must be a name not yet registered, but 'prompt_lookup' is registered by "
        r"hf_metasd\.drafters\.prompt_lookup\.PromptLookupDrafter\. Give `MyLookup\.kind` another name\.",
    ):
        register_drafter_kind(MyLookup)
    assert issubclass(DuplicateDrafterKindError, ValueError)
    assert registry.DRAFTER_KINDS["prompt_lookup"] is PromptLookupDrafter  # the first registration stands
    MyLookup.kind = "my_lookup"  # the fix the message suggests works
    assert register_drafter_kind(MyLookup) is MyLookup and registry.DRAFTER_KINDS["my_lookup"] is MyLookup
    assert register_drafter_kind(PromptLookupDrafter) is PromptLookupDrafter  # the same class again changes nothing
    with pytest.raises(TypeError, match=r"`cls` must be a subclass of `Drafter`, but is <class 'int'>\."):
        register_drafter_kind(int)


def test_no_drafter_module_imports_the_pool():
    """`pool/` depends on `drafters/`, never the reverse: every drafter module's imports, delayed ones included."""
    folder = Path(hf_metasd.drafters.__file__).parent
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            assert not any(n.startswith(("..pool", "hf_metasd.pool")) for n in names), (path.name, names)


def test_the_pool_entry_is_the_drafters_own_and_importable_where_it_was():
    assert hf_metasd.DrafterSpec is hf_metasd.pool.DrafterSpec is hf_metasd.drafters.DrafterSpec
    assert hf_metasd.pool.config.DrafterSpec is DrafterSpec


# ---------------------------------------------------------------------------------------------------------------------
# the contract: greedy output is the target's own, for every kind and for a mixed pool under every policy
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(DRAFTER_KINDS))
def test_every_kind_is_lossless(target, references, kind):
    pool = FACTORIES[kind](target)
    accepted = 0
    for prompt, reference in zip(PROMPTS, references):
        out = metasd_greedy(target, prompt, MAX_NEW, assistant_models=pool, return_dict_in_generate=True)
        assert torch.equal(out.sequences, reference), f"{kind} changed the greedy output"
        assert out.metasd.drafter_names == [d.name for d in pool] + ["no_draft"]
        accepted += sum(out.metasd.accepted)
    if kind in ("prompt_lookup", "early_exit", "token_recycling"):
        assert accepted > 0  # the drafter really drafted something the target kept


@pytest.fixture(scope="module")
def mixed_pool(target):
    """Every kind at once, plus a plain transformers model and a peft model given as is."""
    return [
        _peft_model(seed=3, adapters=("qa", "rag")),
        PromptLookupDrafter(max_matching_ngram_size=3),
        EarlyExitDrafter(target, num_layers=1),
        sharpen(tiny_llama(4, layers=1)),
        *LoraDrafter.from_peft_model(_peft_model(seed=5, adapters=("sum",))),
    ]


@pytest.mark.parametrize("policy", sorted(POLICY_REGISTRY))
def test_mixed_pool_is_lossless_under_every_policy(target, references, mixed_pool, policy):
    stats = lossless_under(target, PROMPTS, references, mixed_pool, policy, MAX_NEW, arm=2, what="a mixed pool")
    names = ["qa", "rag", "prompt_lookup", "early_exit_1", "LlamaForCausalLM", "sum", "no_draft"]
    assert stats[-1].drafter_names == names


def test_mixed_pool_is_lossless_with_logits_processors(target, mixed_pool):
    kwargs = {"repetition_penalty": 1.3, "no_repeat_ngram_size": 3}
    for prompt in PROMPTS[:4]:
        out = metasd_greedy(target, prompt, MAX_NEW, assistant_models=mixed_pool, meta_policy="round_robin", **kwargs)
        assert torch.equal(out, greedy(target, prompt, MAX_NEW, **kwargs))


@pytest.mark.parametrize("seed", range(6))
def test_sampling_smoke_over_every_kind(target, mixed_pool, seed):
    torch.manual_seed(seed)
    prompt = PROMPTS[0]
    out = target.generate(
        prompt,
        do_sample=True,
        top_k=20,
        max_new_tokens=MAX_NEW,
        custom_generate=hf_metasd.generate,
        assistant_models=mixed_pool,
        meta_policy="round_robin",
        return_dict_in_generate=True,
    )
    assert out.sequences.shape == (1, prompt.shape[1] + MAX_NEW)
    assert torch.equal(out.sequences[:, : prompt.shape[1]], prompt)
    assert int(out.sequences.max()) < VOCAB
    # round robin asked every arm; each drafted, or abstained (prompt lookup finds no n-gram in some sampled texts)
    stats = out.metasd
    asked = set(stats.arms) | {arm for round_ in stats.abstained for arm in round_}
    assert asked >= set(range(6))
    assert {a for a, d in zip(stats.arms, stats.drafted) if d > 0} >= {0, 1, 3, 4, 5}  # the model-backed arms


# ---------------------------------------------------------------------------------------------------------------------
# prompt lookup
# ---------------------------------------------------------------------------------------------------------------------
def test_prompt_lookup_matches_the_earliest_occurrence_of_the_longest_ngram():
    seq = torch.tensor([[9, 1, 2, 3, 4, 2, 3, 7, 8, 1, 2, 3]])
    # the 3-gram "1 2 3" occurs first at 1..3 -> continue after it: 4 2 3
    assert prompt_lookup_candidates(seq, 3, max_matching_ngram_size=3).tolist() == [4, 2, 3]
    # only 2-grams: "2 3" occurs at 2..3 and 5..6, the first wins -> 4 2 3 7 (capped at 4 tokens)
    assert prompt_lookup_candidates(seq, 4, max_matching_ngram_size=2).tolist() == [4, 2, 3, 7]
    # 1-gram "3": first at 3 -> 4 2
    assert prompt_lookup_candidates(seq, 2, max_matching_ngram_size=1).tolist() == [4, 2]


def test_prompt_lookup_falls_back_to_shorter_ngrams_and_stops_at_the_sequence_end():
    seq = torch.tensor([5, 6, 1, 2, 6])  # "2 6" never occurred before; "6" did, at 1
    assert prompt_lookup_candidates(seq, 10, max_matching_ngram_size=2).tolist() == [1, 2, 6]
    assert prompt_lookup_candidates(torch.tensor([1, 2, 3, 4]), 5).tolist() == []
    assert prompt_lookup_candidates(torch.tensor([7]), 5).tolist() == []


def test_prompt_lookup_agrees_with_transformers_on_random_sequences():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        seq = torch.randint(0, 6, (1, int(torch.randint(2, 30, (1,), generator=g))), generator=g)
        for ngram, n in ((1, 3), (2, 5), (3, 2)):
            reference = PromptLookupCandidateGenerator(
                num_output_tokens=n, max_matching_ngram_size=ngram, max_length=1000
            ).get_candidates(seq)[0][0, seq.shape[1] :]
            assert prompt_lookup_candidates(seq, n, ngram).tolist() == reference.tolist()


def test_prompt_lookup_drafter_returns_tokens_without_logits_or_nothing():
    drafter = PromptLookupDrafter(num_output_tokens=2)
    tokens, logits = drafter.draft(torch.tensor([[5, 6, 7, 8, 9, 5, 6]]), 4)
    assert tokens.tolist() == [[7, 8]] and logits is None  # num_output_tokens caps the round's 4
    tokens, logits = drafter.draft(torch.tensor([[1, 2, 3]]), 4)
    assert tokens.shape == (1, 0) and logits is None
    assert drafter.returns_logits is False and drafter.vocab_size is None
    assert drafter.config() == {"max_matching_ngram_size": 2, "num_output_tokens": 2}


def test_prompt_lookup_cuts_candidates_forbidden_by_the_logits_processors(target):
    drafter = PromptLookupDrafter().spawn(target)  # the call's copy knows the logits width, as in generate
    processors = LogitsProcessorList([SuppressTokensLogitsProcessor([8])])
    tokens, _ = drafter.draft(torch.tensor([[5, 6, 7, 8, 9, 5, 6]]), 4, logits_processor=processors)
    assert tokens.tolist() == [[7]]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_matching_ngram_size": 0}, r"`max_matching_ngram_size` must be an int >= 1, but is 0\. Use e\.g\. 2"),
        ({"num_output_tokens": -1}, r"`num_output_tokens` must be an int >= 1, but is -1\. Use e\.g\. 10"),
    ],
)
def test_prompt_lookup_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PromptLookupDrafter(**kwargs)
    fixed = dict.fromkeys(kwargs, 2)  # the fix the message suggests works
    assert PromptLookupDrafter(**fixed).draft(torch.tensor([[1, 2, 1]]), 2)[0].tolist() == [[2, 1]]


@pytest.mark.parametrize(
    "kwargs", [{"max_matching_ngram_size": "2"}, {"num_output_tokens": 2.0}, {"num_output_tokens": True}]
)
def test_prompt_lookup_settings_of_the_wrong_type_are_type_errors(kwargs):
    ((key, value),) = kwargs.items()
    with pytest.raises(TypeError, match=rf"`{key}` must be an int >= 1, but is {value!r}\. Use e\.g\. "):
        PromptLookupDrafter(**kwargs)


# ---------------------------------------------------------------------------------------------------------------------
# LoRA arms on one base
# ---------------------------------------------------------------------------------------------------------------------
def _manual_logits(peft_model, adapter, ids):
    peft_model.set_adapter(adapter)
    with torch.no_grad():
        return peft_model(input_ids=ids).logits[:, -1].float()


def test_lora_arms_share_the_base_and_switch_adapters_inside_the_round():
    peft_model = _peft_model()
    code, math = LoraDrafter.from_peft_model(peft_model)
    assert (code.name, math.name) == ("code", "math")
    assert code.model is math.model is peft_model.get_base_model()  # one resident base
    ids = PROMPTS[0]
    expected = {a: _manual_logits(peft_model, a, ids) for a in ("code", "math")}
    assert not torch.allclose(expected["code"], expected["math"])  # the adapters really differ
    # interleave the arms: each forward activates its own adapter first
    code_logits = code.catch_up(ids, return_logits=True)[:, -1]
    math_logits = math.catch_up(ids, return_logits=True)[:, -1]
    assert peft_model.active_adapter == "math"
    tokens, logits = code.draft(ids, 3)
    assert peft_model.active_adapter == "code"
    torch.testing.assert_close(code_logits, expected["code"])
    torch.testing.assert_close(math_logits, expected["math"])
    torch.testing.assert_close(logits[:, 0], expected["code"])


def test_lora_arms_keep_separate_caches():
    code, math = LoraDrafter.from_peft_model(_peft_model())
    ids = PROMPTS[1]
    code.catch_up(ids)
    code.draft(ids, 4)
    longer = torch.cat([ids, torch.tensor([[1, 2, 3]])], dim=-1)
    math.catch_up(longer)
    assert code._cache is not math._cache
    assert code._cache.get_seq_length() == ids.shape[1] + 3  # prompt + 3 of its 4 drafted tokens
    assert math._cache.get_seq_length() == longer.shape[1]
    # the code arm catches up from its own cache: only what it has not seen is ingested
    code.catch_up(longer)
    assert code.last_catch_up_tokens == 3


def test_lora_arms_share_one_restricted_head():
    head = torch.arange(0, VOCAB, 3)
    code, math = LoraDrafter.from_peft_model(_peft_model(), head_token_ids=head)
    assert code._head_weight.data_ptr() == math._head_weight.data_ptr()
    tokens, logits = math.draft(PROMPTS[0], 3)
    assert torch.isin(tokens, head).all() and torch.isinf(logits[0, 0, 1])


def test_peft_model_in_assistant_models_becomes_one_arm_per_adapter():
    arms = as_drafters([_peft_model(adapters=("chat", "code", "sum"))])
    assert [type(d) for d in arms] == [LoraDrafter] * 3 and [d.name for d in arms] == ["chat", "code", "sum"]


def test_lora_errors_name_the_fix():
    with pytest.raises(TypeError, match=r"`peft_model` must be a `peft.PeftModel`, but is LlamaForCausalLM\. Wrap"):
        LoraDrafter(tiny_llama(1, layers=1), "code")
    peft_model = _peft_model()
    with pytest.raises(
        DrafterCompatibilityError,
        match=r"`adapter_name` must be one of the peft model's adapters \['code', 'math'\], but is 'qa'\. Load it",
    ):
        LoraDrafter(peft_model, "qa")
    peft_model.add_adapter("qa", LORA)  # the fix
    assert LoraDrafter(peft_model, "qa").name == "qa"


# ---------------------------------------------------------------------------------------------------------------------
# early exit
# ---------------------------------------------------------------------------------------------------------------------
def test_early_exit_shares_every_weight_with_the_target(target):
    drafter = EarlyExitDrafter(target, num_layers=1)
    theirs = {p.data_ptr() for p in target.parameters()}
    mine = list(drafter.model.parameters())
    assert mine and all(p.data_ptr() in theirs for p in mine)
    assert drafter.model.model.layers[0].mlp.up_proj.weight is target.model.layers[0].mlp.up_proj.weight
    assert len(drafter.model.model.layers) == 1 and len(target.model.layers) == 2
    assert drafter.model.model.rotary_emb.inv_freq.data_ptr() == target.model.rotary_emb.inv_freq.data_ptr()
    assert drafter._new_cache().get_seq_length() == 0 and len(drafter._new_cache().layers) == 1


def test_early_exit_matches_a_manual_forward_through_the_first_layers(target):
    ids = PROMPTS[2]
    with torch.no_grad():
        hidden = target(input_ids=ids, output_hidden_states=True).hidden_states[1]  # after layer 0
        expected = target.lm_head(target.model.norm(hidden)).float()
    drafter = EarlyExitDrafter(target, num_layers=1)
    torch.testing.assert_close(drafter.catch_up(ids, return_logits=True), expected)
    tokens, logits = drafter.draft(ids, 1)
    torch.testing.assert_close(logits[:, 0], expected[:, -1])
    full = EarlyExitDrafter(target, num_layers=2)  # all layers: the target itself
    with torch.no_grad():
        torch.testing.assert_close(full.catch_up(ids, return_logits=True), target(input_ids=ids).logits.float())


def test_early_exit_adapter_leaves_the_target_untouched(target, references):
    plain = EarlyExitDrafter(target, num_layers=1)
    adapted = EarlyExitDrafter(target, num_layers=1, adapter=LORA, name="ee_lora")
    ids = PROMPTS[0]
    assert not torch.allclose(plain.catch_up(ids, return_logits=True), adapted.catch_up(ids, return_logits=True))
    assert type(target.model.layers[0].self_attn.q_proj).__name__ == "Linear"  # not a peft layer
    assert torch.equal(greedy(target, ids, MAX_NEW), references[0])
    out = metasd_greedy(target, ids, MAX_NEW, assistant_models=[adapted, plain])
    assert torch.equal(out, references[0])


def test_early_exit_errors_name_the_fix(target):
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2))
    with pytest.raises(
        DrafterCompatibilityError, match=r"`target` must be a Llama-family causal LM .*, but is GPT2LMHeadModel\. Use"
    ):
        EarlyExitDrafter(gpt2, num_layers=1)
    with pytest.raises(ValueError, match=r"`num_layers` must be an int in \[1, 2\] .*, but is 3\. Use e\.g\. 1"):
        EarlyExitDrafter(target, num_layers=3)
    with pytest.raises(TypeError, match=r"`num_layers` must be an int in \[1, 2\] .*, but is '1'\. Use e\.g\. 1"):
        EarlyExitDrafter(target, num_layers="1")
    assert EarlyExitDrafter(target, num_layers=1).num_layers == 1
    hooked = tiny_llama(0)
    hooked.model.layers[1].forward = lambda *args, **kwargs: None  # what accelerate's device_map hooks do
    with pytest.raises(
        DrafterCompatibilityError, match=r"but 'model\.layers\.1' has a per-instance `forward` .* Load the target on"
    ):
        EarlyExitDrafter(hooked, num_layers=1)
