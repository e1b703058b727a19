"""Per-task LoRA adapters on one resident feature head (issue 34, item 3b): one arm per adapter beside the base head's,
each drafting with its own adapter under the head's lock; lossless through both entry points; the user's head given
back as it was; a pool round trip (the head once, one folder per adapter); adapter files read as untrusted data; the
training recipe's ``--lora-task``."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
from conftest import greedy, metasd_greedy, prompts, sharpen, tiny_llama
from peft import LoraConfig, inject_adapter_in_model
from safetensors.torch import load_file, save_file
from test_feature_head_drafter import trained_head
from test_recipes import _feature_head_stores, recipe

import hf_metasd
from hf_metasd import DrafterCompatibilityError, InvalidPoolError, MetaSDConfigError
from hf_metasd.drafters import DrafterSpec, FeatureHeadDrafter, PromptLookupDrafter
from hf_metasd.errors import InvalidPoolTypeError, MetaSDTypeError
from hf_metasd.feature_head import (
    FeatureHead,
    adapter_names,
    add_adapter,
    load_adapter,
    load_feature_head,
    save_adapter,
    save_feature_head,
    save_head,
    set_active_adapter,
)
from hf_metasd.feature_head.adapters import adapter_lock
from hf_metasd.pool import DrafterPool

MAX_NEW = 20
PROMPTS = prompts(4, seed=78)
_ADAPTED: dict[int, FeatureHead] = {}


def with_adapters(target, seed: int = 0, sigma: float = 0.2) -> FeatureHead:
    """A copy of `trained_head(target)` (sharing the target's embedding) with adapters ``code`` (the default modules,
    rank 4) and ``math`` (``q_proj``, ``v_proj``, ``fc``, rank 2) whose ``lora_B`` is random, so that each adapter
    drafts otherwise than the base head; in eval mode, on the base head, frozen."""
    base = trained_head(target)
    head = FeatureHead(base.config, target.get_input_embeddings())
    head.load_state_dict(base.state_dict())
    add_adapter(head, "code", r=4)
    add_adapter(head, "math", r=2, target_modules=["q_proj", "v_proj", "fc"])
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in head.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=g) * sigma)
    set_active_adapter(head, None)
    return head.eval().requires_grad_(False)


def adapter_arms(target) -> list[FeatureHeadDrafter]:
    """The base head and its two adapters as three arms of one pool (cached per target): the `feature_head` entry of
    ``tests/test_drafters.py::FACTORIES``."""
    if id(target) not in _ADAPTED:
        _ADAPTED[id(target)] = with_adapters(target)
    return FeatureHeadDrafter.arms(_ADAPTED[id(target)])


def _features(target, head, ids):
    """The target's features at the head's layers for `ids` (1, L) and the ids that follow each position."""
    from hf_metasd.feature_head import FeatureRecorder

    with torch.no_grad(), FeatureRecorder(target, head.config.layer_ids) as recorder:
        target(ids)
    return recorder.features()[:, :-1], ids[:, 1:]


def _drafts(target, arm, ids, n: int = 3):
    """What `arm` drafts after `ids` once it observed the features of every position but the last."""
    arm = arm.spawn(target)
    features, next_ids = _features(target, arm.head, ids)
    arm.observe(features, next_ids, 0)
    with arm.in_use():
        return arm.draft(ids, n)


@pytest.fixture(scope="module")
def references(target):
    return [greedy(target, p, MAX_NEW) for p in PROMPTS]


# ---------------------------------------------------------------------------------------------------------------------
# arms on one head
# ---------------------------------------------------------------------------------------------------------------------
def test_each_arm_drafts_with_its_own_adapter_and_the_base_arm_with_none(target):
    arms = adapter_arms(target)
    head = arms[0].head
    assert [(a.name, a.adapter) for a in arms] == [("feature_head", None), ("code", "code"), ("math", "math")]
    assert all(a.head is head for a in arms)
    ids = greedy(target, PROMPTS[0], 8)
    drafted = [_drafts(target, arm, ids)[1] for arm in arms]
    torch.testing.assert_close(drafted[0], _drafts(target, FeatureHeadDrafter(trained_head(target)), ids)[1])
    for adapter, logits in zip(["code", "math"], drafted[1:]):
        assert not torch.allclose(logits, drafted[0])  # the adapter changes the draft ...
        reference = FeatureHead(head.config, head.embedding)
        reference.load_state_dict(head.base_state_dict())
        with torch.no_grad():  # ... into what the head with that adapter merged into its weights drafts
            for path, module in head.named_modules():
                if adapter in getattr(module, "lora_A", {}):
                    delta = module.lora_B[adapter].weight @ module.lora_A[adapter].weight * module.scaling[adapter]
                    reference.get_submodule(path).weight += delta
        torch.testing.assert_close(logits, _drafts(target, FeatureHeadDrafter(reference.eval()), ids)[1])


@pytest.mark.parametrize("entry", ["custom_generate", "enable"])
def test_greedy_output_is_the_targets_with_the_base_head_and_two_adapters(target, references, entry):
    """Round robin over the base head and two adapters: every arm drafts, the output is plain generate's, and the
    user's head comes back on the adapter, training flags and trainable parameters it had."""
    head = with_adapters(target)
    set_active_adapter(head, "math", trainable=True)
    head.train()
    pool = FeatureHeadDrafter.arms(head)
    drafted, accepted = [0, 0, 0], 0
    for prompt, reference in zip(PROMPTS, references):
        kwargs = {"assistant_models": pool, "meta_policy": "round_robin", "return_dict_in_generate": True}
        if entry == "enable":
            hf_metasd.enable()
            out = target.generate(prompt, do_sample=False, max_new_tokens=MAX_NEW, **kwargs)
        else:
            out = metasd_greedy(target, prompt, MAX_NEW, **kwargs)
        assert torch.equal(out.sequences, reference)
        assert out.metasd.drafter_names == ["feature_head", "code", "math", "no_draft"]
        for arm, n in zip(out.metasd.arms, out.metasd.drafted):
            if arm < 3:  # not the fallback
                drafted[arm] += n
        accepted += sum(out.metasd.accepted)
    assert min(drafted) > 0 and accepted > 0
    layers = [m for m in head.modules() if hasattr(m, "lora_A")]
    assert all(m.active_adapters == ["math"] and not m.disable_adapters for m in layers)
    assert head.training and all(m.training for m in head.modules())
    trainable = sorted(n for n, p in head.named_parameters() if p.requires_grad)
    assert trainable and all(".math." in n for n in trainable)


