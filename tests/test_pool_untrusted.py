"""A pool is data, never code, and bounded (hf_metasd.untrusted): crafted pools that ask for code, set huge
numbers, reach for files outside the pool, carry broken or slow tokenizers, or crash a parser. Each one is refused
with `InvalidPoolError` naming the file and what to do: nothing runs, nothing reads stdin, nothing takes long. No
network."""

from __future__ import annotations

import builtins
import json
import pickle
import shutil
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import VOCAB, sharpen, tiny_llama
from peft import LoraConfig, get_peft_model
from test_other_tokenizer import merged_drafter, permuted_tokenizer
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from hf_metasd.drafters import LoraDrafter, ModelDrafter
from hf_metasd.drafters.load import LoadContext
from hf_metasd.errors import InvalidPoolError
from hf_metasd.pool import DrafterPool, DrafterPoolConfig, DrafterSpec
from hf_metasd.untrusted import check_links, is_safe_pattern


class StdinRead(BaseException):
    """Raised when anything asks on stdin: a `BaseException`, so that no ``except Exception`` can hide it."""


@pytest.fixture
def no_stdin(monkeypatch):
    """transformers asks "Do you wish to run the custom code? [y/N]" through `input`: any read fails the test."""

    class NoStdin:
        def __getattr__(self, name):
            raise StdinRead(f"something read sys.stdin.{name}")

    def refuse(*args, **kwargs):
        raise StdinRead(f"something asked on stdin: {args}")

    monkeypatch.setattr(builtins, "input", refuse)
    monkeypatch.setattr(sys, "stdin", NoStdin())


pytestmark = pytest.mark.usefixtures("no_network", "no_stdin")

#: Python that a pool would like to run: it leaves a marker file when imported (or unpickled).
EVIL = "from pathlib import Path\nPath({marker!r}).write_text('ran')\nclass EvilConfig: pass\nclass EvilModel: pass\n"


