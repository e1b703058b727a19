"""Drafter pools as Hub artefacts: save / load round trips, push (mocked Hub), validation, load errors. No network."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import VOCAB, greedy, metasd_greedy, prompts, sharpen, tiny_llama
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

import hf_metasd
import hf_metasd.pool.pool as pool_module
from hf_metasd.drafters import Drafter, EarlyExitDrafter, LoraDrafter, ModelDrafter, PromptLookupDrafter
from hf_metasd.drafters.save import base_state_dict
from hf_metasd.errors import DrafterCompatibilityError, InvalidPoolError
from hf_metasd.pool import FORMAT_VERSION, DrafterPool, DrafterPoolConfig, DrafterSpec

MAX_NEW = 16
PROMPTS = prompts(3, seed=7)
TASKS = ("chat", "translation", "summary", "qa", "math", "rag", "code")
LORA = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False)


pytestmark = pytest.mark.usefixtures("no_network")


def _shared_base(target, seed: int = 11):
    """A 1-layer drafter base sharing the target's embedding and LM head modules (as recipes/pools/train_drafters.py)."""
    base = sharpen(tiny_llama(seed, layers=1))
    base.model.embed_tokens = target.model.embed_tokens
    base.lm_head = target.lm_head
    return base


def _lora_arms(target, adapters=TASKS, head=True):
    torch.manual_seed(12)
    peft_model = get_peft_model(_shared_base(target), LORA, adapter_name=adapters[0])
    for name in adapters[1:]:
        peft_model.add_adapter(name, LORA)
    head_ids = torch.arange(0, VOCAB, 2) if head else None
    return LoraDrafter.from_peft_model(peft_model.eval(), head_token_ids=head_ids)


@pytest.fixture
def pool(target):
    """7 LoRA arms on a shared-embedding base with a restricted head, prompt lookup, early exit, a small model."""
    return DrafterPool(
        [
            *_lora_arms(target),
            PromptLookupDrafter(max_matching_ngram_size=3),
            EarlyExitDrafter(target, num_layers=1),
            ModelDrafter(sharpen(tiny_llama(13, layers=1)), name="small"),
        ],
        target=target,
        policy="round_robin",
        num_assistant_tokens=3,
    )


def _outputs(target, pool):
    return [metasd_greedy(target, p, MAX_NEW, assistant_models=pool) for p in PROMPTS]


def _arm_logits(pool, ids):
    return [d.catch_up(ids, return_logits=True) for d in pool.drafters if d.returns_logits]


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------------------------------------
# round trips
# ---------------------------------------------------------------------------------------------------------------------
def test_round_trip_with_stored_weights_gives_identical_output(target, pool, tmp_path):
    before = _outputs(target, pool)
    logits_before = _arm_logits(pool, PROMPTS[0])
    pool.save_pretrained(tmp_path, store_weights=True)

    files = _files(tmp_path)
    assert {"config.json", "README.md", "lora/chat/base/model.safetensors", "drafters/small/model.safetensors"} <= set(
        files
    )
    assert {f"lora/chat/adapters/{t}/adapter_model.safetensors" for t in TASKS} <= set(files)
    base_keys = set(load_file(tmp_path / "lora/chat/base/model.safetensors"))
    assert not any("embed_tokens" in k or "lm_head" in k or "lora_" in k for k in base_keys)  # the target's, not saved
    assert "model.layers.0.self_attn.q_proj.weight" in base_keys
    assert sum(files.values()) < 200_000

    loaded = DrafterPool.from_pretrained(tmp_path, target=target)
    assert [d.name for d in loaded.drafters] == [d.name for d in pool.drafters]
    assert loaded.generate_kwargs() == pool.generate_kwargs()
    lora = loaded.drafters[0]
    assert lora.model.model.embed_tokens is target.model.embed_tokens  # re-attached, not loaded
    assert lora.model.lm_head.weight is target.lm_head.weight
    assert all(d.model is lora.model for d in loaded.drafters[:7])  # one resident base
    assert torch.equal(lora.head_token_ids, pool.drafters[0].head_token_ids)
    for a, b in zip(_arm_logits(loaded, PROMPTS[0]), logits_before):
        torch.testing.assert_close(a, b)
    after = _outputs(target, loaded)
    for a, b, p in zip(after, before, PROMPTS):
        assert torch.equal(a, b) and torch.equal(a, greedy(target, p, MAX_NEW))


