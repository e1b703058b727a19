"""The lossless contract in each dtype (`hf_metasd.lossless`), over the architecture matrix.

Float32: greedy output identical to plain `generate`. bfloat16 / float16: every emitted token is the argmax of the
target's logits as the verifying pass computed them (the scores MetaSD returns are that pass's), and where the output
leaves plain greedy output, it is at a near-tie by `hf_metasd.lossless`'s definition. The check itself has power: a
token that is not the target's choice is reported as an error, and in float32 every divergence is one.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import VOCAB
from test_architectures import FAMILIES, build, perturbed, skip_if_stateful
from transformers import LogitsProcessorList, SequenceBiasLogitsProcessor

import hf_metasd
from hf_metasd.drafters import ModelDrafter, PromptLookupDrafter
from hf_metasd.lossless import Divergence, check_divergence, first_divergence, float32_copy

MAX_NEW = 12
N = 4


def _prompts(n: int = 3, seed: int = 7) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        body = torch.randint(1, VOCAB, (int(torch.randint(4, 9, (1,), generator=g)),), generator=g)
        if i % 2:  # repeated n-grams: prompt lookup drafts
            body = torch.cat([body, body[:4]])
        out.append(body[None])
    return out


def _metasd(model, prompt, pool, entry: str):
    kwargs = {
        "max_new_tokens": MAX_NEW,
        "do_sample": False,
        "assistant_models": pool,
        "num_assistant_tokens": N,
        "return_dict_in_generate": True,
        "output_scores": True,
    }
    if entry == "enable":
        hf_metasd.enable()
        try:
            return model.generate(prompt, **kwargs)
        finally:
            hf_metasd.disable()
    return model.generate(prompt, custom_generate=hf_metasd.generate, **kwargs)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_dtype_keeps_its_contract(family):
    """bfloat16: every token is the verifying pass's argmax and every divergence is a near-tie; the same prompts in
    float32: identical to plain greedy output. Both entry points, a pool of an exact copy, a perturbed copy and
    prompt lookup."""
    base = build(family)
    if getattr(base, "_is_stateful", False):
        skip_if_stateful(type("F", (), {"target": base})())
    noisy_base = perturbed(base)
    found: dict[str, list[Divergence]] = {"bfloat16": [], "float32": []}
    for dtype in (torch.bfloat16, torch.float32):
        target = copy.deepcopy(base).to(dtype)
        pool = [
            ModelDrafter(copy.deepcopy(noisy_base).to(dtype), name="perturbed"),
            PromptLookupDrafter(),
            ModelDrafter(copy.deepcopy(target), name="copy"),
        ]
        target32 = float32_copy(target)
        for i, prompt in enumerate(_prompts()):
            entry = ("enable", "custom_generate")[i % 2]
            reference = target.generate(prompt, do_sample=False, max_new_tokens=MAX_NEW)
            out = _metasd(target, prompt, pool, entry)
            new = out.sequences[0, prompt.shape[1] :]
            chosen = torch.stack([s[0].argmax() for s in out.scores])
            assert torch.equal(new, chosen), f"{family} {dtype}: a token is not the verifying pass's argmax"
            divergence = check_divergence(target, reference, out.sequences, prompt.shape[1], target_float32=target32)
            if divergence is not None:
                found[str(dtype).removeprefix("torch.")].append(divergence)
    assert found["float32"] == [], f"{family}: float32 output left plain greedy output: {found['float32']}"
    errors = [d for d in found["bfloat16"] if not d.near_tie]
    assert errors == [], f"{family}: bfloat16 divergences that are not near-ties: {errors}"


@pytest.fixture(scope="module")
def llama_bf16():
    target = build("llama").to(torch.bfloat16)
    return target, float32_copy(target)


def test_a_token_that_is_not_the_targets_choice_is_an_error(llama_bf16):
    """Negative control: a sequence whose first new token is the target's least likely one is not a near-tie."""
    target, target32 = llama_bf16
    prompt = _prompts(1)[0]
    reference = target.generate(prompt, do_sample=False, max_new_tokens=4)
    with torch.no_grad():
        worst = int(target32(prompt).logits[0, -1].argmin())
    wrong = reference.clone()
    wrong[0, prompt.shape[1]] = worst
    divergence = check_divergence(target, reference, wrong, prompt.shape[1], target_float32=target32)
    assert divergence.position == 0 and divergence.token == worst
    assert divergence.gap > divergence.tolerance > 0
    assert not divergence.near_tie
    assert "NOT a near-tie, an ERROR" in divergence.describe()