class Evil:
    """A pickle that writes the marker file when loaded without `weights_only`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _prompt_lookup_pool(folder: Path, **top) -> Path:
    """A model-free pool written as a file (the checks below happen before anything else is read)."""
    config = DrafterPoolConfig([DrafterSpec("prompt_lookup", "pl")], num_assistant_tokens=3)
    config.save(folder)
    _edit_json(folder / "config.json", lambda d: d.update(top))
    return folder


@pytest.fixture
def model_pool(target, tmp_path):
    """A pool storing a small assistant model (``drafters/small/``)."""
    DrafterPool([ModelDrafter(sharpen(tiny_llama(13, layers=1)), name="small")], target=target).save_pretrained(
        tmp_path / "model_pool", store_weights=True
    )
    return tmp_path / "model_pool"


@pytest.fixture
def lora_pool(target, tmp_path):
    """A pool storing a LoRA base and its adapter ``qa`` (``lora/qa/base/``, ``lora/qa/adapters/qa/``)."""
    torch.manual_seed(2)
    lora = LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False)
    peft_model = get_peft_model(sharpen(tiny_llama(4, layers=1)), lora, adapter_name="qa")
    DrafterPool(LoraDrafter.from_peft_model(peft_model), target=target).save_pretrained(
        tmp_path / "lora_pool", store_weights=True
    )
    return tmp_path / "lora_pool"


@pytest.fixture
def tokenizer_pool(target, tmp_path):
    """A pool storing a drafter with its own tokenizer (``drafters/a/tokenizer/``) and the target's tokenizer
    (``tokenizers/target/``), which then loads without ``tokenizer=``."""
    DrafterPool([merged_drafter(name="a")], target=target).save_pretrained(tmp_path / "tok_pool", store_weights=True)
    return tmp_path / "tok_pool"


# ---------------------------------------------------------------------------------------------------------------------
# code: nothing a pool holds ever runs, and nothing asks on stdin
# ---------------------------------------------------------------------------------------------------------------------
AUTO_MAP = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
ASKING_FOR_CODE = {
    "model config, unknown model_type": ("drafters/small/config.json", {"model_type": "evil", "auto_map": AUTO_MAP}),
    "model config, known model_type": ("drafters/small/config.json", {"auto_map": AUTO_MAP}),
    "adapter config": ("lora/qa/adapters/qa/adapter_config.json", {"auto_map": AUTO_MAP}),
    "drafter tokenizer config": (
        "drafters/a/tokenizer/tokenizer_config.json",
        {"tokenizer_class": "EvilTokenizer", "auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]}},
    ),
    "target tokenizer config": (
        "tokenizers/target/tokenizer_config.json",
        {"tokenizer_class": "EvilTokenizer", "auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]}},
    ),
}


@pytest.mark.parametrize("case", sorted(ASKING_FOR_CODE))
def test_a_file_that_asks_for_code_is_refused_and_nothing_runs(request, tmp_path, case):
    file, edit = ASKING_FOR_CODE[case]
    fixture = (
        "model_pool" if file.startswith("drafters/small") else "lora_pool" if "lora" in file else "tokenizer_pool"
    )
    pool = request.getfixturevalue(fixture)
    marker = tmp_path / "marker"
    _edit_json(pool / file, lambda d: d.update(edit))
    (pool / file).parent.joinpath("evil.py").write_text(EVIL.format(marker=str(marker)))
    with pytest.raises(
        InvalidPoolError,
        match=rf"must not ask for code, but '.*{file}' has `auto_map` .* hf_metasd loads with "
        r"`trust_remote_code=False` and refuses such files",
    ):
        DrafterPool.from_pretrained(pool, target=request.getfixturevalue("target"))
    assert not marker.exists()


@pytest.mark.parametrize("key", ["trust_remote_code", "class_path"])
def test_code_keys_in_params_are_refused_not_ignored(target, model_pool, key):
    _edit_json(model_pool / "config.json", lambda d: d["drafters"][0]["params"].update({key: True}))
    with pytest.raises(
        InvalidPoolError,
        match=rf"drafter 'small' \(drafters\[0\]\) `params` must not hold `{key}` \(a pool is data: hf_metasd never "
        rf"runs code from it\), but holds {key}=True\. Remove the key",
    ):
        DrafterPool.from_pretrained(model_pool, target=target)


def test_every_load_passes_trust_remote_code_false(target, tokenizer_pool, lora_pool, tmp_path, monkeypatch):
    """Spy on the transformers entry points hf_metasd calls: a stored model, a LoRA base, two tokenizers, a referenced
    model (mapped by the caller)."""
    calls = []

    def spy(owner, name):
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            if sys._getframe(1).f_globals.get("__name__", "").startswith("hf_metasd"):
                calls.append((f"{owner.__name__}.{name}", kwargs.get("trust_remote_code", "missing")))
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    for owner, name in [
        (AutoConfig, "from_pretrained"),
        (AutoModelForCausalLM, "from_pretrained"),
        (AutoModelForCausalLM, "from_config"),
        (AutoTokenizer, "from_pretrained"),
    ]:
        spy(owner, name)
    DrafterPool.from_pretrained(tokenizer_pool, target=target)
    DrafterPool.from_pretrained(lora_pool, target=target)
    sharpen(tiny_llama(14, layers=1)).save_pretrained(tmp_path / "drafter")
    pool = DrafterPool([AutoModelForCausalLM.from_pretrained(tmp_path / "drafter")], target=target)
    pool.save_pretrained(tmp_path / "ref")
    DrafterPool.from_pretrained(
        tmp_path / "ref", target=target, local_paths={str(tmp_path / "drafter"): tmp_path / "drafter"}
    )
    assert {name for name, _ in calls} == {
        "AutoConfig.from_pretrained",
        "AutoModelForCausalLM.from_pretrained",
        "AutoModelForCausalLM.from_config",
        "AutoTokenizer.from_pretrained",
    }
    assert all(flag is False for _, flag in calls), calls


# ---------------------------------------------------------------------------------------------------------------------
# bounds: every number of config.json has a range, checked on load
# ---------------------------------------------------------------------------------------------------------------------
def test_a_huge_draft_length_is_refused_at_once(target, tmp_path):
    pool = _prompt_lookup_pool(tmp_path / "pool", num_assistant_tokens=10_000_000)
    started = time.perf_counter()
    with pytest.raises(
        InvalidPoolError,
        match=r"pool `num_assistant_tokens` must be at most 128, but is 10000000\. Use e\.g\. 3",
    ):
        DrafterPool.from_pretrained(pool, target=target)
    assert time.perf_counter() - started < 1.0
    _edit_json(pool / "config.json", lambda d: d.update(num_assistant_tokens=128))  # the longest allowed
    assert DrafterPool.from_pretrained(pool, target=target).num_assistant_tokens == 128


def _entry(kind: str, name: str, **fields) -> dict:
    return {"kind": kind, "name": name, "params": {}, **fields}


OUT_OF_RANGE = {
    "prior weight": (
        {"priors": {"pl": 0.5}, "prior_weight": 1e12},
        r"pool `prior_weight` must be at most 10000, but is 1000000000000\.0",
    ),
    "prior": ({"priors": {"pl": 5.0}}, r"pool `priors\['pl'\]` must be a float in \[0, 1\], but is 5\.0"),
    "policy setting": (
        {"policy_kwargs": {"beta": 1e300}},
        r"pool `policy_kwargs\['beta'\]` must be at most 1e\+06, but is 1e\+300",
    ),
    "policy setting nan": ({"policy_kwargs": {"beta": float("nan")}}, r"`policy_kwargs\['beta'\]` must be at most"),
    "n-gram size": (
        {"drafters": [_entry("prompt_lookup", "pl", params={"max_matching_ngram_size": 10**9})]},
        r"drafter 'pl' \(drafters\[0\]\) `params\.max_matching_ngram_size` must be at most 64, but is 1000000000",
    ),
    "prompt lookup tokens": (
        {"drafters": [_entry("prompt_lookup", "pl", params={"num_output_tokens": 10**9})]},
        r"`params\.num_output_tokens` must be at most 128",
    ),
    "occurrences": (
        {"drafters": [_entry("corpus", "c", path="corpus/c", stored=True, params={"max_occurrences": 10**9})]},
        r"drafter 'c' \(drafters\[0\]\) `params\.max_occurrences` must be at most 4096, but is 1000000000",
    ),
    "match length": (
        {"drafters": [_entry("corpus", "c", path="corpus/c", stored=True, params={"max_match_length": 10**9})]},
        r"`params\.max_match_length` must be at most 1024",
    ),
    "online store": (
        {"drafters": [_entry("corpus", "c", path="corpus/c", stored=True, params={"online_tokens": 10**12})]},
        r"`params\.online_tokens` must be at most 10000000, but is 1000000000000",
    ),
    "frequency": (
        {"drafters": [_entry("corpus", "c", path="corpus/c", stored=True, params={"min_frequency": 7})]},
        r"`params\.min_frequency` must be at most 1, but is 7",
    ),
    "lookbehind": (
        {"drafters": [_entry("other_tokenizer", "o", path="m", params={"tokenizer": "t", "lookbehind": 10**9})]},
        r"drafter 'o' \(drafters\[0\]\) `params\.lookbehind` must be at most 1024",
    ),
    "arms": (
        {"drafters": [_entry("prompt_lookup", f"pl{i}") for i in range(65)]},
        r"pool must hold at most 64 arms \(drafters, one per adapter of a `lora` entry\), but drafters\[:65\] already "
        r"hold 65\. Split the pool",
    ),
    "adapters": (
        {"drafters": [_entry("lora", "l", path="lora/l", stored=True, adapters=[f"a{i}" for i in range(100)])]},
        r"pool must hold at most 64 arms .* drafters\[:1\] already hold 100",
    ),
    "nesting": (
        {"policy_kwargs": {"beta": json.loads("[" * 40 + "]" * 40)}},
        r"config\.json must nest lists and objects at most 16 deep, but nests deeper",
    ),
}


@pytest.mark.parametrize("case", sorted(OUT_OF_RANGE))
def test_a_number_out_of_its_range_is_refused_on_load(target, tmp_path, case):
    top, match = OUT_OF_RANGE[case]
    pool = _prompt_lookup_pool(tmp_path / "pool", **top)
    with pytest.raises(InvalidPoolError, match=match):
        DrafterPool.from_pretrained(pool, target=target)


def test_a_head_with_more_ids_than_the_vocabulary_is_refused(target, model_pool):
    head = model_pool / "drafters/small/head_token_ids.json"
    head.write_text(json.dumps(list(range(VOCAB)) * 2))
    _edit_json(
        model_pool / "config.json",
        lambda d: d["drafters"][0]["params"].update(head_token_ids="drafters/small/head_token_ids.json"),
    )
    with pytest.raises(
        InvalidPoolError,
        match=rf"`head_token_ids` file '.*head_token_ids\.json' must hold at most the target's vocabulary size {VOCAB} "
        rf"ids, but holds {2 * VOCAB}",
    ):
        DrafterPool.from_pretrained(model_pool, target=target)
    head.write_text(json.dumps([VOCAB + 5]))  # an id outside the vocabulary: the constructor's check, named
    with pytest.raises(InvalidPoolError, match=r"must have `params` that `ModelDrafter` accepts, but .* fails: "):
        DrafterPool.from_pretrained(model_pool, target=target)


# ---------------------------------------------------------------------------------------------------------------------
# paths: a pool reads only its own files; the caller may allow others
# ---------------------------------------------------------------------------------------------------------------------
@pytest.fixture
def drafter_folder(tmp_path):
    sharpen(tiny_llama(14, layers=1)).save_pretrained(tmp_path / "drafter")
    return tmp_path / "drafter"


def _reference(pool: Path, path: str) -> None:
    _edit_json(pool / "config.json", lambda d: d["drafters"][0].update(stored=False, path=path))


def test_an_absolute_reference_is_refused_unless_the_caller_maps_it(target, model_pool, drafter_folder):
    _reference(model_pool, str(drafter_folder))
    with pytest.raises(
        InvalidPoolError,
        match=r"drafter 'small' \(drafters\[0\]\) `path` must be a Hub repo id or a folder stored in the pool, but is "
        r"'.*drafter', a local path outside the pool: a pool file may not make hf_metasd read local files\. If you "
        r"trust it, pass `DrafterPool\.from_pretrained\(\.\.\., local_paths=\{'.*drafter': '.*drafter'\}\)`",
    ):
        DrafterPool.from_pretrained(model_pool, target=target)
    loaded = DrafterPool.from_pretrained(model_pool, target=target, local_paths={str(drafter_folder): drafter_folder})
    assert loaded.drafters[0].source["path"] == str(drafter_folder)  # saved again, it stays the same reference


@pytest.mark.parametrize("path", ["../drafter", "~/drafter", "drafter"])
def test_a_relative_reference_resolved_from_the_current_directory_is_refused(
    target, model_pool, drafter_folder, monkeypatch, path
):
    """``../drafter`` from inside the pool, ``~/drafter`` from home, ``drafter`` (a Hub-like id that a folder of the
    current directory would shadow): each is read from the current directory, never from the pool."""
    monkeypatch.setenv("HOME", str(drafter_folder.parent))
    monkeypatch.chdir(model_pool if path.startswith("..") else drafter_folder.parent)
    _reference(model_pool.resolve(), path)
    with pytest.raises(InvalidPoolError, match=rf"`path` must be a Hub repo id .* but is '{path}', a local path"):
        DrafterPool.from_pretrained(model_pool.resolve(), target=target)


@pytest.mark.parametrize("relative", ["drafter", "./drafter"])
def test_a_drafter_loaded_from_a_relative_folder_is_saved_by_its_absolute_path(
    target, drafter_folder, tmp_path, monkeypatch, relative
):
    """Issue 50: the reference recorded ``drafter`` (the model's ``name_or_path``), relative to the working directory
    of the save: from another one it named a Hub repo, and from the same one it was refused as a local path whose
    `local_paths` key had to be that relative string. Recorded absolute, it is refused as a local path from anywhere
    until the caller maps it, and then loads from any working directory."""
    monkeypatch.chdir(drafter_folder.parent)
    pool = DrafterPool([AutoModelForCausalLM.from_pretrained(relative)], target=target)
    pool.save_pretrained("pool")
    spec = json.loads((tmp_path / "pool/config.json").read_text())["drafters"][0]
    assert (spec["path"], spec["stored"]) == (str(drafter_folder), False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with pytest.raises(InvalidPoolError, match=r"`path` must be a Hub repo id .* but is '.*drafter', a local path"):
        DrafterPool.from_pretrained(tmp_path / "pool", target=target)
    loaded = DrafterPool.from_pretrained(tmp_path / "pool", target=target, local_paths={spec["path"]: spec["path"]})
    assert loaded.drafters[0].source["path"] == str(drafter_folder)


def test_a_stored_path_climbing_out_is_refused(target, model_pool, drafter_folder):
    _edit_json(model_pool / "config.json", lambda d: d["drafters"][0].update(path="../drafter"))
    with pytest.raises(InvalidPoolError, match=r"`path` must be a relative path inside the pool folder"):
        DrafterPool.from_pretrained(model_pool, target=target)


def test_a_hub_model_that_asks_for_code_is_refused(target, model_pool, monkeypatch):
    """A referenced Hub model's config is not a pool file, but one with `auto_map` is refused all the same (with
    ``trust_remote_code=False`` transformers would load another class than the one it names)."""
    config = tiny_llama(14, layers=1).config
    config.auto_map = AUTO_MAP
    monkeypatch.setattr(AutoConfig, "from_pretrained", lambda name, **kwargs: config)
    _reference(model_pool, "org/drafter")
    with pytest.raises(
        InvalidPoolError,
        match=r"drafter 'small' \(drafters\[0\]\) must not ask for code, but 'org/drafter/config\.json' has "
        r"`auto_map` \{'AutoConfig': 'evil\.EvilConfig'",
    ):
        DrafterPool.from_pretrained(model_pool, target=target)


def test_hub_ids_stay_allowed_and_load_without_code(target, model_pool, monkeypatch):
    calls = []

    def offline(name, **kwargs):
        calls.append((str(name), kwargs.get("trust_remote_code")))
        raise OSError("offline in this test")

    monkeypatch.setattr(AutoConfig, "from_pretrained", offline)
    _reference(model_pool, "org/drafter")
    with pytest.raises(InvalidPoolError, match=r"must find a readable file at 'org/drafter/config\.json'.*offline"):
        DrafterPool.from_pretrained(model_pool, target=target)
    assert calls == [("org/drafter", False)]
    _reference(model_pool, "org/bad..id")
    with pytest.raises(
        InvalidPoolError, match=r"`path` must be a Hub repo id \(e\.g\. \"org/model\"\) .*'org/bad\.\.id'"
    ):
        DrafterPool.from_pretrained(model_pool, target=target)


def _outside_copy(path: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "outside" / path.name
    copy.parent.mkdir(exist_ok=True)
    (shutil.copytree if path.is_dir() else shutil.copy)(path, copy)
    return copy


@pytest.mark.parametrize("link", ["drafters/small", "drafters/small/model.safetensors", "config.json"])
def test_a_symbolic_link_leaving_the_pool_is_refused(target, model_pool, tmp_path, link):
    outside = _outside_copy(model_pool / link, tmp_path)
    (shutil.rmtree if (model_pool / link).is_dir() else Path.unlink)(model_pool / link)
    (model_pool / link).symlink_to(outside)
    with pytest.raises(
        InvalidPoolError,
        match=rf"pool file '.*{link}' must stay inside the pool folder '.*', but it is a symbolic link to "
        r"'.*outside.*' outside it\. A pool reads only its own files",
    ):
        DrafterPool.from_pretrained(model_pool, target=target)


def test_a_head_file_linked_outside_is_refused_and_links_inside_are_followed(target, model_pool, tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text("[1, 2, 3]")
    (model_pool / "head.json").symlink_to(secret)
    _edit_json(model_pool / "config.json", lambda d: d["drafters"][0]["params"].update(head_token_ids="head.json"))
    with pytest.raises(InvalidPoolError, match=r"pool file '.*head\.json' must stay inside the pool folder"):
        DrafterPool.from_pretrained(model_pool, target=target)
    (model_pool / "head.json").unlink()
    (model_pool / "ids.json").write_text("[1, 2, 3]")
    (model_pool / "head.json").symlink_to("ids.json")  # inside: followed
    loaded = DrafterPool.from_pretrained(model_pool, target=target)
    assert loaded.drafters[0].head_token_ids.tolist() == [1, 2, 3]


def test_a_hub_snapshot_may_link_to_its_blobs_only(tmp_path):
    """The Hub cache's snapshot files are links to ``../../blobs/``: inside the repo's cache folder, allowed."""
    repo = tmp_path / "models--org--pool"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs/abc").write_text("{}")
    snapshot = repo / "snapshots/0123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to("../../blobs/abc")
    check_links(snapshot)
    (tmp_path / "elsewhere").write_text("{}")
    (snapshot / "README.md").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(InvalidPoolError, match=r"pool file '.*README\.md' must stay inside the pool folder"):
        check_links(snapshot)


def test_local_paths_keys_must_be_paths_the_pool_records(target, model_pool):
    with pytest.raises(
        InvalidPoolError,
        match=r"`local_paths` must map paths the pool's config\.json records \(\[.*'drafters/small'.*\]\), but maps "
        r"'drafters/smal'\. Write the key exactly as config\.json does",
    ):
        DrafterPool.from_pretrained(model_pool, target=target, local_paths={"drafters/smal": "."})
    with pytest.raises(TypeError, match=r"`local_paths` must map paths of the pool's config\.json \(str\) to local"):
        DrafterPool.from_pretrained(model_pool, target=target, local_paths=["drafters/small"])


def test_a_dangling_link_is_refused(target, model_pool, tmp_path):
    (model_pool / "drafters/small/extra.json").symlink_to(tmp_path / "gone.json")
    with pytest.raises(
        InvalidPoolError,
        match=r"pool file '.*extra\.json' must be a file or folder of the pool, but it is a symbolic link that does "
        r"not resolve",
    ):
        DrafterPool.from_pretrained(model_pool, target=target)


def test_a_resolved_hub_id_is_returned_as_is():
    spec = DrafterSpec("assistant_model", "x", path="org/model")
    assert LoadContext(specs=[spec]).resolve(spec, "x", need_folder=False) == "org/model"


# ---------------------------------------------------------------------------------------------------------------------
# tokenizers: the recorded fingerprint is checked; patterns are linear; any failure is an InvalidPoolError
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("params", "match"),
    [
        (
            {"target_tokenizer": "tokenizers/target", "target_tokenizer_hash": None},
            r"must record the fingerprint of the target's tokenizer it stores \(`params\.target_tokenizer_hash`\), but "
            r"has none",
        ),
        ({"target_tokenizer_hash": "abc"}, r"`params\.target_tokenizer_hash` must be a `tokenizer_fingerprint`"),
    ],
)
def test_the_recorded_target_tokenizer_fingerprint_is_required_and_well_formed(target, tokenizer_pool, params, match):
    _edit_json(tokenizer_pool / "config.json", lambda d: d["drafters"][0]["params"].update(params))
    with pytest.raises(InvalidPoolError, match=rf"drafter 'a' \(drafters\[0\]\) {match}"):
        DrafterPool.from_pretrained(tokenizer_pool, target=target)


def test_a_swapped_target_tokenizer_of_the_same_size_is_refused(target, tokenizer_pool):
    shutil.rmtree(tokenizer_pool / "tokenizers/target")
    permuted_tokenizer().save_pretrained(tokenizer_pool / "tokenizers/target")  # 96 tokens, other ids
    with pytest.raises(
        InvalidPoolError,
        match=r"drafter 'a' \(drafters\[0\]\) target's tokenizer in '.*tokenizers/target' must have the fingerprint "
        r"the pool recorded \([0-9a-f]{64}\), but has [0-9a-f]{64}: the folder holds another tokenizer",
    ):
        DrafterPool.from_pretrained(tokenizer_pool, target=target)


def _set_pre_tokenizer(folder: Path, pattern: str) -> None:
    split = {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}
    _edit_json(folder / "tokenizer.json", lambda d: d.update(pre_tokenizer=split))


@pytest.mark.parametrize("folder", ["drafters/a/tokenizer", "tokenizers/target"])
def test_a_catastrophic_tokenizer_pattern_is_refused_before_any_encode(target, tokenizer_pool, folder):
    """``(a+)+b``: 0.82 s for a 30-character prompt, a panic for 34; refused at load, in well under a second."""
    _set_pre_tokenizer(tokenizer_pool / folder, "(a+)+b")
    started = time.perf_counter()
    with pytest.raises(
        InvalidPoolError,
        match=rf"must use tokenizer patterns that match in linear time, but '.*{folder}/tokenizer\.json' has the "
        r"regular expression '\(a\+\)\+b', which hf_metasd cannot vouch for .* if you trust this one, pass its folder",
    ):
        DrafterPool.from_pretrained(tokenizer_pool, target=target)
    assert time.perf_counter() - started < 1.0


def test_a_tokenizer_the_caller_vouches_for_loads_and_a_panic_while_probing_it_is_named(target, tokenizer_pool):
    """A mapped folder skips the pattern check; a pattern that makes tokenizers panic (pyo3's PanicException, a
    BaseException) on the load's probe encode is still an InvalidPoolError naming the folder."""
    folder = tokenizer_pool / "drafters/a/tokenizer"
    _set_pre_tokenizer(folder, r"\p{L}")  # flat: linear, and accepted without vouching
    DrafterPool.from_pretrained(tokenizer_pool, target=target)
    _set_pre_tokenizer(folder, r"(\S|\s|.)*\p{Sm}")  # no math symbol in the probe text: exponential, then a panic
    with pytest.raises(InvalidPoolError, match=r"cannot vouch for"):
        DrafterPool.from_pretrained(tokenizer_pool, target=target)
    with pytest.raises(
        InvalidPoolError,
        match=r"drafter 'a' \(drafters\[0\]\) tokenizer must find a readable file at '.*drafters/a/tokenizer', but "
        r"reading it failed \(PanicException: .*retry-limit.*\)\. Restore the folder",
    ):
        DrafterPool.from_pretrained(tokenizer_pool, target=target, local_paths={"drafters/a/tokenizer": folder})