def test_pool_brings_its_defaults_and_explicit_arguments_win(target, pool):
    out = metasd_greedy(target, PROMPTS[0], MAX_NEW, assistant_models=pool, return_dict_in_generate=True)
    assert out.metasd.policy == "round_robin" and out.metasd.num_assistant_tokens == 3
    assert out.metasd.arms[:3] == [0, 1, 2]
    out = metasd_greedy(
        target, PROMPTS[0], MAX_NEW, assistant_models=pool, meta_policy="ucb", return_dict_in_generate=True
    )
    assert out.metasd.policy == "ucb"


def test_resaving_a_loaded_pool_keeps_stored_drafters_stored(target, pool, tmp_path):
    pool.save_pretrained(tmp_path / "a", store_weights=True)
    loaded = DrafterPool.from_pretrained(tmp_path / "a", target=target)
    loaded.save_pretrained(tmp_path / "b")  # no store_weights: what came stored stays stored
    config_a = json.loads((tmp_path / "a/config.json").read_text())
    config_b = json.loads((tmp_path / "b/config.json").read_text())
    assert config_a == config_b
    again = DrafterPool.from_pretrained(tmp_path / "b", target=target)
    for a, b in zip(_arm_logits(again, PROMPTS[1]), _arm_logits(pool, PROMPTS[1])):
        torch.testing.assert_close(a, b)


def test_reference_round_trip_stores_no_weights(target, tmp_path):
    sharpen(tiny_llama(14, layers=1)).save_pretrained(tmp_path / "drafter")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "drafter")
    pool = DrafterPool([model, PromptLookupDrafter()], target=target)
    pool.save_pretrained(tmp_path / "pool")
    spec = json.loads((tmp_path / "pool/config.json").read_text())["drafters"][0]
    assert spec["path"] == str(tmp_path / "drafter") and spec["stored"] is False and spec["kind"] == "assistant_model"
    assert set(_files(tmp_path / "pool")) == {"config.json", "README.md"}
    outside = {str(tmp_path / "drafter"): tmp_path / "drafter"}  # the caller allows the local reference
    loaded = DrafterPool.from_pretrained(tmp_path / "pool", target=target, local_paths=outside)
    assert torch.equal(_outputs(target, loaded)[0], greedy(target, PROMPTS[0], MAX_NEW))


def test_a_trained_drafter_folder_becomes_a_pool(target, tmp_path):
    """The layout of recipes/pools/train_drafters.py: base/ without embeddings, head_token_ids.json, adapters/<task>/."""
    arms = _lora_arms(target)
    peft_model = arms[0].peft_model
    base = peft_model.get_base_model()
    (tmp_path / "base").mkdir()
    base.config.save_pretrained(tmp_path / "base")
    state = base_state_dict(base, drop_embeddings=True)  # what the trainer saves
    save_file(state, tmp_path / "base/model.safetensors", metadata={"format": "pt"})
    (tmp_path / "head_token_ids.json").write_text(json.dumps(arms[0].head_token_ids.tolist()))
    for task in TASKS:
        peft_model.save_pretrained(tmp_path / "adapters", selected_adapters=[task])
    spec = DrafterSpec(
        kind="lora",
        name="smollm2-drafters",
        path=".",
        stored=True,
        adapters=list(TASKS),
        params={
            "base": "base",
            "adapters_dir": "adapters",
            "head_token_ids": "head_token_ids.json",
            "share_target_embeddings": True,
        },
    )
    DrafterPoolConfig(drafters=[spec], target="tiny-target", num_assistant_tokens=3).save(tmp_path)
    loaded = DrafterPool.from_pretrained(tmp_path, target=target)
    assert [d.name for d in loaded.drafters] == list(TASKS)
    for mine, theirs in zip(loaded.drafters, arms):
        torch.testing.assert_close(
            mine.catch_up(PROMPTS[0], return_logits=True), theirs.catch_up(PROMPTS[0], return_logits=True)
        )


def test_in_memory_model_needs_store_weights(target, tmp_path):
    pool = DrafterPool([tiny_llama(15, layers=1)], target=target)
    with pytest.raises(
        InvalidPoolError,
        match=r"drafter 'LlamaForCausalLM' \(drafters\[0\]\) must have a source .* but it was built in memory\. "
        r"Save the pool with `store_weights=True`",
    ):
        pool.save_pretrained(tmp_path / "pool")
    assert not (tmp_path / "pool").exists()
    pool.save_pretrained(tmp_path / "pool", store_weights=True)  # the fix
    assert (tmp_path / "pool/drafters/LlamaForCausalLM/model.safetensors").is_file()


