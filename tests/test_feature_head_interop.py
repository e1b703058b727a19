"""What speculators' EAGLE-3 layout means beyond its tensor names, without speculators installed: ``norm_output`` and
``fc_norm`` (load, maths, both layouts), layer ids fused in ascending order as vLLM captures them (on load and on
export), the export vLLM cannot load, EAGLE's original (SGLang) layout refused by name, and config keys this version
does not know. ``tests/test_feature_head_speculators.py`` checks the same files against speculators' own classes."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from conftest import VOCAB
from test_feature_head import (
    DRAFT_IDS,
    LAYERS,
    PROMPT,
    H,
    features_of,
    header,
    make_head,
    speculators_files,
    write_folder,
)
from transformers import LlamaForCausalLM

from hf_metasd.errors import InvalidPoolError, InvalidPoolTypeError
from hf_metasd.feature_head import (
    FeatureHead,
    FeatureHeadConfig,
    load_feature_head,
    save_feature_head,
    save_head,
    save_speculators,
)


@pytest.fixture(scope="module")
def target() -> LlamaForCausalLM:
    from conftest import tiny_llama

    return tiny_llama(0, layers=LAYERS)


def inputs(target, layer_ids):
    """The target's features at `layer_ids` over `PROMPT` (in that order) and the token after each position."""
    features, nxt = features_of(target, PROMPT, layer_ids)
    return features, torch.cat([PROMPT[:, 1:], nxt], dim=1)


def drafts(head, target, steps: int = 3):
    features, next_ids = inputs(target, head.config.layer_ids)
    return head.draft(features, next_ids, steps, cache=head.new_cache())


def same_weights(head: FeatureHead, **changes) -> FeatureHead:
    """A head of `head`'s config changed by `changes`, with `head`'s weights (new tensors random)."""
    config = FeatureHeadConfig.from_dict({**head.config.to_dict(), **changes})
    other = FeatureHead(config, head.embedding).eval()
    other.load_state_dict(head.state_dict(), strict=False)
    return other


# ======================================================================================================================
# norm_output
# ======================================================================================================================
def test_norm_output_feeds_the_normed_output_back_and_changes_only_later_steps(target):
    head = make_head(target)
    normed = same_weights(head, norm_output=True)
    features, next_ids = inputs(target, head.config.layer_ids)
    tokens, logits = normed.draft(features, next_ids, 3, cache=normed.new_cache())
    plain_tokens, plain_logits = head.draft(features, next_ids, 3, cache=head.new_cache())
    torch.testing.assert_close(logits[:, 0], plain_logits[:, 0])  # the first step reads target features only
    assert not torch.allclose(logits[:, 1], plain_logits[:, 1])  # random norm weights: o and norm(o) differ
    with torch.no_grad():  # the plain head fed norm(o) by hand drafts exactly what the norm_output head drafts
        cache = head.new_cache()
        step, out = head(head.fuse(features), next_ids, cache)
        for t in range(3):
            torch.testing.assert_close(head.to_target_logits(step[:, -1]), logits[:, t])
            step, out = head(head.norm(out[:, -1:]), tokens[:, t : t + 1], cache)


# ======================================================================================================================
# fc_norm
# ======================================================================================================================
def test_fc_norm_normalises_each_fused_layer_apart_before_fc(target):
    head = make_head(target, fc_norm=True)
    assert [name for name in head.state_dict() if name.startswith("fc_norm")] == [
        "fc_norm.0.weight",
        "fc_norm.1.weight",
        "fc_norm.2.weight",
    ]
    features, _ = inputs(target, head.config.layer_ids)
    chunks = features.split(H, dim=-1)
    normed = [torch.nn.functional.rms_norm(c, (H,), head.fc_norm[i].weight, eps=1e-6) for i, c in enumerate(chunks)]
    with torch.no_grad():
        torch.testing.assert_close(head.fuse(features), head.fc(torch.cat(normed, dim=-1)))


def _norm_output_and_fc_norm(config, tensors):
    config.update(norm_output=True, fc_norm=True)
    g = torch.Generator().manual_seed(11)
    tensors.update({f"fc_norm.{i}.weight": torch.rand(H, generator=g) + 0.5 for i in range(3)})


