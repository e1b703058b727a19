"""A target placed by accelerate (`device_map`, some layers offloaded to CPU and disk, hooks in place) runs MetaSD
losslessly, and the CPU verification kernel leaves its hooked layers alone."""

from __future__ import annotations

import pytest
import torch
from conftest import greedy, metasd_greedy, prompts, sharpen, tiny_llama

from hf_metasd.drafters import PromptLookupDrafter
from hf_metasd.kernels import choose_verification_kernel, skinny_linear

accelerate = pytest.importorskip("accelerate")

PROMPTS = prompts(4, seed=31)
DEVICE_MAP = {
    "model.embed_tokens": "cpu",
    "model.layers.0": "cpu",
    "model.layers.1": "disk",  # weights read back from disk by accelerate's hooks at every forward
    "model.norm": "cpu",
    "model.rotary_emb": "cpu",
    "lm_head": "cpu",
}


@pytest.fixture(scope="module")
def dispatched(tmp_path_factory):
    model = sharpen(tiny_llama(0))
    references = [greedy(model, p, 16) for p in PROMPTS]
    offload = tmp_path_factory.mktemp("offload")
    return accelerate.dispatch_model(model, device_map=DEVICE_MAP, offload_dir=str(offload)), references


@pytest.mark.parametrize("policy", ["ucb", "round_robin"])
def test_metasd_on_an_offloaded_target_is_lossless(dispatched, drafters, target_copy, policy):
    model, references = dispatched
    assert any("forward" in m.__dict__ for m in model.modules()), "accelerate's hooks must be in place"
    pool = [drafters[0], target_copy, PromptLookupDrafter()]
    for prompt, reference in zip(PROMPTS, references):
        out = metasd_greedy(model, prompt, 16, assistant_models=pool, meta_policy=policy)
        assert torch.equal(out, reference)


def test_the_cpu_kernel_leaves_hooked_layers_alone(dispatched, drafters, monkeypatch):
    model, references = dispatched
    with skinny_linear(model) as changed:
        assert changed == 0
    assert choose_verification_kernel(model, [4]).kernel == "stock"  # nothing eligible: nothing measured
    calls = []
    original = torch.mm
    monkeypatch.setattr(torch, "mm", lambda *a, **k: calls.append(1) or original(*a, **k))
    out = metasd_greedy(model, PROMPTS[0], 16, assistant_models=drafters, meta_skinny_gemm=True)
    assert torch.equal(out, references[0]) and not calls
    assert all(
        m.__dict__.get("forward") is None or "skinny" not in repr(m.__dict__["forward"]) for m in model.modules()
    )