def test_early_exit_adapter_round_trip(target, tmp_path):
    torch.manual_seed(3)
    drafter = EarlyExitDrafter(target, num_layers=1, adapter=LORA, name="ee")
    pool = DrafterPool([drafter], target=target)
    with pytest.raises(
        InvalidPoolError, match=r"drafter 'ee' \(drafters\[0\]\) must have a source .* built in memory"
    ):
        pool.save_pretrained(tmp_path / "pool")
    pool.save_pretrained(tmp_path / "pool", store_weights=True)
    assert (tmp_path / "pool/early_exit/ee/adapter_model.safetensors").is_file()
    loaded = DrafterPool.from_pretrained(tmp_path / "pool", target=target)
    torch.testing.assert_close(
        loaded.drafters[0].catch_up(PROMPTS[0], return_logits=True), drafter.catch_up(PROMPTS[0], return_logits=True)
    )
    assert type(target.model.layers[0].self_attn.q_proj).__name__ == "Linear"  # the target never got the adapter


def test_config_json_is_sorted_and_versioned(pool):
    config = pool.to_config(store_weights=True)
    text = config.to_json_string()
    data = json.loads(text)
    assert list(data) == sorted(data)
    assert data["format_version"] == FORMAT_VERSION and data["hf_metasd_version"] == hf_metasd.__version__
    assert [d["kind"] for d in data["drafters"]] == ["lora", "prompt_lookup", "early_exit", "assistant_model"]
    assert data["drafters"][0]["adapters"] == list(TASKS)
    assert data["drafters"][2]["params"] == {"num_layers": 1, "head_token_ids": None}
    assert DrafterPoolConfig.from_dict(data) == config


# ---------------------------------------------------------------------------------------------------------------------
# push (mocked Hub)
# ---------------------------------------------------------------------------------------------------------------------
class FakeHfApi:
    """Records what `push_to_hub` does; the folder is read at upload time (it is a temporary directory)."""

    calls: list = []

    def __init__(self, token=None):
        FakeHfApi.calls.append(("init", token))

    def create_repo(self, repo_id, private=None, exist_ok=False, **kwargs):
        FakeHfApi.calls.append(("create_repo", repo_id))
        return SimpleNamespace(repo_id=repo_id)

    def upload_folder(self, *, repo_id, folder_path, commit_message=None, **kwargs):
        folder = Path(folder_path)
        files = {name: (folder / name).read_bytes() for name in _files(folder)}
        FakeHfApi.calls.append(("upload_folder", repo_id, commit_message, files))
        return SimpleNamespace(commit_url=f"https://huggingface.co/{repo_id}/commit/0")


@pytest.fixture
def fake_hub(monkeypatch):
    FakeHfApi.calls = []
    monkeypatch.setattr(pool_module, "HfApi", FakeHfApi)
    return FakeHfApi


def test_push_to_hub_is_one_commit_with_config_and_card(target, pool, fake_hub):
    pool.target_id = "org/tiny-target"
    result = pool.push_to_hub("me/tiny-pool", store_weights=True, token="hf_x")
    assert result.commit_url.endswith("/commit/0")
    commits = [c for c in fake_hub.calls if c[0] == "upload_folder"]
    assert len(commits) == 1
    _, repo_id, message, files = commits[0]
    assert repo_id == "me/tiny-pool" and message == "Upload MetaSD drafter pool"
    assert {"config.json", "README.md", "lora/chat/base/model.safetensors"} <= set(files)
    assert json.loads(files["config.json"])["target"] == "org/tiny-target"
    card = files["README.md"].decode()
    assert "library_name: hf_metasd" in card and "base_model: org/tiny-target" in card
    assert "- speculative-decoding" in card
    assert "| 0 | `chat` | lora | stored: `lora/chat` |" in card and "| 9 | `small` | assistant_model |" in card
    assert 'DrafterPool.from_pretrained("me/tiny-pool", target=target)' in card
    assert "assistant_models=pool" in card


def test_push_refuses_local_references_before_creating_the_repo(target, tmp_path, fake_hub):
    sharpen(tiny_llama(14, layers=1)).save_pretrained(tmp_path / "drafter")
    pool = DrafterPool([AutoModelForCausalLM.from_pretrained(tmp_path / "drafter")], target=target)
    with pytest.raises(
        InvalidPoolError, match=r"must reference a Hub repo to be pushed, but references the local path .* Push with "
    ):
        pool.push_to_hub("me/pool")
    assert fake_hub.calls == []
    pool.push_to_hub("me/pool", store_weights=True)  # the fix
    assert [c[0] for c in fake_hub.calls] == ["init", "create_repo", "upload_folder"]


