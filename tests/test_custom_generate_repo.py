"""hf_metasd as a transformers ``custom_generate`` repository: the folder `hf-metasd custom-generate-repo` writes is
loaded by transformers itself (``custom_generate="folder", trust_remote_code=True``) and decodes losslessly."""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

import pytest
import torch
import transformers.dynamic_module_utils as dynamic_modules
from conftest import VOCAB, greedy, prompts
from huggingface_hub import ModelCard
from test_generate_features import _tokenizer
from transformers.utils.import_utils import split_package_version

import hf_metasd
from hf_metasd import MetaSDConfigError
from hf_metasd.cli import main
from hf_metasd.custom_generate_repo import FILES, requirements, write_custom_generate_repo
from hf_metasd.drafters import PromptLookupDrafter
from hf_metasd.errors import CustomGenerateRepoError
from hf_metasd.pool import DrafterPool

PROMPTS = prompts(3, seed=36)


@pytest.fixture(autouse=True)
def modules_cache(tmp_path, monkeypatch) -> Path:
    """transformers copies a repository's code into its modules cache before running it: a folder of the test's own,
    not the user's ``~/.cache/huggingface/modules`` (transformers also puts the cache on `sys.path`)."""
    cache = tmp_path / "modules"
    monkeypatch.setattr(dynamic_modules, "HF_MODULES_CACHE", str(cache))
    monkeypatch.setattr(sys, "path", list(sys.path))
    return cache


@pytest.fixture
def repo(tmp_path) -> Path:
    return write_custom_generate_repo(tmp_path / "metasd_repo")


def _through_repo(target, repo: Path, prompt, max_new_tokens: int = 20, **kwargs):
    return target.generate(
        prompt,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        custom_generate=str(repo),
        trust_remote_code=True,
        **kwargs,
    )


# ---------------------------------------------------------------------- the command
def test_the_command_writes_the_repository_layout(tmp_path, capsys):
    folder = tmp_path / "new" / "repo"
    assert main(["custom-generate-repo", str(folder)]) == 0
    written = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert written == sorted(FILES)
    assert f'custom_generate="{folder}", trust_remote_code=True' in capsys.readouterr().out


def test_a_folder_that_holds_files_is_refused_and_overwrite_keeps_the_other_files(tmp_path, capsys):
    folder = tmp_path / "model_repo"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    message = (
        r"`folder` must be empty or new, but .*model_repo holds 1 entries \(model\.safetensors\)\. Choose another "
        r"folder, or pass `overwrite=True` \(`--overwrite`\) to replace README\.md, custom_generate/generate\.py, "
        r"custom_generate/requirements\.txt in it\."
    )
    with pytest.raises(CustomGenerateRepoError, match=message):
        write_custom_generate_repo(folder)
    with pytest.raises(SystemExit) as exit_info:
        main(["custom-generate-repo", str(folder)])
    assert exit_info.value.code == 2 and re.search(message, capsys.readouterr().err.replace("\n", " "))
    assert sorted(p.name for p in folder.iterdir()) == ["model.safetensors"], "a refusal must write nothing"
    # the fix the message gives
    assert main(["custom-generate-repo", str(folder), "--overwrite"]) == 0
    assert all((folder / name).is_file() for name in FILES)
    assert (folder / "model.safetensors").read_bytes() == b"weights"


def test_a_file_is_refused_as_the_folder(tmp_path):
    path = tmp_path / "README.md"
    path.write_text("mine")
    with pytest.raises(CustomGenerateRepoError, match=r"`folder` must be a folder, but .*README\.md is a file\."):
        write_custom_generate_repo(path, overwrite=True)
    assert path.read_text() == "mine"


# ---------------------------------------------------------------------- README and requirements
def test_the_readme_is_a_model_card_tagged_custom_generate(repo):
    card = ModelCard.load(repo / "README.md")  # the Hub's own parser of the front matter
    assert card.data.library_name == "transformers"
    assert card.data.tags == ["custom_generate"]
    text = card.text
    for usage in ("trust_remote_code=True", "assistant_models=[drafter_a", "assistant_models=pool", "DrafterPool"):
        assert usage in text
    assert f"hf-metasd {hf_metasd.__version__}" in text


def test_the_requirements_pass_transformers_check_and_name_this_version(repo):
    lines = (repo / "custom_generate" / "requirements.txt").read_text().splitlines()
    assert lines == requirements()
    assert {split_package_version(line)[0] for line in lines} == {"hf-metasd", "transformers"}
    for line in lines:  # transformers reads `name OP digits`: every line must be read whole, not cut short
        name, operator, version = split_package_version(line)
        assert name + operator + version == line
    dynamic_modules.check_python_requirements(str(repo), requirements_file="custom_generate/requirements.txt")


def test_transformers_refuses_the_repository_for_an_older_hf_metasd(repo):
    # the file is really checked: a repository written by a (future) release this environment does not satisfy
    (repo / "custom_generate" / "requirements.txt").write_text("\n".join(requirements("99.0.0")) + "\n")
    with pytest.raises(ImportError, match=r"hf-metasd>=99\.0\.0 \(installed: "):
        dynamic_modules.check_python_requirements(str(repo), requirements_file="custom_generate/requirements.txt")


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("0.1.0.dev0", ["hf-metasd<0.2"]),  # no lower bound: transformers' check cannot read `.dev0`
        ("0.1.0", ["hf-metasd>=0.1.0", "hf-metasd<0.2"]),
        ("0.3.2", ["hf-metasd>=0.3.2", "hf-metasd<0.4"]),
        ("1.2.3", ["hf-metasd>=1.2.3", "hf-metasd<2"]),
        ("1.2.3.post1", ["hf-metasd>=1.2.3", "hf-metasd<2"]),
        ("2.0.0rc1", ["hf-metasd<3"]),
    ],
)
def test_the_hf_metasd_bounds(version, expected):
    requires = ["torch>=2.4", "transformers<6,>=5.24", "peft>=0.17; extra == 'peft'"]
    assert requirements(version, requires) == [*expected, "transformers>=5.24", "transformers<6"]


