"""Drafters at the edges of their promises: a drafter whose context is shorter than the conversation abstains where
it ends, a LoRA drafter whose peft model adapts the target itself is refused before any compute, and a custom
drafter that returns ids outside the vocabulary or logits that are no distribution is named by a specific error."""

from __future__ import annotations

import pytest
import torch
from conftest import ENTRY_POINT, VOCAB, greedy, metasd_greedy, sharpen, tiny_llama
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from transformers import GPT2Config, GPT2LMHeadModel, OPTConfig, OPTForCausalLM

import hf_metasd
from hf_metasd.drafters import Drafter, LoraDrafter, ModelDrafter, PromptLookupDrafter
from hf_metasd.errors import DrafterCompatibilityError, MetaSDDrafterError

LORA = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)


@pytest.fixture(autouse=True)
def _both_entry_points(entry_point):
    """Every test here runs through `custom_generate=hf_metasd.generate` and through `hf_metasd.enable()`."""


@pytest.fixture
def forward_calls(target):
    calls = []
    handle = target.register_forward_pre_hook(lambda *_: calls.append(1))
    yield calls
    handle.remove()


def _prompt(length: int, seed: int = 5) -> torch.Tensor:
    """`length` tokens that repeat themselves (prompt lookup finds matches)."""
    g = torch.Generator().manual_seed(seed)
    body = torch.randint(1, VOCAB, (6,), generator=g)
    return body.repeat(length // 6 + 1)[:length][None]


# ---------------------------------------------------------------------- a drafter's context ends
CONTEXT = 16


def _short_context(family: str) -> torch.nn.Module:
    """A drafter with learned absolute positions for `CONTEXT` tokens only."""
    torch.manual_seed(3)
    if family == "gpt2":
        config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4, n_positions=CONTEXT)
        return GPT2LMHeadModel(config).eval()
    config = OPTConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=1,
        ffn_dim=64,
        num_attention_heads=4,
        max_position_embeddings=CONTEXT,
        word_embed_proj_dim=32,
        pad_token_id=0,
    )
    return OPTForCausalLM(config).eval()


@pytest.mark.parametrize("family", ["gpt2", "opt"])
def test_a_drafter_abstains_where_its_context_ends(target, family):
    """A prompt longer than the drafter's context: it abstains from every round, prompt lookup drafts, and the
    output is plain greedy output; a shorter prompt: it drafts while the conversation fits, then abstains."""
    drafter = ModelDrafter(_short_context(family), name="short")
    assert drafter.context_length == CONTEXT
    long_prompt = _prompt(20)
    out = metasd_greedy(
        target,
        long_prompt,
        12,
        assistant_models=[drafter, PromptLookupDrafter()],
        meta_policy="round_robin",
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, greedy(target, long_prompt, 12))
    assert 0 not in out.metasd.arms and any(0 in abstained for abstained in out.metasd.abstained)

    short_prompt = _prompt(10)
    out = metasd_greedy(
        target,
        short_prompt,
        16,
        assistant_models=[drafter],
        meta_policy="fixed",
        num_assistant_tokens=4,
        meta_draft_length="fixed",
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, greedy(target, short_prompt, 16))
    stats = out.metasd
    assert sum(stats.drafted) > 0 and [0] in stats.abstained  # drafted, then abstained where its context ends
    length = short_prompt.shape[1]
    for drafted, kept in zip(stats.drafted, stats.new_tokens):  # it never drafts past its last position
        assert length + drafted <= CONTEXT + 1 or drafted == 0
        length += kept


def test_a_batch_row_whose_conversation_outgrows_a_drafter_gets_plain_output(target):
    drafter = ModelDrafter(_short_context("gpt2"), name="short")
    rows = [_prompt(20)[0], _prompt(9, seed=6)[0]]
    ids = torch.zeros(2, 20, dtype=torch.long)
    mask = torch.zeros(2, 20, dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, 20 - len(row) :], mask[b, 20 - len(row) :] = row, 1
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12)
    out = metasd_greedy(
        target,
        ids,
        12,
        attention_mask=mask,
        assistant_models=[drafter, PromptLookupDrafter()],
        meta_policy="round_robin",
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, plain)


# ---------------------------------------------------------------------- a LoRA drafter on the target itself
def _adapted_target() -> tuple[torch.nn.Module, object]:
    """A fresh target wrapped in place by peft: its active adapter is "default", adapter "b" is another."""
    target = sharpen(tiny_llama(0))
    torch.manual_seed(21)
    peft_model = get_peft_model(target, LORA, adapter_name="default")
    peft_model.add_adapter("b", LORA)
    peft_model.set_adapter("default")
    return target, peft_model.eval()