def test_an_arm_drafts_under_the_heads_lock_with_its_adapter_active(target):
    """While an arm's head runs, another thread cannot take the head's lock, and the arm's adapter is the active one
    (without the lock, another call could switch the adapter between two steps of a draft)."""
    arms = adapter_arms(target)
    head = arms[0].head
    seen = []

    def try_lock(taken: list) -> None:
        taken.append(adapter_lock(head).acquire(timeout=0))
        if taken[-1]:  # (only when the test fails) give it back before this thread ends
            adapter_lock(head).release()

    def hook(module, args):
        taken = []
        thread = threading.Thread(target=try_lock, args=(taken,))
        thread.start()
        thread.join()
        layer = head.layers[0].self_attn.q_proj
        seen.append((taken[0], None if layer.disable_adapters else layer.active_adapters[0]))

    handle = head.layers[0].self_attn.register_forward_pre_hook(hook)
    try:
        ids = greedy(target, PROMPTS[1], 6)
        for arm in [arms[1], arms[0], arms[2], arms[1]]:
            seen.clear()
            _drafts(target, arm, ids)
            assert seen == [(False, arm.adapter)] * 3  # one pass per drafted token
    finally:
        handle.remove()


def test_concurrent_calls_on_different_arms_draft_what_each_drafts_alone(target):
    arms = adapter_arms(target)
    ids = greedy(target, PROMPTS[2], 8)
    alone = [_drafts(target, arm, ids)[1] for arm in arms]
    errors: list[str] = []

    def run(i: int) -> None:
        for _ in range(15):
            if not torch.equal(_drafts(target, arms[i], ids)[1], alone[i]):
                errors.append(arms[i].name)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