def test_push_references_hub_drafters_without_weights(target, fake_hub):
    model = sharpen(tiny_llama(16, layers=1))
    model.config._name_or_path = "org/small-drafter"
    DrafterPool([model], target=target).push_to_hub("me/pool")
    files = fake_hub.calls[-1][3]
    assert set(files) == {"config.json", "README.md"}
    spec = json.loads(files["config.json"])["drafters"][0]
    assert (spec["path"], spec["stored"]) == ("org/small-drafter", False)


def test_save_and_push_forwards_push_to_hub_arguments_and_refuses_unknown_ones(pool, tmp_path, fake_hub):
    with pytest.raises(
        TypeError,
        match=r"`push_to_hub_kwargs` must be Hub arguments of `push_to_hub` \['commit_message', .*'model_card_kwargs'\], "
        r"but has unknown 'comit_message'\. See `help\(DrafterPool\.push_to_hub\)`\.",
    ):
        pool.save_pretrained(tmp_path / "pool", store_weights=True, push_to_hub=True, comit_message="typo")
    assert fake_hub.calls == [] and not (tmp_path / "pool").exists()  # refused before any write or Hub call
    pool.save_pretrained(tmp_path / "pool", store_weights=True, push_to_hub=True, commit_message="mine")  # the fix
    assert [c[:3] for c in fake_hub.calls if c[0] == "upload_folder"] == [("upload_folder", "pool", "mine")]


# ---------------------------------------------------------------------------------------------------------------------
# an invalid pool is never written nor pushed
# ---------------------------------------------------------------------------------------------------------------------
class MysteryDrafter(Drafter):
    kind = "mystery"  # never registered

    def draft(self, input_ids, num_tokens, *, logits_processor=None, do_sample=False):
        return input_ids[:, :0], None


