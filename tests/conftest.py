"""Shared fixtures: tiny Llama models built from config (no network), prompts, a lossless-check helper."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_metasd

torch.set_num_threads(1)  # tiny models: one thread is faster and leaves the other core free

VOCAB = 96


def tiny_llama(seed: int, *, layers: int = 2, vocab: int = VOCAB, hidden: int = 32) -> LlamaForCausalLM:
    """A random Llama with `layers` layers; different seeds disagree, the same seed gives the same weights."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=0,
        eos_token_id=None,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def sharpen(model: LlamaForCausalLM, scale: float = 8.0) -> LlamaForCausalLM:
    """Scale the LM head so that the model's distributions are peaked (random tiny models are near-uniform)."""
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


@pytest.fixture(scope="session")
def target() -> LlamaForCausalLM:
    return sharpen(tiny_llama(0))


@pytest.fixture(scope="session")
def drafters(target) -> list[LlamaForCausalLM]:
    """Three drafters that really disagree with the target, plus nothing shared with it."""
    return [sharpen(tiny_llama(seed, layers=1)) for seed in (1, 2, 3)]


@pytest.fixture(scope="session")
def target_copy(target) -> LlamaForCausalLM:
    """A drafter that is an exact copy of the target (accepts everything)."""
    copy = tiny_llama(0)
    copy.load_state_dict(target.state_dict())
    return copy.eval()


def prompts(n: int, *, seed: int = 1234, min_len: int = 3, max_len: int = 12) -> list[torch.Tensor]:
    """`n` random prompts of shape (1, L), seeded."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        out.append(torch.randint(1, VOCAB, (1, length), generator=g))
    return out


def greedy(model, input_ids: torch.Tensor, max_new_tokens: int, **kwargs) -> torch.Tensor:
    """The target's own greedy output (stock `generate`)."""
    return model.generate(input_ids, do_sample=False, max_new_tokens=max_new_tokens, **kwargs)


def metasd_greedy(model, input_ids: torch.Tensor, max_new_tokens: int, **kwargs):
    """MetaSD greedy output through transformers' `custom_generate` hook."""
    return model.generate(
        input_ids, do_sample=False, max_new_tokens=max_new_tokens, custom_generate=hf_metasd.generate, **kwargs
    )


@pytest.fixture(autouse=True)
def _restore_generate():
    """Every test leaves transformers unpatched."""
    yield
    hf_metasd.disable()