def test_the_near_tie_check_reads_float32_logits(llama_bf16):
    """The gap is the float32 logit gap of the two tokens on the common prefix; the tolerance twice the largest
    deviation of the bfloat16 logits from float32's there."""
    target, target32 = llama_bf16
    prompt = _prompts(1)[0]
    reference = target.generate(prompt, do_sample=False, max_new_tokens=3)
    with torch.no_grad():
        z32 = target32(reference[:, :-1]).logits[0, -1]
        z16 = target(reference[:, :-1]).logits[0, -1].float()
    runner_up = int(z32.topk(2).indices[1]) if int(z32.argmax()) == int(reference[0, -1]) else int(z32.argmax())
    other = reference.clone()
    other[0, -1] = runner_up
    divergence = check_divergence(target, reference, other, prompt.shape[1], target_float32=target32)
    assert divergence.position == 2
    assert divergence.gap == pytest.approx(float(z32[reference[0, -1]] - z32[runner_up]))
    assert divergence.tolerance == pytest.approx(2 * float((z16 - z32).abs().max()))


def test_with_a_logits_processor_the_check_judges_the_processed_scores(llama_bf16):
    """The tokens were chosen from the processed scores: a processor that brings the target's least likely token
    within a hair of its first choice makes a divergence there a near-tie of the processed scores (their float32
    gap, the tolerance of their deviation), which the raw logits' whole-logit gap would call an error."""
    target, target32 = llama_bf16
    prompt = _prompts(1)[0]
    with torch.no_grad():
        z32 = target32(prompt).logits[0, -1]
        z16 = target(prompt).logits[0, -1].float()
    first, last = int(z32.argmax()), int(z32.argmin())
    tolerance = 2 * float((z16 - z32).abs().max())
    bias = float(z32[first] - z32[last]) - tolerance / 4  # the processed float32 gap: a quarter of the tolerance
    processors = LogitsProcessorList([SequenceBiasLogitsProcessor([[[last], bias]])])
    reference = target.generate(prompt, do_sample=False, max_new_tokens=1, logits_processor=processors)
    other = reference.clone()
    other[0, -1] = last if int(reference[0, -1]) == first else first  # the other side of the near-tie
    found = check_divergence(
        target, reference, other, prompt.shape[1], target_float32=target32, logits_processor=processors
    )
    assert found.near_tie and found.processed
    assert abs(found.gap) == pytest.approx(tolerance / 4, abs=1e-3) and found.tolerance == pytest.approx(tolerance)
    assert "a bfloat16 near-tie, float32 processed-score gap" in found.describe()
    raw = check_divergence(target, reference, other, prompt.shape[1], target_float32=target32)
    assert not raw.near_tie and not raw.processed  # judged on raw logits, the same divergence reads as an error


def test_in_float32_every_divergence_is_an_error():
    target = build("llama")
    prompt = _prompts(1)[0]
    reference = target.generate(prompt, do_sample=False, max_new_tokens=3)
    other = reference.clone()
    other[0, -1] = (other[0, -1] + 1) % VOCAB
    divergence = check_divergence(target, reference, other, prompt.shape[1])
    assert divergence.dtype == "float32" and divergence.tolerance == 0.0 and not divergence.near_tie
    assert "must be identical" in divergence.describe()


def test_first_divergence_positions():
    ref = torch.tensor([[1, 2, 3, 4]])
    assert first_divergence(ref, ref.clone(), 2) is None
    assert first_divergence(ref, torch.tensor([[1, 2, 3, 5]]), 2) == 1
    assert first_divergence(ref, torch.tensor([[1, 2, 3]]), 2) == 1  # stopped early: the missing position
    divergence = check_divergence(build("llama").to(torch.bfloat16), ref, torch.tensor([[1, 2, 3]]), 2)
    assert divergence.token is None and not divergence.near_tie