INVALID = {
    "empty": (
        lambda p: setattr(p, "drafters", []),
        r"pool `drafters` must hold at least one drafter, but is empty\. Add a drafter",
    ),
    "unknown kind": (
        lambda p: p.drafters.append(MysteryDrafter()),
        r"drafter 'mystery' \(drafters\[10\]\) must be of a registered kind to be saved, but its kind 'mystery'.* "
        r"Register `MysteryDrafter` with `hf_metasd\.drafters\.register_drafter_kind`",
    ),
    "policy": (
        lambda p: setattr(p, "policy", "oracle"),
        r"pool policy 'oracle' with \{\} is invalid: `meta_policy` must be one of \[.*'ucb'.*\], but is 'oracle'",
    ),
    "policy settings": (
        lambda p: setattr(p, "policy_kwargs", {"beta": object()}),
        r"pool `policy_kwargs` must be JSON-serialisable",
    ),
    "reward": (
        lambda p: setattr(p, "reward", "accuracy"),
        r"pool reward 'accuracy' is invalid: `meta_reward` must be one of \[.*'bd'.*\] .*, but is 'accuracy'\.",
    ),
    "reward callable": (
        lambda p: setattr(p, "reward", lambda feedback: 1.0),
        r"pool `reward` must be a reward name in \[.*\] \(callables cannot be saved\), but is function\. Use a name",
    ),
    "draft length": (
        lambda p: setattr(p, "num_assistant_tokens", 0),
        r"pool `num_assistant_tokens` must be an int >= 1, but is 0\. Use e\.g\. 3",
    ),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_pool_is_never_written_nor_pushed(pool, tmp_path, fake_hub, case):
    spoil, match = INVALID[case]
    spoil(pool)
    with pytest.raises(InvalidPoolError, match=match):
        pool.save_pretrained(tmp_path / "pool", store_weights=True)
    assert not (tmp_path / "pool").exists()
    with pytest.raises(InvalidPoolError, match=match):
        pool.push_to_hub("me/pool", store_weights=True)
    assert fake_hub.calls == []


def test_invalid_pool_is_refused_at_construction():
    with pytest.raises(InvalidPoolError, match=r"pool `drafters` must hold at least one drafter"):
        DrafterPool([])
    with pytest.raises(InvalidPoolError, match=r"pool `num_assistant_tokens` must be an int >= 1, but is 0"):
        DrafterPool([PromptLookupDrafter()], num_assistant_tokens=0)
    with pytest.raises(InvalidPoolError, match=r"pool policy 'oracle'"):
        DrafterPool([PromptLookupDrafter()], policy="oracle")


# ---------------------------------------------------------------------------------------------------------------------
# loading: every broken pool raises a specific error naming the drafter and the fix
# ---------------------------------------------------------------------------------------------------------------------
@pytest.fixture
def saved(target, pool, tmp_path):
    pool.save_pretrained(tmp_path, store_weights=True)
    return tmp_path


def _edit_config(folder: Path, edit) -> None:
    data = json.loads((folder / "config.json").read_text())
    edit(data)
    (folder / "config.json").write_text(json.dumps(data))


def test_load_corrupt_or_missing_config(target, saved):
    (saved / "config.json").write_text('{"drafters": [')
    with pytest.raises(InvalidPoolError, match=r"config\.json' must be valid JSON, but is not .* re-save the pool"):
        DrafterPool.from_pretrained(saved, target=target)
    (saved / "config.json").unlink()
    with pytest.raises(InvalidPoolError, match=r"a pool folder must hold `config\.json`, but .* has none"):
        DrafterPool.from_pretrained(saved, target=target)
    with pytest.raises(
        InvalidPoolError, match=r"must be a pool folder or a Hub repo id, but '/no/such/pool' does not"
    ):
        DrafterPool.from_pretrained("/no/such/pool", target=target)


def test_load_missing_stored_drafter(target, saved):
    shutil.rmtree(saved / "drafters/small")
    with pytest.raises(
        InvalidPoolError,
        match=r"drafter 'small' \(drafters\[3\]\) must be stored in the pool at 'drafters/small', but that folder "
        r"is missing .* Restore it, or re-save the pool",
    ):
        DrafterPool.from_pretrained(saved, target=target)


def test_load_missing_adapter_and_the_fix(target, saved):
    shutil.rmtree(saved / "lora/chat/adapters/math")
    with pytest.raises(
        InvalidPoolError,
        match=r"drafter 'chat' \(drafters\[0\]\) must find adapter 'math' at .*, but it is missing\. Restore the "
        r"adapter folder, or remove 'math' from `adapters` in config\.json",
    ):
        DrafterPool.from_pretrained(saved, target=target)
    _edit_config(saved, lambda d: d["drafters"][0]["adapters"].remove("math"))  # the fix
    loaded = DrafterPool.from_pretrained(saved, target=target)
    assert "math" not in [d.name for d in loaded.drafters] and len(loaded) == 9


def test_load_missing_head_token_ids(target, saved):
    (saved / "lora/chat/head_token_ids.json").unlink()
    with pytest.raises(
        InvalidPoolError,
        match=r"drafter 'chat' \(drafters\[0\]\) must find its `head_token_ids` file 'lora/chat/head_token_ids\.json' "
        r"in the pool folder, but it is missing\.",
    ):
        DrafterPool.from_pretrained(saved, target=target)


def test_load_missing_reference(target, saved):
    _edit_config(saved, lambda d: d["drafters"][3].update(stored=False, path="/no/such/drafter"))
    with pytest.raises(
        InvalidPoolError,
        match=r"drafter 'small' \(drafters\[3\]\) must point to an existing folder or a Hub repo id, but "
        r"'/no/such/drafter' does not exist\. Fix `path`",
    ):
        DrafterPool.from_pretrained(saved, target=target, local_paths={"/no/such/drafter": "/no/such/drafter"})


def test_load_with_a_target_of_another_vocabulary(saved):
    other = tiny_llama(0, vocab=64)
    with pytest.raises(
        DrafterCompatibilityError,
        match=r"drafter 'chat' \(drafters\[0\]\) must have the target's vocabulary size 64, but has 96\. Load the "
        r"pool with the target it was saved for",
    ):
        DrafterPool.from_pretrained(saved, target=other)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (
            lambda d: d["drafters"][1].update(kind="telepathy"),
            r"drafter 'prompt_lookup' \(drafters\[1\]\) must be of a registered kind \[.*\], but its kind is "
            r"'telepathy'\. Register the kind",
        ),
        (
            lambda d: d["drafters"][0].update(path="../elsewhere"),
            r"drafter 'chat' \(drafters\[0\]\) `path` must be a relative path inside the pool folder, but is "
            r"'\.\./elsewhere'",
        ),
        (
            lambda d: d["drafters"][0]["adapters"].append("../../x"),
            r"`adapters\[7\]` must be a relative path inside the pool folder \(one folder name\)",
        ),
        (lambda d: d.update(num_assistant_tokens="5"), r"`num_assistant_tokens` must be int, but is '5'"),
        (lambda d: d.update(policy="oracle"), r"pool policy 'oracle' with \{\} is invalid"),
        (lambda d: d.update(drafters=[]), r"pool `drafters` must hold at least one drafter, but is empty"),
        (lambda d: d["drafters"][1].pop("kind"), r"`drafters\[1\]` must have `kind`"),
        (
            lambda d: d["drafters"][1]["params"].update(max_matching_ngram_size=0),
            r"drafter 'prompt_lookup' \(drafters\[1\]\) must have `params` that `PromptLookupDrafter` accepts, but "
            r".* fails: `max_matching_ngram_size` must be an int >= 1, but is 0\. .* Fix `params` in config\.json",
        ),
    ],
)
def test_load_invalid_config_entries(target, saved, edit, match):
    _edit_config(saved, edit)
    with pytest.raises(InvalidPoolError, match=match):
        DrafterPool.from_pretrained(saved, target=target)