def test_a_speculators_head_with_norm_output_and_fc_norm_loads_and_saves_both_flags(target, tmp_path):
    tensors = speculators_files(target, tmp_path / "source")
    config = json.loads((tmp_path / "source" / "config.json").read_text())
    _norm_output_and_fc_norm(config, tensors)
    write_folder(tmp_path / "source", config, tensors)
    head = load_feature_head(tmp_path / "source", target)
    assert head.config.norm_output and head.config.fc_norm
    for name, tensor in head.state_dict().items():
        assert torch.equal(tensor, tensors[name].to(tensor.dtype)), name
    save_speculators(head, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (written["norm_output"], written["fc_norm"], written["norm_before_fc"]) == (True, True, False)
    assert header(tmp_path / "out" / "model.safetensors") == header(tmp_path / "source" / "model.safetensors")
    save_feature_head(head, tmp_path / "ours")
    for folder in (tmp_path / "out", tmp_path / "ours"):
        again = load_feature_head(folder, target)
        assert again.config == head.config
        assert torch.equal(drafts(again, target)[1], drafts(head, target)[1])


@pytest.mark.parametrize(
    "changes, error, match",
    [
        (
            {"norm_before_fc": True, "fc_norm": True},
            InvalidPoolError,
            r"`norm_before_fc` and `fc_norm` must not both be true .* but both are",
        ),
        ({"fc_norm": 1}, InvalidPoolTypeError, r"`fc_norm` must be a bool, but is 1"),
        ({"norm_output": "yes"}, InvalidPoolTypeError, r"`norm_output` must be a bool, but is 'yes'"),
    ],
)
def test_speculators_norm_flags_are_checked_by_name_before_anything_is_built(target, tmp_path, changes, error, match):
    tensors = speculators_files(target, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(changes)
    write_folder(tmp_path, config, tensors)
    with pytest.raises(error, match=match):
        load_feature_head(tmp_path, target)
    with pytest.raises(error, match=match):
        make_head(target, **changes)


@pytest.mark.parametrize(
    "change, match",
    [
        (
            lambda config, tensors: config.update(fc_norm=True),
            r"the feature head's weights are missing tensors \['fc_norm.0.weight', 'fc_norm.1.weight', "
            r"'fc_norm.2.weight'\]",
        ),
        (
            lambda config, tensors: tensors.update({"fc_norm.0.weight": torch.ones(H)}),
            r"must hold only the tensors of its config, but also hold \['fc_norm.0.weight'\]",
        ),
        (
            lambda config, tensors: (_norm_output_and_fc_norm(config, tensors), tensors.pop("fc_norm.2.weight")),
            r"missing tensors \['fc_norm.2.weight'\]",
        ),
    ],
)
def test_fc_norm_tensors_must_match_the_flag(target, tmp_path, change, match):
    tensors = speculators_files(target, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    change(config, tensors)
    write_folder(tmp_path, config, tensors)
    with pytest.raises(InvalidPoolError, match=match):
        load_feature_head(tmp_path, target)


# ======================================================================================================================
# layer order
# ======================================================================================================================
def test_a_speculators_head_fuses_its_layers_in_ascending_order_whatever_its_config_lists(target, tmp_path):
    tensors = speculators_files(target, tmp_path / "sorted")
    config = json.loads((tmp_path / "sorted" / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = [5, 2, 4]  # the same file; vLLM captures layers 2, 4, 5 in order
    write_folder(tmp_path / "unsorted", config, tensors)
    ordered, unordered = (load_feature_head(tmp_path / name, target) for name in ("sorted", "unsorted"))
    assert unordered.config.layer_ids == (2, 4, 5) and unordered.config == ordered.config
    assert torch.equal(drafts(unordered, target)[1], drafts(ordered, target)[1])


@pytest.mark.parametrize("norm", [{}, {"norm_before_fc": True}, {"fc_norm": True}])
def test_an_unsorted_head_exports_with_ascending_ids_and_fc_permuted_to_draft_the_same(target, tmp_path, norm):
    head = make_head(target, layer_ids=(5, 2, 4), **norm)
    save_speculators(head, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    loaded = load_feature_head(tmp_path, target)
    assert loaded.config.layer_ids == (2, 4, 5)
    assert not torch.equal(loaded.fc.weight, head.fc.weight)  # the columns moved with the layers
    tokens, logits = drafts(head, target)  # features concatenated as (5, 2, 4)
    again_tokens, again_logits = drafts(loaded, target)  # features concatenated as (2, 4, 5)
    assert torch.equal(tokens, again_tokens)
    torch.testing.assert_close(again_logits, logits)
    save_feature_head(head, tmp_path / "ours")  # hf_metasd's layout keeps the head's own order
    assert load_feature_head(tmp_path / "ours", target).config.layer_ids == (5, 2, 4)


# ======================================================================================================================
# what vLLM cannot load is not exported for it
# ======================================================================================================================
@pytest.mark.parametrize("layer_ids", [(4,), (2, 5), (1, 2, 4, 5)])
def test_a_head_fusing_other_than_3_layers_is_not_exported_for_vllm(target, tmp_path, layer_ids):
    head = make_head(target, layer_ids=layer_ids)
    match = (
        rf"`layer_ids` of a head saved in speculators' layout must name 3 target layers \(vLLM's EAGLE-3 reader fuses "
        rf"3\), but names {len(layer_ids)}: \[{', '.join(map(str, layer_ids))}\]\. Train the head on 3 layers, keep it "
        r"in hf_metasd's layout .* or pass `for_vllm=False`"
    )
    for save in (
        lambda: save_speculators(head, tmp_path / "refused"),
        lambda: save_head(head, tmp_path / "refused", layout="speculators"),
    ):
        with pytest.raises(InvalidPoolError, match=match):
            save()
    assert not (tmp_path / "refused").exists()  # refused before anything is written
    save_head(head, tmp_path / "ours")  # the fixes the message names: hf_metasd's layout ...
    save_speculators(head, tmp_path / "speculators", for_vllm=False)  # ... or a folder for speculators alone
    for folder in ("ours", "speculators"):
        loaded = load_feature_head(tmp_path / folder, target)
        assert loaded.config.layer_ids == layer_ids
        assert torch.equal(drafts(loaded, target)[1], drafts(head, target)[1])


# ======================================================================================================================
# EAGLE's original layout (SGLang, SpecForge) and unknown keys
# ======================================================================================================================
def test_eagles_original_layout_is_refused_by_name_with_the_conversion(target, tmp_path):
    tensors = speculators_files(target, tmp_path)
    renamed = {name.replace("layers.0.", "midlayer."): t for name, t in tensors.items()}
    config = {  # what SGLang's llama_eagle3.py and SpecForge read and write: a flat Llama config
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": H,
        "num_hidden_layers": 1,
        "vocab_size": VOCAB,
        "draft_vocab_size": len(DRAFT_IDS),
    }
    write_folder(tmp_path, config, renamed)
    (tmp_path / "model.safetensors").unlink()  # refused before the weights are looked for
    with pytest.raises(
        InvalidPoolError,
        match=r"`speculators_model_type` in .* must be \"eagle3\" \(speculators' EAGLE-3 layout\), but is missing: the "
        r"architectures \['LlamaForCausalLMEagle3'\] are EAGLE's original layout \(SGLang's and SpecForge's, "
        r"`midlayer.\*` tensors\), which hf_metasd does not read. Convert the folder with `speculators convert FOLDER "
        r"--algorithm eagle3 --verifier TARGET`",
    ):
        load_feature_head(tmp_path, target)


def test_a_key_this_version_does_not_know_is_named_in_one_warning(target, tmp_path):
    tensors = speculators_files(target, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(norm_twice=True, auto_map={"": "config.Eagle3SpeculatorConfig"}, dtype="float32", _private=1)
    write_folder(tmp_path, config, tensors)
    with pytest.warns(UserWarning) as caught:
        load_feature_head(tmp_path, target)
    messages = [str(w.message) for w in caught]
    assert (
        len(messages) == 1 and "does not know, ignored: ['norm_twice']. If one changes the head's maths" in messages[0]
    )
    del config["norm_twice"]
    write_folder(tmp_path, config, tensors)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # speculators' own metadata keys are known
        load_feature_head(tmp_path, target)
