"""Feature heads against `speculators`' own EAGLE-3 classes (``Eagle3SpeculatorConfig``, ``Eagle3DraftModel``), both
ways: a tiny head built and saved by speculators loads here and drafts the logits speculators computes, and a head
saved here (`save_speculators`) loads in speculators and computes the logits it drafts here, for every norm flag,
unsorted layer ids, the full and a reduced draft vocabulary.

speculators runs in the default suite: the README's test command installs it with ``pip install --no-deps
speculators==0.9.0 hs-connectors==0.9.0`` (speculators 0.9.0 requires ``transformers<=5.19``, torchaudio and
torchvision, none of which its EAGLE-3 classes need; what their import needs is in the ``tests`` extra). Where it is
not installed the module is skipped, and CI checks that it is.

How the two are compared: speculators' ``forward`` runs EAGLE-3's training-time test on a whole sequence (step ``t``
feeds row ``j`` the step-``t - 1`` output of row ``j`` and the token ``t`` places further on); a hook on its
``lm_head`` keeps each step's logits. `FeatureHead.draft` from the features of positions ``0 .. c`` drafts tokens
``d_1, d_2, d_3``; given the sequence ``next_ids[:c + 1] + [d_1, d_2]``, speculators' row ``c`` at steps 0, 1, 2 is
exactly that draft. Features reach speculators in ascending layer order, as vLLM captures them.
"""

from __future__ import annotations

import json
import warnings
from importlib.metadata import version

import pytest
import torch

pytest.importorskip(
    "speculators", reason="speculators is not installed: pip install --no-deps speculators==0.9.0 hs-connectors==0.9.0"
)

from conftest import VOCAB, tiny_llama  # noqa: E402
from speculators.config import SpeculatorsConfig, VerifierConfig  # noqa: E402
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig  # noqa: E402
from speculators.proposals.greedy import GreedyTokenProposalConfig  # noqa: E402
from test_feature_head import DRAFT_IDS, LAYERS, PROMPT, VD, features_of, make_head  # noqa: E402
from transformers import LlamaConfig  # noqa: E402

from hf_metasd.feature_head import FeatureHead, load_feature_head, save_speculators, vocab_map  # noqa: E402

STEPS = 3
C = PROMPT.shape[1] - STEPS  # the last committed position; speculators' rows C + 1, C + 2 hold d_1, d_2


@pytest.fixture(scope="module")
def target():
    return tiny_llama(0, layers=LAYERS)


@pytest.fixture(scope="module")
def verifier(target, tmp_path_factory):
    """The target saved to a folder: speculators' ``from_pretrained`` reads the verifier's config and embedding."""
    folder = tmp_path_factory.mktemp("verifier")
    target.save_pretrained(folder)
    return folder


@pytest.fixture(autouse=True)
def no_hub(monkeypatch):
    """Everything here is local: a download attempt fails the test."""
    import transformers.utils.hub

    def refuse(*args, **kwargs):
        raise AssertionError("a test tried to reach the Hugging Face Hub")

    monkeypatch.setattr(transformers.utils.hub, "hf_hub_download", refuse)


def layer_config() -> LlamaConfig:
    """The single decoder layer of the tiny heads (the target's shape), on PyTorch's SDPA: speculators' default flex
    attention wants sequences of 128 on the CPU."""
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
    )
    config._attn_implementation = "sdpa"
    return config