# ---------------------------------------------------------------------------------------------------------------------
# files and the pool round trip
# ---------------------------------------------------------------------------------------------------------------------
def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_a_pool_with_the_base_head_and_two_adapters_round_trips(target, references, tmp_path):
    arms = adapter_arms(target)
    pool = DrafterPool([*arms, PromptLookupDrafter()], target=target)
    pool.save_pretrained(tmp_path / "a")  # no store_weights needed: the head and its adapters are always stored
    head_files = ["feature_head_config.json", "feature_head.safetensors"]
    adapter_files = [f"adapters/{a}/{f}" for a in ("code", "math") for f in ("adapter_config.json", "adapter_model.safetensors")]  # fmt: skip
    assert _files(tmp_path / "a") == sorted(
        ["README.md", "config.json", *[f"feature_head/feature_head/{f}" for f in head_files + adapter_files]]
    )
    specs = json.loads((tmp_path / "a/config.json").read_text())["drafters"][:3]
    assert [(s["name"], s["path"], s["params"]) for s in specs] == [
        ("feature_head", "feature_head/feature_head", {}),
        ("code", "feature_head/feature_head", {"adapter": "code"}),
        ("math", "feature_head/feature_head", {"adapter": "math"}),
    ]
    loaded = DrafterPool.from_pretrained(tmp_path / "a", target=target)
    head = loaded.drafters[0].head
    assert all(d.head is head for d in loaded.drafters[:3]) and adapter_names(head) == ["code", "math"]
    assert head.embedding is target.get_input_embeddings()
    assert not any(p.requires_grad for n, p in head.named_parameters() if "lora_" in n)  # loaded frozen
    ids = greedy(target, PROMPTS[0], 8)
    for mine, theirs in zip(loaded.drafters[:3], arms):
        assert (mine.name, mine.adapter) == (theirs.name, theirs.adapter)
        torch.testing.assert_close(_drafts(target, mine, ids), _drafts(target, theirs, ids))
    for prompt, reference in zip(PROMPTS, references):
        out = metasd_greedy(target, prompt, MAX_NEW, assistant_models=loaded, meta_policy="round_robin")
        assert torch.equal(out, reference)
    loaded.save_pretrained(tmp_path / "b")
    assert (tmp_path / "a/config.json").read_text() == (tmp_path / "b/config.json").read_text()
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    # the stored head is the base head alone: it loads without its adapters, as the head it was built from
    plain = load_feature_head(tmp_path / "a/feature_head/feature_head", target)
    assert plain.state_dict().keys() == trained_head(target).state_dict().keys() and not adapter_names(plain)