def test_a_requirement_transformers_cannot_read_is_refused():
    with pytest.raises(
        CustomGenerateRepoError,
        match=r"a requirement must read `name OP digits` for transformers' check, but is 'transformers~=5\.24'\.",
    ):
        requirements("0.1.0", ["transformers~=5.24"])
    with pytest.raises(CustomGenerateRepoError, match=r"must name transformers once, but names it 0 times"):
        requirements("0.1.0", ["torch>=2.4"])


def test_an_uninstalled_hf_metasd_is_refused_before_writing(tmp_path, monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "requires", not_installed)
    with pytest.raises(CustomGenerateRepoError, match=r"hf-metasd must be installed to write its repository"):
        write_custom_generate_repo(tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


# ---------------------------------------------------------------------- loading it through transformers
@pytest.mark.parametrize("pool_kind", ["list", "pool"])
def test_greedy_through_the_repository_is_plain_greedy(target, drafters, repo, pool_kind):
    pool = drafters if pool_kind == "list" else DrafterPool([*drafters, PromptLookupDrafter()], target=target)
    for prompt in PROMPTS:
        out = _through_repo(target, repo, prompt, assistant_models=pool, return_dict_in_generate=True)
        assert torch.equal(out.sequences, greedy(target, prompt, 20))
        assert out.metasd.tokens == 20
        assert len(out.metasd.drafter_names) >= len(pool)  # every drafter of the pool is an arm (and no_draft)


def test_stop_strings_with_a_tokenizer_through_the_repository(target, target_copy, repo):
    tokenizer = _tokenizer(VOCAB)
    prompt = PROMPTS[0]
    reference = greedy(target, prompt, 20)
    stop = tokenizer.convert_ids_to_tokens([int(reference[0, prompt.shape[1] + 4])])[0]
    plain = greedy(target, prompt, 20, stop_strings=[stop], tokenizer=tokenizer)
    assert plain.shape[1] < reference.shape[1]
    out = _through_repo(target, repo, prompt, assistant_models=[target_copy], stop_strings=[stop], tokenizer=tokenizer)
    assert torch.equal(out, plain)


def test_arguments_that_fetch_the_repository_do_not_reach_decoding(target, drafters, repo):
    # a pinned revision (what transformers advises for remote code) is spent on loading, not sent to the model
    out = _through_repo(target, repo, PROMPTS[1], assistant_models=drafters, revision="main", local_files_only=True)
    assert torch.equal(out, greedy(target, PROMPTS[1], 20))


@pytest.mark.parametrize("trust", [False, None])
def test_without_trust_remote_code_transformers_refuses_the_repository(
    target, drafters, repo, modules_cache, monkeypatch, trust
):
    # `None` is transformers' interactive question; with its timeout at 0 (as on CI) it refuses at once
    monkeypatch.setattr(dynamic_modules, "TIME_OUT_REMOTE_CODE", 0)
    calls = []
    handle = target.register_forward_pre_hook(lambda *_: calls.append(1))
    kwargs = {} if trust is None else {"trust_remote_code": trust}
    try:
        with pytest.raises(ValueError, match=r"trust_remote_code=True"):
            target.generate(
                PROMPTS[0], max_new_tokens=5, custom_generate=str(repo), assistant_models=drafters, **kwargs
            )
    finally:
        handle.remove()
    assert not calls and not list(modules_cache.rglob("generate.py")), "the repository's code must not have run"


def test_a_call_without_assistant_models_is_refused_before_compute(target, repo):
    calls = []
    handle = target.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(
            MetaSDConfigError,
            match=r"`assistant_models` must be passed with the hf_metasd `custom_generate` repository, but is None\. "
            r"Pass the drafters, `assistant_models=\[drafter, \.\.\.\]` or a `DrafterPool`, or drop `custom_generate`",
        ):
            _through_repo(target, repo, PROMPTS[0], meta_policy="ucb")
    finally:
        handle.remove()
    assert not calls


def test_a_lone_assistant_model_is_a_one_drafter_pool_through_the_repository(target, drafters, repo):
    out = _through_repo(target, repo, PROMPTS[0], assistant_model=drafters[0], return_dict_in_generate=True)
    assert torch.equal(out.sequences, target.generate(PROMPTS[0], do_sample=False, max_new_tokens=20))
    assert len(out.metasd.drafter_names) == 2 and sum(out.metasd.drafted) > 0  # the drafter and the no-draft arm


def test_after_enable_the_repository_is_refused_and_a_plain_call_serves(target, drafters, repo):
    # what the README's note says: `enable()` already serves `assistant_models`, so no `custom_generate` with it
    hf_metasd.enable()
    with pytest.raises(MetaSDConfigError, match=r"`custom_generate` must be None or `hf_metasd.generate`"):
        _through_repo(target, repo, PROMPTS[2], assistant_models=drafters)
    out = target.generate(PROMPTS[2], do_sample=False, max_new_tokens=20, assistant_models=drafters)
    assert torch.equal(out, greedy(target, PROMPTS[2], 20))