def test_a_lora_drafter_on_the_target_itself_is_refused_before_compute():
    """Drafting with adapter "b" would switch the target's own adapter, and the target would verify under "b"."""
    target, peft_model = _adapted_target()
    prompt = _prompt(8)
    calls = []
    handle = target.register_forward_pre_hook(lambda *_: calls.append(1))
    with pytest.raises(
        DrafterCompatibilityError,
        match=r"drafter 'b' must run on a model apart from the target, but its peft model's adapters are in the "
        r"target's own layers \(`get_peft_model\(target, \.\.\.\)` wraps the target in place\): drafting with adapter "
        r"'b' would switch the target's active adapter, and the target would verify under it\. Load the adapters "
        r"onto a separate copy of the base model",
    ):
        metasd_greedy(
            target, prompt, 8, assistant_models=[peft_model], meta_policy="fixed", meta_policy_kwargs={"arm": 1}
        )
    handle.remove()
    assert calls == [] and peft_model.active_adapter == "default"


def test_the_fix_adapters_on_a_separate_copy_of_the_base_give_plain_output():
    target, peft_model = _adapted_target()
    prompt = _prompt(8)
    reference = greedy(target, prompt, 12)  # plain greedy under the user's active adapter
    copy = tiny_llama(0)
    copy.load_state_dict(peft_model.get_base_model().state_dict(), strict=False)  # the base weights (lora_* skipped)
    separate = get_peft_model(copy, LORA, adapter_name="b")
    set_peft_model_state_dict(separate, get_peft_model_state_dict(peft_model, adapter_name="b"), adapter_name="b")
    arm = LoraDrafter(separate.eval(), "b")
    out = metasd_greedy(target, prompt, 12, assistant_models=[arm], meta_policy="fixed", return_dict_in_generate=True)
    assert torch.equal(out.sequences, reference) and sum(out.metasd.drafted) > 0
    assert peft_model.active_adapter == "default"


# ---------------------------------------------------------------------- a custom drafter's bad output
class _Returns(Drafter):
    """Drafts `token` every step; with `nan_logits`, NaN logits for them."""

    kind = "returns_for_edge_tests"

    def __init__(self, token: int, *, nan_logits: bool = False) -> None:
        super().__init__("custom")
        self.token, self.nan_logits = token, nan_logits

    def draft(self, input_ids, num_tokens, *, logits_processor=None, do_sample=False):
        tokens = torch.full((1, num_tokens), self.token)
        if not self.nan_logits:
            return tokens, None
        return tokens, torch.full((1, num_tokens, VOCAB), float("nan"))


@pytest.mark.parametrize("token", [VOCAB, -1])
@pytest.mark.parametrize("batch", [1, 2])
def test_a_drafter_returning_ids_outside_the_vocabulary_is_named(target, forward_calls, token, batch):
    prompt = _prompt(8).repeat(batch, 1)
    with pytest.raises(
        MetaSDDrafterError,
        match=rf"drafter 'custom' must return token ids in \[0, {VOCAB}\) \(the target's vocabulary\), but returned "
        rf"{token} at draft position 0\. Fix `_Returns\.draft` to return ids of the target's vocabulary \(or an "
        r"empty draft to abstain\)\.",
    ):
        metasd_greedy(target, prompt, 8, assistant_models=[_Returns(token)], meta_policy="fixed")
    assert len(forward_calls) <= 1  # the prefill at most: the bad ids never reached the target
    out = metasd_greedy(target, prompt, 8, assistant_models=[_Returns(7)], meta_policy="fixed")  # the fix
    assert torch.equal(out, greedy(target, prompt, 8))


@pytest.mark.parametrize("do_sample", [True, False])
def test_a_drafter_returning_nan_logits_is_named(target, do_sample):
    prompt = _prompt(8)
    with pytest.raises(
        MetaSDDrafterError,
        match=r"drafter 'custom' must return logits that are a distribution at every drafted position \(a finite "
        r"largest entry\), but returned nan at draft position 0\. Return an empty draft \(it abstains from the "
        r"round\) where its logits are no distribution, or fix `_Returns\.draft`\.",
    ):
        _generate(target, prompt, do_sample=do_sample, assistant_models=[_Returns(7, nan_logits=True)])
    out = _generate(target, prompt, do_sample=do_sample, assistant_models=[_Returns(7)])  # the fix: no logits
    assert out.shape == (1, prompt.shape[1] + 8)


def _generate(target, prompt, **kwargs):
    """8 new tokens with the fixed policy and the `bd` reward (it reads the drafter's logits), through the entry
    point of the test."""
    kwargs = {"max_new_tokens": 8, "meta_policy": "fixed", "meta_reward": "bd", **kwargs}
    if ENTRY_POINT["name"] == "enable":
        hf_metasd.enable()
        return target.generate(prompt, **kwargs)
    return target.generate(prompt, custom_generate=hf_metasd.generate, **kwargs)