def test_save_and_load_adapter_keep_the_heads_state(target, tmp_path):
    head = with_adapters(target)
    save_adapter(head, "math", tmp_path / "math")
    config = json.loads((tmp_path / "math/adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["target_modules"]) == ("LORA", 2, ["fc", "q_proj", "v_proj"])
    assert sorted(load_file(tmp_path / "math/adapter_model.safetensors")) == [
        f"{path}.lora_{ab}.weight" for path in ("fc", "layers.0.self_attn.q_proj", "layers.0.self_attn.v_proj")
        for ab in "AB"
    ]  # fmt: skip
    fresh = with_adapters(target, seed=1)  # another head, on adapter "code", its own weights trainable
    set_active_adapter(fresh, "code")
    flags = {n: p.requires_grad for n, p in fresh.named_parameters()}
    load_adapter(fresh, tmp_path / "math", "other")
    assert adapter_names(fresh) == ["code", "math", "other"]
    assert all(m.active_adapters == ["code"] for m in fresh.modules() if hasattr(m, "lora_A"))
    assert {n: p.requires_grad for n, p in fresh.named_parameters() if n in flags} == flags
    assert not any(p.requires_grad for n, p in fresh.named_parameters() if ".other." in n)
    ids = greedy(target, PROMPTS[3], 8)
    other = FeatureHeadDrafter(fresh, adapter="other")
    torch.testing.assert_close(
        _drafts(target, other, ids), _drafts(target, FeatureHeadDrafter(head, adapter="math"), ids)
    )


def test_a_head_with_adapters_saves_its_own_weights_only(target, tmp_path):
    head = with_adapters(target)
    save_feature_head(head, tmp_path)
    assert load_file(tmp_path / "feature_head.safetensors").keys() == trained_head(target).state_dict().keys()
    # two fused layers: vLLM's reader fuses 3, so the speculators layout asks for `for_vllm=False`
    save_head(head, tmp_path / "speculators", layout="speculators", for_vllm=False)
    for folder in (tmp_path, tmp_path / "speculators"):
        for name, tensor in load_feature_head(folder, target).state_dict().items():
            torch.testing.assert_close(tensor, trained_head(target).state_dict()[name])


# ---------------------------------------------------------------------------------------------------------------------
# untrusted adapter files
# ---------------------------------------------------------------------------------------------------------------------
def _edit_config(**changes):
    def edit(folder: Path) -> None:
        data = json.loads((folder / "adapter_config.json").read_text())
        data.update(changes)
        (folder / "adapter_config.json").write_text(json.dumps(data))

    return edit


def _edit_tensors(edit_state):
    def edit(folder: Path) -> None:
        state = load_file(folder / "adapter_model.safetensors")
        edit_state(state)
        save_file(state, folder / "adapter_model.safetensors")

    return edit


def _pickled(folder: Path) -> None:
    (folder / "adapter_model.safetensors").rename(folder / "adapter_model.bin")


Q_A = "layers.0.self_attn.q_proj.lora_A.weight"
BAD_FILES = {
    "pickled": (_pickled, InvalidPoolError, r"the feature-head adapter 'x' must find adapter_model\.safetensors in "
                r"'.*', but it is missing \(a pool reads safetensors only, never pickles\)\. Re-save the adapter"),
    "not LoRA": (_edit_config(peft_type="LOHA"), InvalidPoolError, r'`peft_type` in .* must be "LORA", but is '
                 r"'LOHA'\. Use a LoRA adapter\."),
    "huge rank": (_edit_config(r=10**6), InvalidPoolError, r"`r` in '.*adapter_config\.json' must be an int in "
                  r"\[1, 256\], but is 1000000\. Re-save the adapter with `hf_metasd\.feature_head\.save_adapter`"),
    "rank as text": (_edit_config(r="4"), InvalidPoolTypeError, r"`r` in .* must be an int in \[1, 256\], but is '4'"),
    "huge alpha": (_edit_config(lora_alpha=1e9), InvalidPoolError, r"`lora_alpha` in .* must be a number in "
                   r"\(0, 4096\], but is 1000000000\.0\."),
    "lm_head": (_edit_config(target_modules=["q_proj", "lm_head"]), InvalidPoolError, r"`target_modules` in .* must "
                r"be a list of distinct modules among \['q_proj', .*'fc'\], but is \['q_proj', 'lm_head'\]\."),
    "regex modules": (_edit_config(target_modules=".*"), InvalidPoolError, r"`target_modules` in .* but is '\.\*'"),
    "DoRA": (_edit_config(use_dora=True), InvalidPoolError, r"`use_dora` in .* must be false \(plain LoRA on a "
             r"feature head\), but is true\. Train the adapter with hf_metasd's `add_adapter`, or set `use_dora` to "
             r"false\."),
    "code": (_edit_config(auto_mapping={"base_model_class": "Evil"}), InvalidPoolError, r"`auto_mapping` in .* must "
             r'be null .*, but is \{"base_model_class": "Evil"\}'),
    "bias": (_edit_config(bias="all"), InvalidPoolError, r'`bias` in .* must be "none" .*, but is "all"\.'),
    "not JSON": (lambda f: (f / "adapter_config.json").write_text("{"), InvalidPoolError, r"the feature-head adapter "
                 r"'x' must find valid JSON at '.*adapter_config\.json', but it is not \(JSONDecodeError"),
    "rank of the tensors": (_edit_tensors(lambda s: s.update({Q_A: s[Q_A][:1]})), InvalidPoolError,
                            rf"`{Q_A}` in 'adapter_model\.safetensors' must have shape \(2, 64\) and a dtype in "
                            r"\['BF16', 'F16', 'F32', 'F64'\] for this config, but has shape \(1, 64\)"),
    "extra tensor": (_edit_tensors(lambda s: s.update({"lm_head.lora_A.weight": torch.zeros(2, 32)})),
                     InvalidPoolError, r"the weights of feature-head adapter 'x' must hold only the tensors of its "
                     r"config, but also hold \['lm_head\.lora_A\.weight'\]\. Save the adapter's `target_modules`"),
    "not an object": (lambda f: (f / "adapter_config.json").write_text("[]"), InvalidPoolTypeError, r"the adapter "
                      r"settings in '.*' must be a JSON object, but are list\."),
    "dropout": (_edit_config(lora_dropout=1.5), InvalidPoolError, r"`lora_dropout` in .* must be a number in \[0, 1\), "
                r"but is 1\.5\."),
    "rslora": (_edit_config(use_rslora="yes"), InvalidPoolTypeError, r"`use_rslora` in .* must be true or false, but "
               r"is 'yes'\."),
    "missing tensor": (_edit_tensors(lambda s: s.pop(Q_A)), InvalidPoolError, r"the weights of feature-head adapter "
                       rf"'x' are missing tensors \['{Q_A}'\]\."),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_adapter_files_are_refused_before_the_head_changes(target, tmp_path, case):
    edit, error, match = BAD_FILES[case]
    save_adapter(with_adapters(target), "math", tmp_path)
    edit(tmp_path)
    head = with_adapters(target)
    before = sorted(head.state_dict())
    with pytest.raises(error, match=match):
        load_adapter(head, tmp_path, "x")
    assert adapter_names(head) == ["code", "math"] and sorted(head.state_dict()) == before


def test_unknown_adapter_settings_load_with_one_warning(target, tmp_path):
    save_adapter(with_adapters(target), "code", tmp_path)
    _edit_config(new_knob=None, other_knob=1)(tmp_path)
    head = with_adapters(target)
    with pytest.warns(
        UserWarning, match=r"have keys this peft version does not know, ignored: \['new_knob', 'oth"
    ) as w:
        load_adapter(head, tmp_path, "x")
    assert len(w) == 1
    assert adapter_names(head) == ["code", "math", "x"]


def test_a_pool_refuses_a_bad_or_missing_adapter(target, tmp_path):
    DrafterPool(adapter_arms(target), target=target).save_pretrained(tmp_path)
    adapter = tmp_path / "feature_head/feature_head/adapters/code"
    _edit_config(use_dora=True)(adapter)
    with pytest.raises(InvalidPoolError, match=r"`use_dora` in '.*adapters/code/adapter_config\.json' must be false"):
        DrafterPool.from_pretrained(tmp_path, target=target)
    for file in adapter.iterdir():
        file.unlink()
    with pytest.raises(InvalidPoolError, match=r"adapter 'code' must find adapter_config\.json in '.*adapters/code'"):
        DrafterPool.from_pretrained(tmp_path, target=target)
    config = json.loads((tmp_path / "config.json").read_text())
    config["drafters"][1]["params"]["adapter"] = "../../elsewhere"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        InvalidPoolError,
        match=r"drafter 'code' \(drafters\[1\]\) `params\.adapter` must be an adapter name of 1 to 64 letters, "
        r"digits, `_` or `-`, but is '\.\./\.\./elsewhere'\.",
    ):
        DrafterPool.from_pretrained(tmp_path, target=target)
    spec = DrafterSpec("feature_head", "c", path="p", stored=True, params={"adapter": "code"})
    FeatureHeadDrafter.validate_spec(spec, "drafter 'c'")  # the fix: a plain name


# ---------------------------------------------------------------------------------------------------------------------
# argument errors
# ---------------------------------------------------------------------------------------------------------------------
def test_adapter_arguments_are_checked_before_the_head_changes(target):
    head = with_adapters(target)
    cases = [
        ({"name": "a/b"}, MetaSDConfigError, r"`name` must be an adapter name of 1 to 64 letters, digits, `_` or `-`, "
         r"but is 'a/b'\. Use e\.g\. \"code\"\."),
        ({"name": "code"}, MetaSDConfigError, r"`name` must be a new adapter of the head, but 'code' is already one of "
         r"\['code', 'math'\]\. Pick another name\."),
        ({"r": 0}, MetaSDConfigError, r"`r` must be an int in \[1, 256\], but is 0\. Fix the argument of `add_adapter`"),
        ({"r": 2.0}, MetaSDTypeError, r"`r` must be an int in \[1, 256\], but is 2\.0\."),
        ({"lora_alpha": -1}, MetaSDConfigError, r"`lora_alpha` must be a number in \(0, 4096\], but is -1\."),
        ({"target_modules": ["lm_head"]}, MetaSDConfigError, r"`target_modules` must be a list of distinct modules"),
        ({"target_modules": ["q_proj", "q_proj"]}, MetaSDConfigError, r"`target_modules` must be a list of distinct"),
    ]  # fmt: skip
    for change, error, match in cases:
        with pytest.raises(error, match=match):
            add_adapter(head, **{"name": "new", **change})
    assert adapter_names(head) == ["code", "math"]
    add_adapter(head, "new", r=2, target_modules=["o_proj"])  # the fix
    with pytest.raises(
        MetaSDConfigError,
        match=r"`adapter` must be one of the head's adapters \['code', 'math', 'new'\] or None \(the base head\), "
        r"but is 'chat'\. Add it with `add_adapter` or load it with `load_adapter` first\.",
    ):
        set_active_adapter(head, "chat")
    with pytest.raises(
        DrafterCompatibilityError,
        match=r"`adapter` must be one of the head's adapters \['code', 'math', 'new'\] or None \(the base head\), "
        r"but is 'chat'\. Add it with `hf_metasd\.feature_head\.add_adapter` or load it with `load_adapter`\.",
    ):
        FeatureHeadDrafter(head, adapter="chat")
    with pytest.raises(MetaSDConfigError, match=r"`name` must be one of the head's adapters \[.*\], but is 'chat'\."):
        save_adapter(head, "chat", "unused")


def test_an_adapter_a_load_would_refuse_is_refused_when_saved(target, tmp_path):
    """peft can inject an adapter anywhere; one on `lm_head` cannot be loaded back, so it is not saved either."""
    head = with_adapters(target)
    with pytest.warns(UserWarning, match="Already found a `peft_config` attribute"):  # peft's, on a second adapter
        inject_adapter_in_model(LoraConfig(r=2, target_modules=["lm_head"]), head, adapter_name="vocab")
    with pytest.raises(
        MetaSDConfigError, match=r"`target_modules` of adapter 'vocab' must be a list of distinct modules among"
    ):
        save_adapter(head, "vocab", tmp_path / "vocab")
    pool = DrafterPool([FeatureHeadDrafter(head, adapter="vocab")], target=target)
    with pytest.raises(
        InvalidPoolError,
        match=r"`target_modules` of adapter 'vocab' of drafter 'vocab' \(drafters\[0\]\) must be a list of distinct "
        r"modules among \[.*\], but is \['lm_head'\]\. Add the adapter with `hf_metasd\.feature_head\.add_adapter`",
    ):
        pool.save_pretrained(tmp_path / "pool")
    assert not (tmp_path / "vocab").exists() and not (tmp_path / "pool").exists()


# ---------------------------------------------------------------------------------------------------------------------
# the recipe: --lora-task
# ---------------------------------------------------------------------------------------------------------------------
def test_train_feature_head_trains_one_adapter_per_task_on_that_tasks_sequences(tmp_path, capsys):
    train = recipe("pools.train_feature_head")
    target = sharpen(tiny_llama(0, layers=4))
    stores = tmp_path / "stores"
    stores.mkdir()
    _feature_head_stores(stores, target)
    common = ["--stores", str(stores), "--work-dir", str(tmp_path / "work"), "--val-sequences", "2", "--threads", "1"]
    common += ["--tasks", "code", "qa", "--chunk-sequences", "5", "--batch-size", "4", "--lr", "2e-2"]
    train.main([*common, "--out", str(tmp_path / "head"), "--layer-ids", "1", "2", "4", "--draft-vocab-size", "64",
                "--intermediate-size", "64", "--epochs", "2"], target=target)  # fmt: skip
    settings = json.loads((tmp_path / "work/features.json").read_text())["settings"]
    assert settings["sequence_tasks"] == {"train": [["code", 8], ["qa", 8]], "val": [["code", 2], ["qa", 2]]}
    chunk_tasks = train.chunk_tasks(tmp_path / "work", "train")
    assert chunk_tasks["train-00001.safetensors"] == ["code"] * 3 + ["qa"] * 2
    rows = train.read_stores(stores, ["code", "qa"], None, 2)["train"]
    batches = list(train.batches(tmp_path / "work", "train", 4, None, "code"))  # the code sequences, and only them
    ids = [b["input_ids"][i, :n].tolist() for b in batches for i, n in enumerate(b["lengths"].tolist())]
    assert ids == [p + a for task, p, a in rows if task == "code"]
    assert train.count_batches(tmp_path / "work", "train", 4, "code") == len(batches) == 3

    lora = [*common, "--base-head", str(tmp_path / "head"), "--out", str(tmp_path / "adapted"), "--epochs", "10"]
    stamps = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "work").glob("*.safetensors")}
    record = train.main([*lora, "--lora-task", "code", "--lora-rank", "8"], target=target)
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "work").glob("*.safetensors")} == stamps  # reused
    code = record["tasks"]["code"]
    assert code["sequences"] == {"train": 8, "val": 2}
    last, base = code["epochs"][-1], code["base"]  # the adapter learns its task, and it carries to held-out sequences
    assert last["train_loss"] < code["epochs"][0]["train_loss"] - 1 and last["val_loss"] < base["val_loss"]
    assert last["agreement_step0"] + last["agreement_step1"] > base["agreement_step0"] + base["agreement_step1"] + 0.1
    gain, se = code["paired_step0"]  # kept: its step-0 gain is beyond two standard errors of the paired difference
    assert gain == pytest.approx(last["agreement_step0"] - base["agreement_step0"]) and gain > 2 * se
    assert code["kept"] is True and len(code["paired_conditional_step1"]) == 2
    assert _files(tmp_path / "adapted") == [
        "adapters/code/adapter_config.json", "adapters/code/adapter_model.safetensors", "feature_head.safetensors",
        "feature_head_config.json", "training_record.json",
    ]  # fmt: skip
    base = load_file(tmp_path / "head/feature_head.safetensors")  # the head was frozen
    assert all(torch.equal(t, base[n]) for n, t in load_file(tmp_path / "adapted/feature_head.safetensors").items())
    # a pool from the base head and the adapter: lossless, and the adapter drafts as it did when it was evaluated
    head = load_feature_head(tmp_path / "adapted", target)
    load_adapter(head, tmp_path / "adapted/adapters/code", "code")
    args = train.parse_args([*lora, "--lora-task", "code"])
    set_active_adapter(head, "code")
    assert train.evaluate(head, tmp_path / "work", args, "code")["agreement_step0"] == pytest.approx(
        code["epochs"][-1]["agreement_step0"]
    )
    for prompt in prompts(2, seed=5):
        out = metasd_greedy(target, prompt, 12, assistant_models=FeatureHeadDrafter.arms(head))
        assert torch.equal(out, greedy(target, prompt, 12))

    # a cache written before the tasks were recorded is reused once its sequences are checked to be in order
    meta = json.loads((tmp_path / "work/features.json").read_text())
    del meta["settings"]["sequence_tasks"]
    (tmp_path / "work/features.json").write_text(json.dumps(meta))
    capsys.readouterr()
    train.main([*lora, "--lora-task", "qa", "--epochs", "1"], target=target)
    assert "reusing" in capsys.readouterr().out and "sequence_tasks" in (tmp_path / "work/features.json").read_text()
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "work").glob("*.safetensors")} == stamps
    del meta["settings"]["tasks"]  # ... and not when its order is another (tasks read in another order)
    meta["settings"]["tasks"] = ["code", "qa"]
    (tmp_path / "work/features.json").write_text(json.dumps(meta))
    assert not train.cached_in_order(tmp_path / "work", train.read_stores(stores, ["qa", "code"], None, 2))

    # an adapter that does not beat the base head beyond the noise is reported and dropped, not saved
    capsys.readouterr()
    dropped = train.main([*lora, "--out", str(tmp_path / "dropped"), "--lora-task", "qa", "--lr", "1e-12"],
                         target=target)  # fmt: skip
    qa = dropped["tasks"]["qa"]
    assert qa["kept"] is False and qa["paired_step0"] == [0.0, 0.0]
    assert qa["epochs"][-1]["agreement_step0"] == qa["base"]["agreement_step0"]
    assert "qa: step 0 " in (out := capsys.readouterr().out) and "dropped (not above 2 standard errors)" in out
    assert "saved the head, adapters/{} and" in out
    assert _files(tmp_path / "dropped") == ["feature_head.safetensors", "feature_head_config.json",
                                            "training_record.json"]  # fmt: skip

    torch.save({"prompts": [[1, 2]] * 2, "outputs": [[3, 4]] * 2}, stores / "math.pt")  # held-out sequences only
    with pytest.raises(
        SystemExit,
        match=r"`--lora-task` 'math' must have training and held-out sequences, but has "
        r"\{'train': 0, 'val': 2\}\. Pass a task whose store holds more than `--val-sequences`",
    ):
        train.main([*lora, "--tasks", "code", "math", "--lora-task", "math"], target=target)  # fmt: skip
    with pytest.raises(SystemExit):
        train.parse_args([*common, "--lora-task", "code"])
    assert "`--lora-task` must come with `--base-head DIR`" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train.parse_args([*lora, "--lora-task", "chat"])
    assert "`--lora-task` must name tasks of `--tasks`" in capsys.readouterr().err
