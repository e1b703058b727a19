"""Every drafter kind owns its pool round trip (`to_spec` / `from_spec`): a contract over the registered kinds, the
corpus kind's stored corpus, errors for corrupt weight files, the tokenizer fingerprint, shipped priors, one plan per
save or push. No network."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import VOCAB, greedy, metasd_greedy, prompts, sharpen, tiny_llama
from test_drafters import FACTORIES
from tokenizers import Tokenizer, models
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

import hf_metasd.pool.pool as pool_module
from hf_metasd.drafters import (
    DRAFTER_KINDS,
    CorpusDrafter,
    EarlyExitDrafter,
    LoraDrafter,
    ModelDrafter,
    PromptLookupDrafter,
    tokenizer_fingerprint,
)
from hf_metasd.errors import DrafterCompatibilityError, InvalidPoolError
from hf_metasd.pool import DrafterPool, DrafterPoolConfig

MAX_NEW = 12
PROMPTS = prompts(2, seed=21)


pytestmark = pytest.mark.usefixtures("no_network")


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _behaviour(drafter, ids):
    """What a drafter does on `ids`: its logits over the prompt, or (model-free) its draft."""
    drafter = drafter.spawn()
    if drafter.returns_logits:
        return drafter.catch_up(ids, return_logits=True)
    return drafter.draft(ids, 4)[0]


# ---------------------------------------------------------------------------------------------------------------------
# the contract: every registered kind saves, loads and saves again identically
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(DRAFTER_KINDS))
def test_every_kind_round_trips_through_a_pool(target, tmp_path, kind):
    pool = DrafterPool(FACTORIES[kind](target), target=target, num_assistant_tokens=3)
    pool.save_pretrained(tmp_path / "a", store_weights=True)
    loaded = DrafterPool.from_pretrained(tmp_path / "a", target=target)
    assert [(type(d), d.name) for d in loaded.drafters] == [(type(d), d.name) for d in pool.drafters]
    assert all(d.source is not None for d in loaded.drafters)
    ids = torch.cat([PROMPTS[0], greedy(target, PROMPTS[0], MAX_NEW)[:, PROMPTS[0].shape[1] :]], dim=1)
    for mine, theirs in zip(loaded.drafters, pool.drafters):
        torch.testing.assert_close(_behaviour(mine, ids), _behaviour(theirs, ids))
    for prompt in PROMPTS:
        assert torch.equal(
            metasd_greedy(target, prompt, MAX_NEW, assistant_models=loaded), greedy(target, prompt, MAX_NEW)
        )
    loaded.save_pretrained(tmp_path / "b")  # what came stored stays stored
    assert (tmp_path / "a/config.json").read_text() == (tmp_path / "b/config.json").read_text()
    assert _files(tmp_path / "a") == _files(tmp_path / "b")


def test_a_kind_registered_with_one_call_round_trips_through_the_defaults(target, tmp_path, monkeypatch):
    class Lookup3(PromptLookupDrafter):
        kind = "lookup3"

    monkeypatch.setitem(DRAFTER_KINDS, "lookup3", Lookup3)
    DrafterPool([Lookup3(max_matching_ngram_size=3, name="l3")]).save_pretrained(tmp_path)
    spec = json.loads((tmp_path / "config.json").read_text())["drafters"][0]
    assert (spec["kind"], spec["stored"], spec["params"]["max_matching_ngram_size"]) == ("lookup3", False, 3)
    [drafter] = DrafterPool.from_pretrained(tmp_path, target=target).drafters
    assert type(drafter) is Lookup3 and drafter.max_matching_ngram_size == 3 and drafter.name == "l3"


def test_a_corpus_is_always_stored_inside_the_pool(target, tmp_path):
    corpus = CorpusDrafter.from_sequences([[5, 6, 7, 8], [9, 6, 7, 1]], min_frequency=0.5, name="answers")
    pool = DrafterPool([corpus, PromptLookupDrafter()], target=target)
    pool.save_pretrained(tmp_path)  # no store_weights: a corpus has nothing to reference
    assert _files(tmp_path) == ["README.md", "config.json", "corpus/answers/corpus.safetensors"]
    spec = json.loads((tmp_path / "config.json").read_text())["drafters"][0]
    assert (spec["path"], spec["stored"], spec["params"]["min_frequency"]) == ("corpus/answers", True, 0.5)
    [loaded, _] = DrafterPool.from_pretrained(tmp_path, target=target).drafters
    assert loaded.index.documents() == [[5, 6, 7, 8], [9, 6, 7, 1]] and loaded.min_frequency == 0.5
    assert "| 0 | `answers` | corpus | stored: `corpus/answers` |" in (tmp_path / "README.md").read_text()


# ---------------------------------------------------------------------------------------------------------------------
# corrupt weight files say which drafter, which file, and what to do
# ---------------------------------------------------------------------------------------------------------------------
def _truncate(path: Path) -> bytes:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return data


@pytest.fixture
def stored(target, tmp_path):
    """A stored pool: a small model, two LoRA arms, an early-exit adapter, a corpus."""
    torch.manual_seed(5)
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft_model = get_peft_model(sharpen(tiny_llama(8, layers=1)), lora, adapter_name="code")
    peft_model.add_adapter("math", lora)
    pool = DrafterPool(
        [
            ModelDrafter(sharpen(tiny_llama(13, layers=1)), name="small"),
            *LoraDrafter.from_peft_model(peft_model.eval()),
            EarlyExitDrafter(target, num_layers=1, adapter=lora, name="ee"),
            CorpusDrafter.from_sequences([[1, 2, 3, 4]], name="answers"),
        ],
        target=target,
    )
    pool.save_pretrained(tmp_path, store_weights=True)
    return tmp_path


@pytest.mark.parametrize(
    ("file", "match"),
    [
        (
            "drafters/small/model.safetensors",
            r"drafter 'small' \(drafters\[0\]\) must find a complete safetensors file at '.*drafters/small/model\."
            r"safetensors', but it is truncated or corrupt \(.*\)\. Restore the file",
        ),
        (
            "lora/code/base/model.safetensors",
            r"drafter 'code' \(drafters\[1\]\) must find a complete safetensors file at '.*base/model\."
            r"safetensors', but it is truncated or corrupt",
        ),
        (
            "lora/code/adapters/math/adapter_model.safetensors",
            r"drafter 'code' \(drafters\[1\]\) must find a complete safetensors file at "
            r"'.*adapters/math/adapter_model\.safetensors', but it is truncated or corrupt \(.*\)\. Restore the file",
        ),
        (
            "early_exit/ee/adapter_model.safetensors",
            r"drafter 'ee' \(drafters\[2\]\) must find a complete safetensors file at '.*early_exit/ee/adapter_model\."
            r"safetensors', but it is truncated or corrupt",
        ),
        (
            "corpus/answers/corpus.safetensors",
            r"drafter 'answers' \(drafters\[3\]\) must find a readable corpus at '.*corpus/answers/corpus\.safetensors'"
            r", but it cannot be read: .* Restore the file, or re-save the pool",
        ),
    ],
)
def test_a_truncated_weight_file_names_the_drafter_the_file_and_the_fix(target, stored, file, match):
    original = _truncate(stored / file)
    with pytest.raises(InvalidPoolError, match=match):
        DrafterPool.from_pretrained(stored, target=target)
    (stored / file).write_bytes(original)  # the fix: restore the file
    assert len(DrafterPool.from_pretrained(stored, target=target)) == 5


def test_a_truncated_referenced_model_is_named_too(target, tmp_path):
    sharpen(tiny_llama(14, layers=1)).save_pretrained(tmp_path / "drafter")
    DrafterPool([AutoModelForCausalLM.from_pretrained(tmp_path / "drafter")], target=target).save_pretrained(
        tmp_path / "pool"
    )
    _truncate(tmp_path / "drafter/model.safetensors")
    with pytest.raises(
        InvalidPoolError,
        match=rf"drafter '.*' \(drafters\[0\]\) must find a complete safetensors file at "
        rf"'{re.escape(str(tmp_path / 'drafter'))}', but it is truncated or corrupt",
    ):
        outside = {str(tmp_path / "drafter"): tmp_path / "drafter"}  # the caller allows the local reference
        DrafterPool.from_pretrained(tmp_path / "pool", target=target, local_paths=outside)


# ---------------------------------------------------------------------------------------------------------------------
# tokenizer fingerprint: same vocabulary size, other tokens
# ---------------------------------------------------------------------------------------------------------------------
def _tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(["<unk>", *words])}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")))


def test_a_pool_refuses_a_tokenizer_of_the_same_size_but_other_tokens(target, tmp_path, monkeypatch):
    ours, theirs = _tokenizer(["red", "green", "blue"]), _tokenizer(["red", "blue", "green"])
    assert len(ours) == len(theirs)
    DrafterPool([PromptLookupDrafter()], target=target).save_pretrained(tmp_path, tokenizer=ours)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["tokenizer_hash"] == tokenizer_fingerprint(ours)

    def never(*args, **kwargs):
        raise AssertionError("a drafter was built before the tokenizer check")

    with monkeypatch.context() as m:
        m.setattr(PromptLookupDrafter, "from_spec", classmethod(never))
        with pytest.raises(
            DrafterCompatibilityError,
            match=rf"pool `tokenizer` must be the tokenizer the pool was saved with \(fingerprint "
            rf"{tokenizer_fingerprint(ours)}\), but the given one has fingerprint {tokenizer_fingerprint(theirs)}: .* "
            r"Load the pool for the target it was built for .* with that target's tokenizer",
        ):
            DrafterPool.from_pretrained(tmp_path, target=target, tokenizer=theirs)
    loaded = DrafterPool.from_pretrained(tmp_path, target=target, tokenizer=ours)  # the fix: the right tokenizer
    assert loaded.tokenizer_hash == tokenizer_fingerprint(ours)
    DrafterPool.from_pretrained(tmp_path, target=target)  # without a tokenizer there is nothing to compare
    loaded.save_pretrained(tmp_path / "again")  # a loaded pool keeps its fingerprint
    assert json.loads((tmp_path / "again/config.json").read_text())["tokenizer_hash"] == tokenizer_fingerprint(ours)


def test_the_constructor_takes_the_tokenizer_and_a_save_can_replace_it(tmp_path):
    ours, theirs = _tokenizer(["a", "b"]), _tokenizer(["b", "a"])
    pool = DrafterPool([PromptLookupDrafter()], tokenizer=ours)
    assert pool.to_config().tokenizer_hash == tokenizer_fingerprint(ours)
    assert pool.to_config(tokenizer=theirs).tokenizer_hash == tokenizer_fingerprint(theirs)
    assert "Tokenizer fingerprint: `" + tokenizer_fingerprint(ours) in str(pool.generate_model_card())


# ---------------------------------------------------------------------------------------------------------------------
# priors shipped with a pool
# ---------------------------------------------------------------------------------------------------------------------
def test_priors_round_trip_through_save_and_load(target, tmp_path):
    pool = DrafterPool(
        [PromptLookupDrafter(), EarlyExitDrafter(target, num_layers=1)],
        target=target,
        priors={"early_exit_1": 0.6, "no_draft": 0.3},
        prior_weight=4.0,
    )
    pool.save_pretrained(tmp_path)
    loaded = DrafterPool.from_pretrained(tmp_path, target=target)
    assert loaded.priors == {"early_exit_1": 0.6, "no_draft": 0.3} and loaded.prior_weight == 4.0
    assert loaded.generate_kwargs() == pool.generate_kwargs()
    assert "| `early_exit_1` | 0.6 |" in (tmp_path / "README.md").read_text()


def test_a_loaded_pools_priors_steer_its_policy(target, tmp_path):
    """The generate seam applies the priors a pool ships (same reward, a policy that keeps means)."""
    drafters = [ModelDrafter(sharpen(tiny_llama(s, layers=1)), name=n) for s, n in ((1, "a"), (2, "b"))]
    pool = DrafterPool(
        drafters,
        target=target,
        policy="epsilon_greedy",
        policy_kwargs={"epsilon": 0.0},
        reward="bd",
        priors={"a": 0.0, "b": 1.0},
        prior_weight=1000.0,
    )
    pool.save_pretrained(tmp_path, store_weights=True)
    loaded = DrafterPool.from_pretrained(tmp_path, target=target)
    out = metasd_greedy(target, PROMPTS[0], MAX_NEW, assistant_models=loaded, return_dict_in_generate=True)
    assert set(out.metasd.arms) == {1}
    assert torch.equal(out.sequences, greedy(target, PROMPTS[0], MAX_NEW))


def test_priors_naming_no_drafter_of_a_loaded_config_are_refused(target, tmp_path):
    DrafterPool([PromptLookupDrafter()], priors={"prompt_lookup": 0.5}).save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data["priors"] = {"prompt_lokup": 0.5}
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(InvalidPoolError, match=r"pool `priors` must name the pool's drafters \['prompt_lookup'\]"):
        DrafterPool.from_pretrained(tmp_path, target=target)


# ---------------------------------------------------------------------------------------------------------------------
# one plan per save or push; one commit per push
# ---------------------------------------------------------------------------------------------------------------------
class FakeHfApi:
    calls: list = []

    def __init__(self, token=None):
        FakeHfApi.calls.append(("init", token))

    def create_repo(self, repo_id, private=None, exist_ok=False, **kwargs):
        FakeHfApi.calls.append(("create_repo", repo_id))
        return SimpleNamespace(repo_id=repo_id)

    def upload_folder(self, *, repo_id, folder_path, commit_message=None, **kwargs):
        FakeHfApi.calls.append(("upload_folder", repo_id, _files(Path(folder_path))))
        return SimpleNamespace(commit_url=f"https://huggingface.co/{repo_id}/commit/0")


@pytest.fixture
def counted(monkeypatch):
    """Counts `to_spec` calls of the kinds in the pool below (one per entry and plan)."""
    calls = []
    for cls in (PromptLookupDrafter, ModelDrafter):
        original = cls.__dict__["to_spec"].__func__ if "to_spec" in cls.__dict__ else cls.to_spec.__func__

        def counting(klass, group, ctx, original=original):
            calls.append(klass.kind)
            return original(klass, group, ctx)

        monkeypatch.setattr(cls, "to_spec", classmethod(counting))
    FakeHfApi.calls = []
    monkeypatch.setattr(pool_module, "HfApi", FakeHfApi)
    return calls


def test_a_save_and_a_push_each_plan_once(target, tmp_path, counted):
    pool = DrafterPool(
        [PromptLookupDrafter(), ModelDrafter(sharpen(tiny_llama(3, layers=1)), name="m")], target=target
    )
    pool.save_pretrained(tmp_path / "a", store_weights=True)
    assert counted == ["prompt_lookup", "assistant_model"]
    counted.clear()
    pool.push_to_hub("me/pool", store_weights=True)
    assert counted == ["prompt_lookup", "assistant_model"]
    counted.clear()
    pool.save_pretrained(tmp_path / "b", store_weights=True, push_to_hub=True, repo_id="me/pool")
    assert counted == ["prompt_lookup", "assistant_model"]
    commits = [c for c in FakeHfApi.calls if c[0] == "upload_folder"]
    assert len(commits) == 2
    for _, repo_id, files in commits:
        assert repo_id == "me/pool"
        assert files == ["README.md", "config.json", "drafters/m/config.json", "drafters/m/model.safetensors"]
    assert _files(tmp_path / "b") == commits[-1][2]


def test_an_invalid_pool_plans_no_write_and_no_push(target, tmp_path, counted):
    pool = DrafterPool([PromptLookupDrafter()], target=target)
    pool.priors = {"nobody": 0.5}
    for call in (
        lambda: pool.save_pretrained(tmp_path / "pool", push_to_hub=True),
        lambda: pool.push_to_hub("me/pool"),
    ):
        with pytest.raises(InvalidPoolError, match=r"pool `priors` must name the pool's drafters"):
            call()
    assert not (tmp_path / "pool").exists() and FakeHfApi.calls == []


def test_a_loaded_lora_entry_keeps_its_layout_when_saved_by_reference(target, tmp_path):
    """A LoRA folder referenced from outside the pool stays a reference (`source` replaces the old origin table)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(2)
    peft_model = get_peft_model(
        sharpen(tiny_llama(4, layers=1)), LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False), "qa"
    )
    DrafterPool(LoraDrafter.from_peft_model(peft_model), target=target).save_pretrained(
        tmp_path / "stored", store_weights=True
    )
    config = DrafterPoolConfig.from_json_file(tmp_path / "stored/config.json")
    spec = config.drafters[0]
    spec.stored, spec.path = False, str(tmp_path / "stored" / spec.path)
    config.save(tmp_path / "ref")
    loaded = DrafterPool.from_pretrained(tmp_path / "ref", target=target, local_paths={spec.path: spec.path})
    assert loaded.drafters[0].source["path"] == spec.path and loaded.drafters[0].source["stored"] is False
    loaded.save_pretrained(tmp_path / "again")
    again = json.loads((tmp_path / "again/config.json").read_text())["drafters"][0]
    assert (again["path"], again["stored"], again["adapters"]) == (spec.path, False, ["qa"])
    assert loaded.drafters[0].vocab_size == VOCAB