BROKEN_TOKENIZERS = {
    "not JSON": lambda folder: (folder / "tokenizer.json").write_text("{not json"),
    "unknown model type": lambda folder: _edit_json(
        folder / "tokenizer.json", lambda d: d["model"].update(type="Foo")
    ),
    "nested too deep": lambda folder: (folder / "tokenizer.json").write_text("[" * 100_000 + "]" * 100_000),
}


@pytest.mark.parametrize("case", sorted(BROKEN_TOKENIZERS))
def test_a_broken_tokenizer_is_named(target, tokenizer_pool, case):
    BROKEN_TOKENIZERS[case](tokenizer_pool / "drafters/a/tokenizer")
    with pytest.raises(InvalidPoolError, match=r"drafter 'a' \(drafters\[0\]\) tokenizer must find .*tokenizer"):
        DrafterPool.from_pretrained(tokenizer_pool, target=target)


def test_safe_patterns():
    qwen2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    assert is_safe_pattern(qwen2) and not is_safe_pattern(qwen2 + "|(a+)+")
    assert all(is_safe_pattern(p) for p in [".", r"\p{N}", "[(*+)]", r"<\|endoftext\|>|\[PAD\]", r"[[a-z]&&[^aeiou]]"])
    assert not any(is_safe_pattern(p) for p in ["(a+)+b", r"\s*\s*[^\s]", "a{2,}", r"\g<0>", "(a)|\\1", "[a-z"])