def speculators_model(target, *, layer_ids=(2, 4, 5), draft_vocab_size=VD, seed=0, **flags) -> Eagle3DraftModel:
    """A random EAGLE-3 head built with speculators' classes: random norms, the target's embedding, `DRAFT_IDS` as the
    draft vocabulary when it is smaller than the target's."""
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer_config(),
        draft_vocab_size=draft_vocab_size,
        eagle_aux_hidden_state_layer_ids=list(layer_ids),
        norm_before_residual=flags.pop("norm_before_residual", True),
        **flags,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=STEPS)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=None, architectures=["LlamaForCausalLM"]),
        ),
    )
    model = Eagle3DraftModel(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.startswith(("embed_tokens", "verifier_")):
                continue
            if name.endswith("norm.weight") or ".norm" in name or name.startswith("fc_norm"):
                param.copy_(torch.rand(param.shape, generator=g) + 0.5)
            else:
                param.copy_(torch.randn(param.shape, generator=g) * 0.2)
        model.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
    if draft_vocab_size != VOCAB:
        d2t, t2d = vocab_map(DRAFT_IDS, VOCAB)
        model.load_vocab_mappings(t2d, d2t)
    return model


def load_in_speculators(folder) -> Eagle3DraftModel:
    config = Eagle3SpeculatorConfig.from_pretrained(folder)
    config.transformer_layer_config._attn_implementation = "sdpa"
    return Eagle3DraftModel.from_pretrained(folder, config=config).eval()


def speculators_steps(model: Eagle3DraftModel, features: torch.Tensor, ids: torch.Tensor) -> list[torch.Tensor]:
    """speculators' draft-vocabulary logits ``(1, T, Vd)`` at each training-time-test step."""
    seen = []
    hook = model.lm_head.register_forward_hook(lambda module, args, out: seen.append(out.detach()))
    try:
        with torch.no_grad():
            model(hidden_states=features, input_ids=ids, document_ids=torch.zeros_like(ids), ttt_steps=STEPS)
    finally:
        hook.remove()
    return seen


def assert_same_drafts(head: FeatureHead, model: Eagle3DraftModel, target) -> None:
    """`head` drafts from the target's features in its own layer order what `model` computes from them in ascending
    layer order (module docstring)."""
    features, nxt = features_of(target, PROMPT, head.config.layer_ids)
    next_ids = torch.cat([PROMPT[:, 1:], nxt], dim=1)
    tokens, logits = head.draft(features[:, : C + 1], next_ids[:, : C + 1], STEPS, cache=head.new_cache())
    assert tokens.shape == (1, STEPS)
    ascending, _ = features_of(target, PROMPT, sorted(head.config.layer_ids))
    steps = speculators_steps(model, ascending, torch.cat([next_ids[:, : C + 1], tokens[:, : STEPS - 1]], dim=1))
    for t in range(STEPS):
        torch.testing.assert_close(head.to_target_logits(steps[t][:, C].float()), logits[:, t], atol=1e-5, rtol=1e-4)
    with torch.no_grad():  # step 0 of every committed row too
        every, _ = head(head.fuse(features[:, : C + 1]), next_ids[:, : C + 1], head.new_cache())
    torch.testing.assert_close(every, steps[0][:, : C + 1], atol=1e-5, rtol=1e-4)


VARIANTS = {
    "plain": {},
    "residual_after_norm": {"norm_before_residual": False},
    "fc_norm_and_norm_output": {"fc_norm": True, "norm_output": True},
    "norm_before_fc": {"norm_before_fc": True, "norm_output": True},
    "unsorted_layer_ids": {"layer_ids": (5, 2, 4), "fc_norm": True},
    "full_vocab": {"draft_vocab_size": VOCAB},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_head_built_and_saved_by_speculators_drafts_here_what_speculators_computes(target, tmp_path, variant):
    flags = dict(VARIANTS[variant])
    model = speculators_model(target, **flags)
    model.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["speculators_version"] == version("speculators")  # what speculators itself writes
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every key speculators writes is known
        head = load_feature_head(tmp_path, target)
    assert head.config.layer_ids == tuple(sorted(flags.get("layer_ids", (2, 4, 5))))
    for flag in ("norm_before_fc", "fc_norm", "norm_output", "norm_before_residual"):
        assert getattr(head.config, flag) == getattr(model.config, flag), flag
    assert_same_drafts(head, model, target)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_head_saved_here_loads_in_speculators_and_computes_what_it_drafts_here(target, verifier, tmp_path, variant):
    flags = dict(VARIANTS[variant])
    flags["norm_before_residual"] = flags.get("norm_before_residual", True)
    head = make_head(target, **flags)
    save_speculators(head, tmp_path, verifier_name_or_path=str(verifier), verifier_architectures=["LlamaForCausalLM"])
    model = load_in_speculators(tmp_path)
    assert model.config.eagle_aux_hidden_state_layer_ids == sorted(head.config.layer_ids)
    assert model.draft_vocab_size == head.config.draft_vocab_size
    assert_same_drafts(head, model, target)


def test_a_head_saved_for_speculators_alone_fuses_two_layers_there_too(target, verifier, tmp_path):
    head = make_head(target, layer_ids=(4, 1), norm_output=True)
    save_speculators(head, tmp_path, verifier_name_or_path=str(verifier), for_vllm=False)
    model = load_in_speculators(tmp_path)
    assert model.fc.in_features == 2 * 32
    assert_same_drafts(head, model, target)
