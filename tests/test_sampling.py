"""With `do_sample=True` MetaSD uses speculative sampling: the sampled tokens follow the target's distribution."""

from __future__ import annotations

import pytest
import torch
from conftest import sharpen, tiny_llama

import hf_metasd
from hf_metasd.drafters import Drafter

scipy_stats = pytest.importorskip("scipy.stats")

VOCAB = 6
SAMPLES = 1500
PROMPT = torch.tensor([[1, 4, 2]])


class Constant(Drafter):
    """A deterministic drafter without logits: always token 3."""

    kind = "constant"
    returns_logits = False

    def draft(self, input_ids, num_tokens, *, logits_processor=None, do_sample=False):
        return torch.full((1, num_tokens), 3), None


def _models(dtype: torch.dtype = torch.float32):
    target = sharpen(tiny_llama(10, vocab=VOCAB), 3.0).to(dtype)
    drafters = [sharpen(tiny_llama(s, layers=1, vocab=VOCAB), 3.0).to(dtype) for s in (11, 12)]
    return target, drafters


@pytest.fixture(scope="module")
def small():
    return _models()


def _exact_joint(target) -> torch.Tensor:
    """p(x1, x2 | prompt) from the target's own logits, shape (V, V)."""
    with torch.no_grad():
        p1 = target(PROMPT).logits[0, -1].float().softmax(-1)
        seconds = torch.stack(
            [
                target(torch.cat([PROMPT, torch.tensor([[x]])], dim=1)).logits[0, -1].float().softmax(-1)
                for x in range(VOCAB)
            ]
        )
    return p1[:, None] * seconds


def _chi_square_p(counts: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson chi-square p-value of `counts` against `expected_probs`, all in float64.

    scipy (>= 1.17) refuses expected counts whose sum differs from the observed total by more than ~1.5e-8 relative,
    so the expectations are normalised in float64 and rescaled to the exact observed total after pooling.
    """
    observed = counts.flatten().double()
    probs = expected_probs.flatten().double()
    expected = probs / probs.sum() * observed.sum()
    keep = expected >= 5  # pool the rare cells into one bin so every bin has >= 5 expected
    obs = torch.cat([observed[keep], observed[~keep].sum()[None]])
    exp = torch.cat([expected[keep], expected[~keep].sum()[None]])
    obs, exp = obs[exp > 0], exp[exp > 0]
    exp = exp * (obs.sum() / exp.sum())
    return float(scipy_stats.chisquare(obs.numpy(), exp.numpy()).pvalue)


def _sample_counts(sample_fn) -> torch.Tensor:
    counts = torch.zeros(VOCAB, VOCAB)
    for _ in range(SAMPLES):
        seq = sample_fn()
        counts[seq[0, -2], seq[0, -1]] += 1
    return counts


def test_speculative_sampling_follows_the_target_distribution(small):
    target, drafters = small
    torch.manual_seed(0)
    counts = _sample_counts(
        lambda: target.generate(
            PROMPT,
            do_sample=True,
            max_new_tokens=2,
            top_k=0,
            custom_generate=hf_metasd.generate,
            assistant_models=drafters,
            num_assistant_tokens=2,
        )
    )
    assert _chi_square_p(counts, _exact_joint(target)) > 1e-3


def test_prompt_lookup_style_drafter_without_logits_keeps_the_distribution(small):
    """A deterministic drafter (no logits) goes through transformers' sample-and-compare path: still exact."""
    target, drafters = small

    torch.manual_seed(1)
    counts = _sample_counts(
        lambda: target.generate(
            PROMPT,
            do_sample=True,
            max_new_tokens=2,
            top_k=0,
            custom_generate=hf_metasd.generate,
            assistant_models=[Constant(), drafters[0]],
            num_assistant_tokens=2,
        )
    )
    assert _chi_square_p(counts, _exact_joint(target)) > 1e-3


def test_sampling_in_bfloat16_follows_the_target_distribution():
    """The bfloat16 contract for sampling: draws follow the target's distribution as its bfloat16 passes compute it,
    with drafters that give logits (speculative sampling) and a deterministic one (sample and compare) in one pool."""
    target, drafters = _models(torch.bfloat16)

    torch.manual_seed(3)
    counts = _sample_counts(
        lambda: target.generate(
            PROMPT,
            do_sample=True,
            max_new_tokens=2,
            top_k=0,
            custom_generate=hf_metasd.generate,
            assistant_models=[*drafters, Constant()],
            meta_policy="round_robin",
            num_assistant_tokens=2,
        )
    )
    assert _chi_square_p(counts, _exact_joint(target)) > 1e-3


def test_the_check_has_power(small):
    """Negative control: sampling from a drafter's distribution instead is detected by the same test."""
    target, drafters = small
    torch.manual_seed(2)
    counts = _sample_counts(lambda: drafters[0].generate(PROMPT, do_sample=True, max_new_tokens=2, top_k=0))
    assert _chi_square_p(counts, _exact_joint(target)) < 1e-6
