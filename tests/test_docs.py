"""The documentation's tutorials run: CI executes every ``docs/tutorials/*.py`` the way a reader would.

Each script builds only tiny models from config (no download), so each takes seconds. A script that raises (or whose
``assert`` on lossless output fails) exits non-zero and fails its test with the script's stderr.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TUTORIALS = sorted((REPO / "docs" / "tutorials").glob("*.py"))
TIMEOUT_S = 180  # generous: the scripts take seconds, but CI machines are shared


def test_there_are_tutorials():
    assert TUTORIALS, "docs/tutorials/*.py must hold the tutorial scripts"


@pytest.mark.parametrize("script", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_script_runs(script: Path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    proc = subprocess.run(
        [sys.executable, str(script.relative_to(REPO))],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, f"{script.name} exited with {proc.returncode}:\n{proc.stderr[-4000:]}"


@pytest.mark.parametrize("script", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_script_is_shown_on_its_page(script: Path):
    """Every script is included into its page with pymdownx.snippets, so what runs in CI is what readers see."""
    page = script.with_suffix(".md")
    assert page.is_file(), f"{script.name} must have a page {page.relative_to(REPO)}"
    assert f'--8<-- "docs/tutorials/{script.name}' in page.read_text(encoding="utf-8")


def test_every_page_in_the_nav_exists():
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    nav = re.search(r"^nav:\n((?:[ \t].*\n|\n)*)", config, flags=re.MULTILINE)
    assert nav, "mkdocs.yml must have a `nav`"
    pages = re.findall(r"([\w/]+\.md)\s*$", nav.group(1), flags=re.MULTILINE)
    assert pages, "mkdocs.yml must list pages in `nav`"
    missing = [p for p in pages if not (REPO / "docs" / p).is_file()]
    assert not missing, f"pages listed in mkdocs.yml but missing from docs/: {missing}"


def test_rst_math_extension_rewrites_docstring_maths():
    """The docs build renders the library's reST maths through docs/_griffe/rst_math.py."""
    pytest.importorskip("griffe")
    sys.path.insert(0, str(REPO / "docs" / "_griffe"))
    try:
        from rst_math import rst_to_markdown
    finally:
        sys.path.pop(0)
    text = "Pick\n\n.. math:: i = \\arg\\max_i x_i\n\nwhere :math:`x_i` is a mean. A loop::\n\n    f(x)\n\nExample:\n    >>> 1\n    1"
    assert rst_to_markdown(text) == (
        "Pick\n\n$$\ni = \\arg\\max_i x_i\n$$\n\nwhere $x_i$ is a mean. A loop:\n\n    f(x)\n\nExamples:\n    >>> 1\n    1"
    )