def test_unknown_keys_from_a_newer_version_load_with_one_warning(target, saved):
    def newer(data):
        data["speculative_magic"] = 3
        data["drafters"][1]["warp_factor"] = 9
        data["hf_metasd_version"] = "9.0.0"

    _edit_config(saved, newer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = DrafterPool.from_pretrained(saved, target=target)
    ours = [w for w in caught if "hf_metasd" in str(w.message)]
    assert len(ours) == 1
    message = str(ours[0].message)
    assert "['speculative_magic', 'drafters[1].warp_factor']" in message and "9.0.0" in message
    assert "Upgrade hf_metasd" in message
    assert len(loaded) == 10


def test_bfloat16_drafters_for_a_float32_target(target, tmp_path):
    """`params.dtype`: a bf16 LoRA base gets a bf16 copy of the target's embedding (never saved); output is lossless."""
    arms = _lora_arms(target)
    peft_model = arms[0].peft_model
    base = peft_model.get_base_model()
    (tmp_path / "base").mkdir()
    base.config.save_pretrained(tmp_path / "base")
    save_file(base_state_dict(base, drop_embeddings=True), tmp_path / "base/model.safetensors")
    for task in TASKS:
        peft_model.save_pretrained(tmp_path / "adapters", selected_adapters=[task])
    params = {"base": "base", "adapters_dir": "adapters", "share_target_embeddings": True, "dtype": "bfloat16"}
    spec = DrafterSpec(kind="lora", name="bf16", path=".", stored=True, adapters=list(TASKS), params=params)
    DrafterPoolConfig(drafters=[spec], target="tiny-target", num_assistant_tokens=3).save(tmp_path)
    loaded = DrafterPool.from_pretrained(tmp_path, target=target)
    model = loaded.drafters[0].peft_model.get_base_model()
    assert model.dtype == torch.bfloat16 and target.dtype == torch.float32
    assert model.get_input_embeddings().weight.dtype == torch.bfloat16
    head = model.get_output_embeddings().weight
    assert head.dtype == torch.bfloat16 and torch.equal(head, target.lm_head.weight.to(torch.bfloat16))
    for prompt in PROMPTS[:3]:
        reference = target.generate(prompt, do_sample=False, max_new_tokens=10)
        out = target.generate(
            prompt, do_sample=False, max_new_tokens=10, custom_generate=hf_metasd.generate, assistant_models=loaded
        )
        assert torch.equal(out, reference)
    # re-saving keeps the embedding out of the files and records the dtype
    loaded.save_pretrained(tmp_path / "again", store_weights=True)
    config = json.loads((tmp_path / "again/config.json").read_text())
    assert config["drafters"][0]["params"]["dtype"] == "bfloat16"
    assert config["drafters"][0]["params"]["share_target_embeddings"] is True
    saved = load_file(next((tmp_path / "again").rglob("model.safetensors")))
    assert not any("embed_tokens" in k or "lm_head" in k for k in saved)


def test_bad_dtype_is_named(target, tmp_path):
    spec = DrafterSpec(kind="lora", name="x", path=".", stored=True, adapters=["a"], params={"dtype": "int8"})
    DrafterPoolConfig(drafters=[spec], target="tiny-target").save(tmp_path)
    with pytest.raises(InvalidPoolError, match=r"`params.dtype` must name a torch floating dtype, but is 'int8'"):
        DrafterPool.from_pretrained(tmp_path, target=target)