# ---------------------------------------------------------------------------------------------------------------------
# errors: a crafted file never crashes a parser with anything but InvalidPoolError
# ---------------------------------------------------------------------------------------------------------------------
def test_a_deeply_nested_pool_config_is_named(target, tmp_path):
    (tmp_path / "config.json").write_text('{"drafters": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(InvalidPoolError, match=r"config\.json' must be valid JSON, but is not \(RecursionError: "):
        DrafterPool.from_pretrained(tmp_path, target=target)


def test_a_huge_pool_config_is_refused_before_it_is_parsed(target, tmp_path):
    pool = _prompt_lookup_pool(tmp_path / "pool")
    text = (pool / "config.json").read_text()
    (pool / "config.json").write_text(text[:-2] + " " * 5 * 2**20 + text[-2:])  # still valid JSON
    with pytest.raises(InvalidPoolError, match=r"config\.json' must be at most 4194304 bytes, but has 52"):
        DrafterPool.from_pretrained(pool, target=target)


DRAFTER_CONFIGS = {
    "not JSON": ("{model_type: llama", r"must find valid JSON at '.*drafters/small/config\.json', but it is not"),
    "nested too deep": (
        '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}",
        r"must find valid JSON at '.*drafters/small/config\.json', but it is not \(RecursionError",
    ),
    "nested deep": (
        '{"a": ' + "[" * 80 + "]" * 80 + "}",
        r"must find JSON nested at most 64 deep at '.*config\.json'",
    ),
    "unknown model type": ('{"model_type": "evil"}', r"must find a readable file at '.*drafters/small/config\.json'"),
}


@pytest.mark.parametrize("case", sorted(DRAFTER_CONFIGS))
def test_a_broken_drafter_config_is_named(target, model_pool, case):
    text, match = DRAFTER_CONFIGS[case]
    (model_pool / "drafters/small/config.json").write_text(text)
    with pytest.raises(InvalidPoolError, match=rf"drafter 'small' \(drafters\[0\]\) {match}"):
        DrafterPool.from_pretrained(model_pool, target=target)


def test_a_non_bool_embedding_flag_is_named(target, model_pool):
    _edit_json(model_pool / "config.json", lambda d: d["drafters"][0]["params"].update(share_target_embeddings="yes"))
    with pytest.raises(
        InvalidPoolError,
        match=r"`params\.share_target_embeddings` must be true or false, but is 'yes'\. Fix it in config\.json",
    ):
        DrafterPool.from_pretrained(model_pool, target=target)


def test_a_json_file_larger_than_the_bound_is_not_parsed(target, tokenizer_pool, monkeypatch):
    import hf_metasd.untrusted as untrusted

    monkeypatch.setattr(untrusted, "MAX_JSON_BYTES", 100)  # instead of writing 64 MiB
    with pytest.raises(
        InvalidPoolError, match=r"must find a JSON file of at most 100 bytes at '.*tokenizer_config\.json', but it has"
    ):
        DrafterPool.from_pretrained(tokenizer_pool, target=target)


def test_an_unrunnable_dtype_is_named(target, model_pool):
    _edit_json(model_pool / "config.json", lambda d: d["drafters"][0]["params"].update(dtype="float8_e5m2"))
    with pytest.raises(
        InvalidPoolError,
        match=r"`params\.dtype` must name a torch floating dtype, but is 'float8_e5m2' \(a drafter runs in one of "
        r"\['bfloat16', 'float16', 'float32', 'float64'\]\)\. Use e\.g\. \"bfloat16\"",
    ):
        DrafterPool.from_pretrained(model_pool, target=target)


def test_a_pickled_adapter_is_never_loaded(target, lora_pool, tmp_path):
    adapter = lora_pool / "lora/qa/adapters/qa"
    marker = tmp_path / "marker"
    (adapter / "adapter_model.safetensors").unlink()
    (adapter / "adapter_model.bin").write_bytes(pickle.dumps(Evil(marker)))
    with pytest.raises(
        InvalidPoolError,
        match=r"drafter 'qa' \(drafters\[0\]\) must find `adapter_model\.safetensors` in '.*adapters/qa', but it is "
        r"missing \(a pool reads weights from safetensors files only, never pickles\)",
    ):
        DrafterPool.from_pretrained(lora_pool, target=target)
    assert not marker.exists()


ADAPTER_NUMBERS = {
    "huge rank": ({"r": 10_000_000}, r"`r` an int in \[1, 1024\] in '.*adapter_config\.json', but it is 10000000"),
    "huge rank in a pattern": (
        {"rank_pattern": {"q_proj": 2**30}},
        r"`rank_pattern\['q_proj'\]` an int in \[1, 1024\] in .*, but it is 1073741824",
    ),
    "zero rank": ({"r": 0}, r"`r` an int in \[1, 1024\]"),
    "float rank": ({"r": 2.5}, r"`r` an int in \[1, 1024\]"),
    "infinite alpha": ({"lora_alpha": 1e309}, r"`lora_alpha` a number in \(0, 65536\]"),
    "negative alpha in a pattern": (
        {"alpha_pattern": {"q_proj": -1}},
        r"`alpha_pattern\['q_proj'\]` a number in \(0, 65536\]",
    ),
    "pattern not an object": ({"rank_pattern": [1]}, r"`rank_pattern` an object in .*, but it is \[1\]"),
}


@pytest.mark.parametrize("case", sorted(ADAPTER_NUMBERS))
def test_an_adapter_with_an_unbounded_rank_or_alpha_is_refused_before_peft_builds_it(
    target, lora_pool, case, monkeypatch
):
    import peft

    change, match = ADAPTER_NUMBERS[case]
    _edit_json(lora_pool / "lora/qa/adapters/qa/adapter_config.json", lambda d: d.update(change))
    built = []
    monkeypatch.setattr(peft.PeftModel, "from_pretrained", lambda *a, **k: built.append(1))
    with pytest.raises(InvalidPoolError, match=rf"drafter 'qa' \(drafters\[0\]\) must have {match}"):
        DrafterPool.from_pretrained(lora_pool, target=target)
    assert not built  # refused before peft saw the file


def test_a_pickled_referenced_model_is_never_loaded(target, model_pool, drafter_folder, tmp_path):
    marker = tmp_path / "marker"
    (drafter_folder / "model.safetensors").unlink()
    (drafter_folder / "pytorch_model.bin").write_bytes(pickle.dumps(Evil(marker)))
    _reference(model_pool, str(drafter_folder))
    with pytest.raises(InvalidPoolError, match=r"drafter 'small' \(drafters\[0\]\) must find a readable file at "):
        DrafterPool.from_pretrained(model_pool, target=target, local_paths={str(drafter_folder): drafter_folder})
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------------------------------
# pools saved before these checks still load
# ---------------------------------------------------------------------------------------------------------------------
def test_the_embedded_pool_still_loads():
    from hf_metasd.benchmark.offline import embedded_pool_path

    smollm2_vocab = 49152
    loaded = DrafterPool.from_pretrained(embedded_pool_path(), target=tiny_llama(0, layers=1, vocab=smollm2_vocab))
    assert [d.name for d in loaded.drafters] == ["corpus_all", "corpus_translation"]
    assert loaded.num_assistant_tokens == 3 and loaded.prior_weight == 2.0
