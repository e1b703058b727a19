"""Shared fixtures: tiny Llama models built from config (no network), prompts, a lossless-check helper, stopping
criteria that record what they saw, and a fixture that fails any attempt to reach the Hub."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, StoppingCriteria

import hf_metasd
import hf_metasd.batched.lengths
import hf_metasd.draft_length
import hf_metasd.stats
from hf_metasd import clear_reward_memory

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


#: the entry point `metasd_greedy` goes through: ``"custom_generate"`` (transformers' hook) or ``"enable"``
#: (``hf_metasd.enable()`` then ``assistant_models=``); a test module sets it per test with `entry_point`
ENTRY_POINT = {"name": "custom_generate"}


def metasd_greedy(model, input_ids: torch.Tensor, max_new_tokens: int, **kwargs):
    """MetaSD greedy output through the entry point `ENTRY_POINT` names (transformers' `custom_generate` hook by
    default)."""
    if ENTRY_POINT["name"] == "enable":
        hf_metasd.enable()
        return model.generate(input_ids, do_sample=False, max_new_tokens=max_new_tokens, **kwargs)
    return model.generate(
        input_ids, do_sample=False, max_new_tokens=max_new_tokens, custom_generate=hf_metasd.generate, **kwargs
    )


@pytest.fixture(params=["custom_generate", "enable"])
def entry_point(request):
    """Run a test once through each entry point (`metasd_greedy` follows it); use with ``autouse`` in a module."""
    ENTRY_POINT["name"] = request.param
    yield request.param
    ENTRY_POINT["name"] = "custom_generate"


@pytest.fixture(autouse=True)
def _restore_generate():
    """Every test leaves transformers unpatched, and starts with no rewards learnt and no verification or round costs
    measured by another test's calls (a fake clock's costs would otherwise steer a later test's draft lengths and
    arms)."""
    clear_reward_memory()
    hf_metasd.draft_length._CACHE.clear()
    hf_metasd.kernels._PASS_COSTS.clear()
    hf_metasd.costs._CACHE.clear()
    hf_metasd.batched.lengths._VERDICTS.clear()  # what earlier batches' drafting guards found
    yield
    hf_metasd.disable()


def lossless_under(
    target, prompts, references, pool, policy: str, max_new_tokens: int, *, arm: int, what: str
) -> list:
    """Greedy MetaSD with `policy` (``fixed`` drafts with `arm`) over `pool`, N = 3, on every prompt: asserts each
    output is its plain-`generate` reference and returns each call's `MetaSDStats`."""
    stats = []
    for prompt, reference in zip(prompts, references):
        out = metasd_greedy(
            target,
            prompt,
            max_new_tokens,
            assistant_models=pool,
            meta_policy=policy,
            meta_policy_kwargs={"arm": arm} if policy == "fixed" else {},
            num_assistant_tokens=3,
            return_dict_in_generate=True,
        )
        assert torch.equal(out.sequences, reference), f"{policy} over {what} changed the greedy output"
        stats.append(out.metasd)
    return stats


class FakeClock:
    """Time advances only when a model runs: `units` per forward pass of each charged model (`charge`), or, with a
    list, ``units[k - 1]`` for a pass fed k tokens (the last entry for longer inputs, as a prompt's prefill): a
    verification pass whose cost depends on the tokens it verifies, as on a real CPU."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def charge(self, model, units):
        def hook(module, args, kwargs):
            if isinstance(units, list):
                ids = kwargs.get("input_ids", args[0] if args else None)
                k = 1 if ids is None else ids.shape[-1]
                self.now += units[min(k, len(units)) - 1]
            else:
                self.now += units

        return model.register_forward_pre_hook(hook, with_kwargs=True)

    @contextmanager
    def charging(self, *charges):
        """`charge` each ``(model, units)`` pair for the ``with`` block; the hooks are removed on exit."""
        handles = [self.charge(model, units) for model, units in charges]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()


@pytest.fixture
def fake_clock(monkeypatch) -> FakeClock:
    """A `FakeClock` every MetaSD call of the test reads (`hf_metasd.stats.CLOCK`)."""
    clock = FakeClock()
    monkeypatch.setattr(hf_metasd.stats, "CLOCK", clock)
    return clock


class StopAfter(StoppingCriteria):
    """Fires once `n` tokens were added after the prompt; records the length of every sequence it is called with."""

    def __init__(self, prompt_length: int, n: int):
        self.prompt_length, self.n, self.calls = prompt_length, n, []

    def __call__(self, input_ids, scores, **kwargs):
        self.calls.append(input_ids.shape[1])
        return torch.full((input_ids.shape[0],), input_ids.shape[1] - self.prompt_length >= self.n, dtype=torch.bool)


class StopOnToken(StoppingCriteria):
    """Fires after `token`; records the length of every sequence it is called with."""

    def __init__(self, token: int):
        self.token, self.calls = token, []

    def __call__(self, input_ids, scores, **kwargs):
        self.calls.append(input_ids.shape[1])
        return input_ids[:, -1] == self.token


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to reach the Hub fails the test (tests that push install a fake `HfApi` over this one)."""
    import hf_metasd.drafters.load as load_module
    import hf_metasd.pool.pool as pool_module

    def refuse(*args, **kwargs):
        raise AssertionError("a test tried to reach the Hugging Face Hub")

    monkeypatch.setattr(pool_module, "snapshot_download", refuse)
    monkeypatch.setattr(load_module, "snapshot_download", refuse)
    monkeypatch.setattr(pool_module, "HfApi", refuse)
