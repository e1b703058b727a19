"""The EAGLE-3-style feature head (hf_metasd.feature_head): its config, its maths against a plain re-derivation of the
formula, drafting and cache rollback on a tiny target's real hidden states, the vocabulary map, both saved layouts
(hf_metasd's and speculators'), and the files a load refuses. Tiny models built from config; no network."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from conftest import VOCAB, tiny_llama
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import LlamaForCausalLM

from hf_metasd.errors import InvalidPoolError, InvalidPoolTypeError, MetaSDConfigError, MetaSDTypeError
from hf_metasd.feature_head import (
    FeatureHead,
    FeatureHeadConfig,
    FeatureRecorder,
    check_vocab_map,
    default_layer_ids,
    load_feature_head,
    round_to_bfloat16,
    save_feature_head,
    save_head,
    save_speculators,
    vocab_map,
)

H, VD, LAYERS = 32, 48, 8
DRAFT_IDS = sorted(torch.randperm(VOCAB, generator=torch.Generator().manual_seed(7))[:VD].tolist())


@pytest.fixture(scope="module")
def target() -> LlamaForCausalLM:
    """An 8-layer tiny Llama: EAGLE-3's default layers (2, 4, 5) exist."""
    return tiny_llama(0, layers=LAYERS)


def make_head(target, seed: int = 0, **overrides) -> FeatureHead:
    torch.manual_seed(seed)
    values = {"draft_vocab_size": VD, "intermediate_size": 64, **overrides}
    head = FeatureHead(FeatureHeadConfig.for_target(target, **values), target.get_input_embeddings()).eval()
    if head.config.draft_vocab_size == VD:
        head.set_vocab_map(DRAFT_IDS)
    with torch.no_grad():  # random RMSNorm weights, so that a norm applied to the wrong tensor shows
        for name, param in head.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    return head


@pytest.fixture(scope="module")
def head(target) -> FeatureHead:
    return make_head(target)


PROMPT = torch.randint(1, VOCAB, (1, 9), generator=torch.Generator().manual_seed(3))


def features_of(target, ids: torch.Tensor, layer_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's features at `layer_ids` (ids < L: transformers' hidden_states) and its greedy next token."""
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    return torch.cat([out.hidden_states[i] for i in layer_ids], dim=-1), out.logits[:, -1].argmax(-1, keepdim=True)


def prompt_inputs(target, head):
    features, nxt = features_of(target, PROMPT, head.config.layer_ids)
    return features, torch.cat([PROMPT[:, 1:], nxt], dim=1)  # the token after each position


# ======================================================================================================================
# config
# ======================================================================================================================
def test_config_round_trips_as_sorted_json_and_names_unknown_keys_once(head):
    text = head.config.to_json()
    keys = list(json.loads(text))
    assert keys == sorted(keys) and json.loads(text)["layer_ids"] == [2, 4, 5]
    assert FeatureHeadConfig.from_json(text) == head.config
    data = {**json.loads(text), "zeta": 1, "alpha": 2}
    with pytest.warns(UserWarning, match=r"does not know, ignored: \['alpha', 'zeta'\]") as record:
        assert FeatureHeadConfig.from_dict(data) == head.config
    assert len(record) == 1
    del data["hidden_size"]
    with pytest.raises(InvalidPoolError, match=r"must set every required field, but lacks \['hidden_size'\]"):
        FeatureHeadConfig.from_dict(data)


@pytest.mark.parametrize(
    "change, error, match",
    [
        ({"layer_ids": (2, 2)}, InvalidPoolError, r"`layer_ids` must be distinct, but is \[2, 2\]"),
        ({"layer_ids": ()}, InvalidPoolTypeError, r"`layer_ids` must be a list of 1 to 16 target layer ids"),
        ({"num_key_value_heads": 3}, InvalidPoolError, r"must be a multiple of `num_key_value_heads`, but .* is 3"),
        ({"draft_vocab_size": 97}, InvalidPoolError, r"`draft_vocab_size` must be an int in \[1, vocab_size = 96\]"),
        ({"hidden_size": "32"}, InvalidPoolTypeError, r"`hidden_size` must be an int in \[1, 1048576\], but is '32'"),
        ({"hidden_act": "exec"}, InvalidPoolError, r"`hidden_act` must be one of \['gelu', .*\], but is 'exec'"),
        ({"rms_norm_eps": 0.0}, InvalidPoolError, r"`rms_norm_eps` must be a float in \(0, 1\), but is 0.0"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": -1}}, InvalidPoolError, r"rope_theta.*> 0"),
        ({"norm_before_residual": 1}, InvalidPoolTypeError, r"`norm_before_residual` must be a bool, but is 1"),
    ],
)
def test_config_refuses_bad_values(head, change, error, match):
    with pytest.raises(error, match=match):
        FeatureHeadConfig(**{**head.config.to_dict(), **change})


LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 1024,
}
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 512}
LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "short_factor": [1.0] * 4,  # one per rotated pair of head_dim 8
    "long_factor": [2.0] * 4,
    "original_max_position_embeddings": 512,
}
#: rope_parameters that transformers' rotary embeddings divide by zero with, or turn into non-finite frequencies
#: (transformers only warns), or that exceed a bound; each refused when the config is built, with its message
BAD_ROPES = [
    (
        {**LLAMA3, "low_freq_factor": 0},
        r"`rope_parameters\['low_freq_factor'\]` must be a number in \(0, 1000000\], but is 0\.",
    ),
    (
        {**LLAMA3, "low_freq_factor": 4.0},
        r"`rope_parameters\['high_freq_factor'\]` must be greater than `low_freq_factor` \(llama3 divides by their "
        r"difference\), but is 4\.0 with `low_freq_factor` 4\.0\.",
    ),
    (
        {**LLAMA3, "high_freq_factor": -4.0},
        r"`rope_parameters\['high_freq_factor'\]` must be a number in \(0, 1000000\], but is -4\.0\.",
    ),
    (
        {**LLAMA3, "original_max_position_embeddings": 0},
        r"`rope_parameters\['original_max_position_embeddings'\]` must be an int in \[2, 67108864\], but is 0\.",
    ),
    (
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 0},
        r"`rope_parameters\['factor'\]` must be a number in \[1, 1000000\], but is 0\.",
    ),
    (
        {**LLAMA3, "factor": 1e7},
        r"`rope_parameters\['factor'\]` must be a number in \[1, 1000000\], but is 10000000\.0\.",
    ),
    ({**LLAMA3, "factor": float("nan")}, r"`rope_parameters\['factor'\]` must hold finite numbers, but is nan\."),
    (
        {"rope_type": "default", "rope_theta": 1e13},
        r"`rope_parameters\['rope_theta'\]` must be at most 1000000000000, but is 10000000000000\.0\.",
    ),
    (
        {**YARN, "beta_fast": -1.0},
        r"`rope_parameters\['beta_fast'\]` must be a number in \(0, 1000000\], but is -1\.0\.",
    ),
    (
        {**YARN, "mscale_all_dim": -10.0},
        r"`rope_parameters\['mscale_all_dim'\]` must be a number in \[0, 1000000\], but is -10\.0\.",
    ),
    (
        {**YARN, "rope_theta": 1.0},
        r"`rope_parameters\['rope_theta'\]` must be greater than 1 for yarn \(it divides by its logarithm\), but is 1\.0\.",
    ),
    (
        {**LONGROPE, "short_factor": [1.0, 0.0, 1.0, 1.0]},
        r"`rope_parameters\['short_factor'\]` must hold numbers in \(0, 1000000\], but is \[1\.0, 0\.0, 1\.0, 1\.0\]\.",
    ),
    (
        {**LONGROPE, "long_factor": [2.0] * 3},
        r"`rope_parameters\['long_factor'\]` must hold one number per rotated pair of a head's dimensions \(4\), but "
        r"holds 3\.",
    ),
    (
        {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0, "partial_rotary_factor": 0.25},
        r"the rotated dimensions of a head must be more than 2 for dynamic rope \(it divides by their number minus "
        r"2\), but are 2 \(`head_dim` 8 times `partial_rotary_factor`\)\.",
    ),
    (
        {**LLAMA3, "partial_rotary_factor": 1.5},
        r"`rope_parameters\['partial_rotary_factor'\]` must be a number in \(0, 1\], but is 1\.5\.",
    ),
]


@pytest.mark.parametrize("rope, match", BAD_ROPES)
def test_config_refuses_rope_parameters_that_divide_by_zero_or_exceed_a_bound(target, head, rope, match):
    with pytest.raises(InvalidPoolError, match=match + r" Fix the value, or rebuild the config"):
        FeatureHeadConfig(**{**head.config.to_dict(), "rope_parameters": rope})


def test_config_refuses_a_rope_number_of_the_wrong_type(head):
    with pytest.raises(
        InvalidPoolTypeError, match=r"`rope_parameters\['factor'\]` must be a number in \[1, 1000000\], but is '8'\."
    ):
        FeatureHeadConfig(**{**head.config.to_dict(), "rope_parameters": {**LLAMA3, "factor": "8"}})


def test_the_head_refuses_rope_parameters_that_bypassed_the_config_checks(target, head):
    """The head's own backstop (a config changed after it was checked): a division by zero, or non-finite
    frequencies, while transformers builds the rotary embedding is an InvalidPoolError too."""
    for rope, match in [
        ({**LLAMA3, "low_freq_factor": 0}, r"is refused \(ZeroDivisionError: (float )?division by zero\)\. Fix"),
        (
            {"rope_type": "linear", "rope_theta": 10000.0, "factor": 0},
            r"gives non-finite ones\. Fix `rope_parameters`",
        ),
    ]:
        config = FeatureHeadConfig(**head.config.to_dict())
        object.__setattr__(config, "rope_parameters", rope)  # past the checks
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(InvalidPoolError, match=r"`rope_parameters` must .*" + match):
                FeatureHead(config, target.get_input_embeddings())


@pytest.mark.parametrize("rope", [LLAMA3, YARN, LONGROPE, {**YARN, "truncate": False, "beta_fast": 16, "mscale": 1.0}])
def test_config_accepts_every_usual_rope_scaling_and_the_head_has_finite_frequencies(target, head, rope):
    """The fix the messages ask for: rope numbers in range build a head whose rotary frequencies are finite."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = FeatureHeadConfig(**{**head.config.to_dict(), "rope_parameters": dict(rope)})
        built = FeatureHead(config, target.get_input_embeddings())
    frequencies = [buffer for name, buffer in built.named_buffers() if name.endswith("inv_freq")]
    assert frequencies and all(bool(torch.isfinite(f).all()) for f in frequencies)


def test_config_for_target_takes_its_shape_and_eagle3_default_layers(target, head):
    assert default_layer_ids(LAYERS) == (2, 4, 5) == head.config.layer_ids
    assert (head.config.hidden_size, head.config.vocab_size, head.config.head_dim) == (H, VOCAB, 8)
    assert head.config.num_key_value_heads == 2 and head.config.rope_parameters["rope_theta"] == 10000.0
    with pytest.raises(InvalidPoolError, match=r"`layer_ids` must be given for a target of 2 layers: .* `layer_ids="):
        FeatureHeadConfig.for_target(tiny_llama(0))
    config = FeatureHeadConfig.for_target(target, layer_ids=(LAYERS + 1,))
    with pytest.raises(
        InvalidPoolError, match=r"`layer_ids` of the feature head must be in \[0, 8\] for a target of 8"
    ):
        config.check_target(target)


# ======================================================================================================================
# maths
# ======================================================================================================================
def _rms(x, w, eps=1e-6):
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def reference_pass(head, hidden: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's formula over a whole sequence of entries (no cache), written from its docstring with plain torch:
    `hidden` (N, H), `ids` (N,) -> draft logits (N, Vd), outputs o (N, H)."""
    s = {k.removeprefix("layers.0."): v for k, v in head.state_dict().items()}
    n, heads, kv, d = len(ids), 4, 2, 8
    a = torch.cat(
        [_rms(head.embedding.weight[ids], s["input_layernorm.weight"]), _rms(hidden, s["hidden_norm.weight"])], -1
    )
    q, k, v = (a @ s[f"self_attn.{p}_proj.weight"].T for p in "qkv")
    angle = torch.arange(1, n + 1)[:, None].float() / 10000.0 ** (torch.arange(0, d, 2).float() / d)
    cos, sin = torch.cat([angle, angle], -1).cos(), torch.cat([angle, angle], -1).sin()

    def rope(x):  # (n, h, d)
        half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
        return x * cos[:, None] + half * sin[:, None]

    q, k, v = rope(q.view(n, heads, d)), rope(k.view(n, kv, d)), v.view(n, kv, d)
    k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
    scores = torch.einsum("ihd,jhd->hij", q, k) / d**0.5
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    att = torch.einsum("hij,jhd->ihd", scores.softmax(-1), v).reshape(n, heads * d)
    u = hidden + att @ s["self_attn.o_proj.weight"].T
    x = _rms(u, s["post_attention_layernorm.weight"])
    out = (
        u
        + (torch.nn.functional.silu(x @ s["mlp.gate_proj.weight"].T) * (x @ s["mlp.up_proj.weight"].T))
        @ s["mlp.down_proj.weight"].T
    )
    return _rms(out, s["norm.weight"]) @ s["lm_head.weight"].T, out


def test_drafting_follows_the_formula_with_its_own_outputs_as_later_features(target, head):
    features, next_ids = prompt_inputs(target, head)
    tokens, logits = head.draft(features, next_ids, 4, cache=head.new_cache())
    with torch.no_grad():
        fused = features[0] @ head.fc.weight.T
        every, _ = head(head.fuse(features), next_ids, head.new_cache())  # each position sees itself and earlier ones
        torch.testing.assert_close(every[0], reference_pass(head, fused, next_ids[0])[0], atol=1e-5, rtol=1e-5)
        seq, ids = list(fused.unbind()), list(next_ids[0])
        for step in range(4):  # training-time test: the head's own output o is the next entry's feature
            ref_logits, out = reference_pass(head, torch.stack(seq), torch.stack(ids))
            ref = head.to_target_logits(ref_logits[-1])
            torch.testing.assert_close(logits[0, step], ref, atol=1e-5, rtol=1e-5)
            assert int(tokens[0, step]) == int(ref.argmax())
            seq.append(out[-1])
            ids.append(tokens[0, step])


def test_the_vocab_map_sends_draft_ids_to_their_target_ids(head):
    assert head.draft_to_target(torch.arange(VD)).tolist() == DRAFT_IDS
    assert head.in_draft_vocab(torch.arange(VOCAB)).nonzero().flatten().tolist() == DRAFT_IDS
    draft_logits = torch.randn(2, VD)
    logits = head.to_target_logits(draft_logits)
    assert logits.shape == (2, VOCAB) and torch.equal(logits[:, DRAFT_IDS], draft_logits)
    outside = [t for t in range(VOCAB) if t not in DRAFT_IDS]
    assert torch.isneginf(logits[:, outside]).all()
    d2t, t2d = vocab_map([9, 2, 40], VOCAB)  # any order: d2t holds offsets, negative ones too
    assert (torch.arange(3) + d2t).tolist() == [9, 2, 40] and t2d.sum() == 3
    with pytest.raises(InvalidPoolError, match=r"must map draft ids to distinct target ids, but repeats some"):
        vocab_map([9, 9], VOCAB)
    with pytest.raises(InvalidPoolError, match=r"must map every draft id to a target id in \[0, 96\), but maps to"):
        vocab_map([3, 96], VOCAB)


def test_drafting_is_deterministic_and_a_rolled_back_cache_gives_a_fresh_runs_logits(target, head):
    features, next_ids = prompt_inputs(target, head)
    fresh = head.draft(features, next_ids, 3, cache=head.new_cache())
    again = head.draft(features, next_ids, 3, cache=head.new_cache())
    assert torch.equal(fresh[0], again[0]) and torch.equal(fresh[1], again[1])
    assert set(fresh[0].flatten().tolist()) <= set(DRAFT_IDS)
    # a round over the first 5 positions drafts 3 tokens (speculative entries); the next round is fed the rest of
    # the positions and drops those entries itself (start = cache.committed)
    cache = head.new_cache()
    head.draft(features[:, :5], next_ids[:, :5], 3, cache=cache)
    assert (cache.length, cache.committed) == (7, 5)
    resumed = head.draft(features[:, 5:], next_ids[:, 5:], 3, cache=cache)
    torch.testing.assert_close(resumed[1], fresh[1], atol=1e-5, rtol=1e-5)
    assert torch.equal(resumed[0], fresh[0])
    cache.crop(2)  # an explicit rollback to position 2
    rolled = head.draft(features[:, 2:], next_ids[:, 2:], 3, cache=cache, start=2)
    torch.testing.assert_close(rolled[1], fresh[1], atol=1e-5, rtol=1e-5)


def test_sampling_is_seeded_and_a_logits_processor_steers_every_step(target, head):
    features, next_ids = prompt_inputs(target, head)

    def draw(seed):
        generator = torch.Generator().manual_seed(seed)
        return head.draft(features, next_ids, 5, cache=head.new_cache(), do_sample=True, generator=generator)[0]

    assert torch.equal(draw(1), draw(1)) and set(draw(1).flatten().tolist()) <= set(DRAFT_IDS)
    seen = []

    def only_the_last_draft_id(input_ids, scores):
        seen.append(input_ids.shape[1])
        keep = torch.full_like(scores, float("-inf"))
        keep[:, DRAFT_IDS[-1]] = 0.0
        return scores + keep

    tokens, logits = head.draft(
        features, next_ids, 3, cache=head.new_cache(), input_ids=PROMPT, logits_processor=only_the_last_draft_id
    )
    assert tokens.tolist() == [[DRAFT_IDS[-1]] * 3] and seen == [9, 10, 11]
    assert torch.isfinite(logits[0, :, DRAFT_IDS[-1]]).all() and torch.isneginf(logits[0, :, DRAFT_IDS[0]]).all()


@pytest.mark.parametrize("do_sample", [False, True])
def test_a_step_without_a_distribution_ends_the_draft_before_its_token(target, head, do_sample):
    """A processor that masks the whole draft vocabulary from the second step on (or from the first) ends the draft
    there: one token, or none (the drafter then abstains), and never a `multinomial` error."""
    features, next_ids = prompt_inputs(target, head)

    def mask_from(step):
        def processor(input_ids, scores):
            return torch.full_like(scores, float("-inf")) if input_ids.shape[1] - PROMPT.shape[1] >= step else scores

        return processor

    one, logits = head.draft(
        features,
        next_ids,
        3,
        cache=head.new_cache(),
        input_ids=PROMPT,
        logits_processor=mask_from(1),
        do_sample=do_sample,
    )
    assert one.shape == (1, 1) and logits.shape == (1, 1, VOCAB) and int(one[0, 0]) in DRAFT_IDS
    none, logits = head.draft(
        features,
        next_ids,
        3,
        cache=head.new_cache(),
        input_ids=PROMPT,
        logits_processor=mask_from(0),
        do_sample=do_sample,
    )
    assert none.shape == (1, 0) and logits.shape == (1, 0, VOCAB)


def test_draft_refuses_bad_arguments(target, head):
    features, next_ids = prompt_inputs(target, head)
    with pytest.raises(MetaSDConfigError, match=r"`features` must have shape \(B, T, 96\) \(the target's layers"):
        head.draft(features[..., :64], next_ids, 2, cache=head.new_cache())
    with pytest.raises(MetaSDConfigError, match=r"`start` must be an int in \[0, 0\] \(the entries made from target"):
        head.draft(features, next_ids, 2, cache=head.new_cache(), start=3)
    with pytest.raises(
        MetaSDConfigError, match=r"`length` must be an int in \[0, 0\] \(the cache's length\), but is 1"
    ):
        head.new_cache().crop(1)
    with pytest.raises(MetaSDConfigError, match=r"`input_ids` must be given with `logits_processor`"):
        head.draft(features, next_ids, 2, cache=head.new_cache(), logits_processor=lambda i, s: s)


def test_the_recorder_hands_over_the_layer_inputs_without_output_hidden_states(target):
    with torch.no_grad():
        out = target(PROMPT, output_hidden_states=True)
        with FeatureRecorder(target, (0, 4, LAYERS)) as recorder:
            target(PROMPT)
    features = recorder.features()
    assert features.shape == (1, PROMPT.shape[1], 3 * H)
    torch.testing.assert_close(features[..., :H], out.hidden_states[0])
    torch.testing.assert_close(features[..., H : 2 * H], out.hidden_states[4])
    # id L is the final norm's input: transformers' hidden_states[L] is after that norm
    torch.testing.assert_close(target.model.norm(features[..., 2 * H :]), out.hidden_states[LAYERS])
    assert not target.model.layers[4]._forward_pre_hooks, "leaving the block removes the hooks"


# ======================================================================================================================
# saving and loading
# ======================================================================================================================
@pytest.mark.parametrize("layout", ["hf_metasd", "speculators"])
def test_a_config_larger_than_its_files_is_refused_before_the_head_is_built(
    target, head, tmp_path, monkeypatch, layout
):
    """A config that claims a 2**20-wide MLP over files of a 64-wide one: the files are checked against the config's
    shapes (meta tensors, no memory) before a head is built, so the load allocates nothing of that size."""
    from hf_metasd.feature_head import layout as layout_module
    from hf_metasd.feature_head import speculators as speculators_module

    save_head(head, tmp_path, layout=layout)
    name = "feature_head_config.json" if layout == "hf_metasd" else "config.json"
    config = json.loads((tmp_path / name).read_text())
    (config if layout == "hf_metasd" else config["transformer_layer_config"])["intermediate_size"] = 2**20
    (tmp_path / name).write_text(json.dumps(config))

    def built(*args):
        raise AssertionError("a head was built before its files were checked")

    monkeypatch.setattr(layout_module, "new_head", built)
    monkeypatch.setattr(speculators_module, "new_head", built)
    with pytest.raises(
        InvalidPoolError, match=r"`layers.0.mlp.down_proj.weight` in .* must have shape \(32, 1048576\)"
    ):
        load_feature_head(tmp_path, target)


def test_hf_metasd_layout_round_trip_gives_identical_logits(target, head, tmp_path):
    save_head(head, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["feature_head.safetensors", "feature_head_config.json"]
    loaded = load_feature_head(tmp_path, target)
    assert loaded.config == head.config and loaded.embedding is target.get_input_embeddings()
    features, next_ids = prompt_inputs(target, head)
    a, b = (
        head.draft(features, next_ids, 3, cache=head.new_cache()),
        loaded.draft(features, next_ids, 3, cache=loaded.new_cache()),
    )
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_a_head_rounded_to_bfloat16_is_stored_in_half_the_bytes_and_loads_back_unchanged(target, head, tmp_path):
    import copy

    embedding = target.get_input_embeddings().weight.clone()
    rounded = round_to_bfloat16(copy.deepcopy(head))
    assert torch.equal(target.get_input_embeddings().weight, embedding)  # the target's embedding is not the head's
    assert not torch.equal(rounded.fc.weight, head.fc.weight)  # random float32 weights are no bfloat16 numbers
    save_head(head, tmp_path / "full")
    save_head(rounded, tmp_path / "rounded")
    dtypes = {}
    for name in ("full", "rounded"):
        with safe_open(str(tmp_path / name / "feature_head.safetensors"), "pt") as f:
            dtypes[name] = {key: f.get_slice(key).get_dtype() for key in f.keys()}  # noqa: SIM118
    assert dtypes["rounded"]["fc.weight"] == "BF16" and dtypes["full"]["fc.weight"] == "F32"
    assert {k: v for k, v in dtypes["rounded"].items() if v != "BF16"} == {
        k: v for k, v in dtypes["full"].items() if v != "F32"
    }  # only the float weights change, the vocabulary maps stay integers
    sizes = {name: (tmp_path / name / "feature_head.safetensors").stat().st_size for name in dtypes}
    assert sizes["rounded"] < 0.6 * sizes["full"]
    loaded = load_feature_head(tmp_path / "rounded", target)
    assert loaded.fc.weight.dtype == torch.float32
    for key, tensor in rounded.base_state_dict().items():
        assert torch.equal(loaded.base_state_dict()[key], tensor), key


def speculators_files(target, folder: Path, seed: int = 5) -> dict[str, torch.Tensor]:
    """A head folder as speculators writes one (names, shapes, config keys of its Eagle3 config), built without
    hf_metasd: 3 fused layers of H = 32, 4 heads of 8 (2 kv heads), MLP 64, Vd = 48 of V = 96."""
    g = torch.Generator().manual_seed(seed)
    shapes = {
        "fc.weight": (H, 3 * H),
        "layers.0.self_attn.q_proj.weight": (32, 2 * H),
        "layers.0.self_attn.k_proj.weight": (16, 2 * H),
        "layers.0.self_attn.v_proj.weight": (16, 2 * H),
        "layers.0.self_attn.o_proj.weight": (H, 32),
        "layers.0.mlp.gate_proj.weight": (64, H),
        "layers.0.mlp.up_proj.weight": (64, H),
        "layers.0.mlp.down_proj.weight": (H, 64),
        "layers.0.input_layernorm.weight": (H,),
        "layers.0.hidden_norm.weight": (H,),
        "layers.0.post_attention_layernorm.weight": (H,),
        "norm.weight": (H,),
        "lm_head.weight": (VD, H),
    }
    tensors = {name: torch.randn(shape, generator=g) * 0.2 for name, shape in shapes.items()}
    tensors["d2t"], tensors["t2d"] = vocab_map(DRAFT_IDS, VOCAB)
    tensors["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()
    config = {
        "architectures": ["Eagle3Speculator"],
        "draft_vocab_size": VD,
        "eagle_aux_hidden_state_layer_ids": [2, 4, 5],
        "embed_requires_grad": False,
        "has_no_defaults_at_init": False,
        "norm_before_residual": True,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {"accept_tolerance": 0.0, "proposal_type": "greedy", "speculative_tokens": 3, "verifier_accept_k": 1}
            ],
            "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": "tiny/llama"},
        },
        "speculators_model_type": "eagle3",
        "speculators_version": "0.3.0",
        "target_hidden_size": None,
        "torch_dtype": "float32",
        # LlamaConfig.to_diff_dict(): hidden_act, rms_norm_eps, rope_theta... equal the defaults and are left out
        "transformer_layer_config": {
            "head_dim": 8,
            "hidden_size": H,
            "intermediate_size": 64,
            "model_type": "llama",
            "num_attention_heads": 4,
            "num_hidden_layers": 1,
            "num_key_value_heads": 2,
            "vocab_size": VOCAB,
        },
        "transformers_version": "4.56.0",
    }
    write_folder(folder, config, tensors)
    return tensors


def write_folder(folder: Path, config, tensors) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config) if not isinstance(config, str) else config)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))


def header(path: Path) -> dict[str, tuple]:
    with safe_open(str(path), framework="pt") as f:
        return {name: (tuple(f.get_slice(name).get_shape()), f.get_slice(name).get_dtype()) for name in f.keys()}  # noqa: SIM118


def test_a_speculators_head_loads_and_saves_back_in_its_own_layout(target, tmp_path):
    source = tmp_path / "source"
    tensors = speculators_files(target, source)
    head = load_feature_head(source, target)
    assert (
        head.config.layer_ids == (2, 4, 5) and head.config.norm_before_residual and head.config.draft_vocab_size == VD
    )
    assert head.draft_to_target(torch.arange(VD)).tolist() == DRAFT_IDS
    for name, tensor in head.state_dict().items():
        assert torch.equal(tensor, tensors[name].to(tensor.dtype)), name
    save_speculators(head, tmp_path / "out", verifier_name_or_path="tiny/llama")
    assert header(tmp_path / "out" / "model.safetensors") == header(source / "model.safetensors")
    written, original = (json.loads((f / "config.json").read_text()) for f in (tmp_path / "out", source))
    for key in ("architectures", "draft_vocab_size", "eagle_aux_hidden_state_layer_ids", "norm_before_residual"):
        assert written[key] == original[key], key
    assert written["speculators_config"]["verifier"]["name_or_path"] == "tiny/llama"
    layer = written["transformer_layer_config"]
    assert {k: layer[k] for k in original["transformer_layer_config"]} == original["transformer_layer_config"]
    again = load_feature_head(tmp_path / "out", target)
    features, next_ids = prompt_inputs(target, head)
    a, b = (
        head.draft(features, next_ids, 3, cache=head.new_cache()),
        again.draft(features, next_ids, 3, cache=again.new_cache()),
    )
    assert again.config == head.config and torch.equal(a[1], b[1])


def test_early_and_gpt_oss_style_heads_load_with_fc_bias_and_input_norm_and_from_shards(target, tmp_path):
    tensors = speculators_files(target, tmp_path / "source")
    config = json.loads((tmp_path / "source" / "config.json").read_text())
    config["norm_before_fc"] = True
    tensors["input_norm.weight"], tensors["fc.bias"] = torch.rand(3 * H) + 0.5, torch.randn(H)
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "config.json").write_text(json.dumps(config))
    names = sorted(tensors)
    for i, part in enumerate((names[:7], names[7:])):
        save_file({n: tensors[n].contiguous() for n in part}, str(shards / f"model-0000{i + 1}-of-00002.safetensors"))
    weight_map = {n: f"model-0000{1 + (n in names[7:])}-of-00002.safetensors" for n in names}
    (shards / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    head = load_feature_head(shards, target)
    assert head.config.norm_before_fc and head.config.fc_bias
    assert torch.equal(head.input_norm.weight, tensors["input_norm.weight"]) and torch.equal(
        head.fc.bias, tensors["fc.bias"]
    )
    save_speculators(head, tmp_path / "out")
    assert set(header(tmp_path / "out" / "model.safetensors")) == set(names)
    features, next_ids = prompt_inputs(target, head)
    with torch.no_grad():
        expected = head.fc(torch.nn.functional.rms_norm(features, (3 * H,), head.input_norm.weight, eps=1e-6))
    torch.testing.assert_close(head.fuse(features), expected)


def test_a_full_vocab_head_saves_without_maps_and_embedding_when_asked(target, tmp_path):
    head = make_head(target, draft_vocab_size=VOCAB)
    save_speculators(head, tmp_path, include_embedding=False)
    names = set(header(tmp_path / "model.safetensors"))
    assert not names & {"d2t", "t2d", "embed_tokens.weight"} and "fc.weight" in names
    loaded = load_feature_head(tmp_path, target)
    assert loaded.draft_to_target(torch.arange(VOCAB)).tolist() == list(range(VOCAB))


def test_missing_layer_ids_take_eagle3s_default_with_a_warning(target, tmp_path):
    tensors = speculators_files(target, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = None
    write_folder(tmp_path, config, tensors)
    with pytest.warns(
        UserWarning, match=r"names no `eagle_aux_hidden_state_layer_ids`; using EAGLE-3's default \[2, 4, 5\]"
    ):
        assert load_feature_head(tmp_path, target).config.layer_ids == (2, 4, 5)


def _set(path, value):
    def change(config, tensors):
        node = config
        for key in path[:-1]:
            node = node[key]
        if value is KeyError:
            del node[path[-1]]
        else:
            node[path[-1]] = value

    return change


def _tensor(name, value):
    def change(config, tensors):
        if value is None:
            del tensors[name]
        else:
            tensors[name] = value

    return change


@pytest.mark.parametrize(
    "change, match",
    [
        (
            _set(["transformer_layer_config", "hidden_size"], 64),
            r"`transformer_layer_config.hidden_size` .* must be the target's hidden size 32, but is 64",
        ),
        (_tensor("lm_head.weight", None), r"the feature head's weights are missing tensors \['lm_head.weight'\]"),
        (
            _tensor("fc.weight", torch.zeros(H, 2 * H)),
            r"`fc.weight` in 'model.safetensors' must have shape \(32, 96\) .* but has shape \(32, 64\)",
        ),
        (
            _tensor("t2d", torch.ones(VOCAB)),
            r"`t2d` in 'model.safetensors' must have shape \(96,\) and a dtype in \['BOOL'\]",
        ),
        (
            _tensor("layers.1.mlp.up_proj.weight", torch.zeros(1)),
            r"must hold only the tensors of its config, but also hold \['layers.1.mlp.up_proj.weight'\]",
        ),
        (
            _tensor("embed_tokens.weight", torch.zeros(VOCAB, 64)),
            r"`embed_tokens.weight` .* must have shape \(96, 32\)",
        ),
        (
            _tensor("d2t", torch.full((VD,), 90)),
            r"`d2t` / `t2d` of the EAGLE-3 head .* must map every draft id to a target id in \[0, 96\)",
        ),
        (
            _set(["speculators_model_type"], "medusa"),
            r'`speculators_model_type` in .* must be "eagle3", but is \'medusa\'',
        ),
        (
            _set(["transformer_layer_config", "model_type"], "qwen3"),
            r'`transformer_layer_config.model_type` in .* must be "llama"',
        ),
        (
            _set(["transformer_layer_config", "num_hidden_layers"], KeyError),
            r"`transformer_layer_config.num_hidden_layers` in .* must be 1 .* but is 32",
        ),
        (
            _set(["norm_before_residual"], KeyError),
            r"must set `norm_before_residual` \(speculators and vLLM default it differently\)",
        ),
        (
            _set(["embed_requires_grad"], True),
            r"`embed_requires_grad` in .* must be false \(the head shares the target's embedding\)",
        ),
        (
            _set(["eagle_aux_hidden_state_layer_ids"], [2, 4, 9]),
            r"`layer_ids` of the EAGLE-3 head .* must be in \[0, 8\] for a target of 8 layers",
        ),
        (
            _set(["transformer_layer_config", "vocab_size"], 128),
            r"`vocab_size` of the EAGLE-3 head .* must be the target's vocabulary size 96, but is 128",
        ),
    ],
)
def test_bad_speculators_files_are_refused(target, tmp_path, change, match):
    tensors = speculators_files(target, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    change(config, tensors)
    write_folder(tmp_path, config, tensors)
    with pytest.raises(InvalidPoolError, match=match):
        load_feature_head(tmp_path, target)


def test_unreadable_or_pickled_files_are_refused(target, head, tmp_path):
    speculators_files(target, tmp_path / "json")
    (tmp_path / "json" / "config.json").write_text("{not json")
    with pytest.raises(
        InvalidPoolError, match=r"must find a readable file at .*config.json', but reading it failed \(JSONDecodeError"
    ):
        load_feature_head(tmp_path / "json", target)
    speculators_files(target, tmp_path / "bin")
    (tmp_path / "bin" / "model.safetensors").rename(tmp_path / "bin" / "pytorch_model.bin")
    with pytest.raises(
        InvalidPoolError, match=r"finds only pickled files \['pytorch_model.bin'\], which are never loaded"
    ):
        load_feature_head(tmp_path / "bin", target)
    save_feature_head(head, tmp_path / "ours")
    (tmp_path / "ours" / "feature_head.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(InvalidPoolError, match=r"feature_head.safetensors', but reading it failed"):
        load_feature_head(tmp_path / "ours", target)
    with pytest.raises(
        InvalidPoolError, match=r"must hold feature_head_config.json .* or config.json .* but holds neither"
    ):
        load_feature_head(tmp_path / "nothing", target)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a well-formed head of hf_metasd's layout loads without a warning
        save_feature_head(head, tmp_path / "ok")
        load_feature_head(tmp_path / "ok", target)


def _speculators_case(change):
    """A speculators folder changed by `change(config, tensors)`."""

    def build(target, folder):
        tensors = speculators_files(target, folder)
        config = json.loads((folder / "config.json").read_text())
        change(config, tensors)
        write_folder(folder, config, tensors)

    return build


def _full_vocab_with_d2t_only(config, tensors):
    config["draft_vocab_size"] = VOCAB
    tensors["lm_head.weight"] = torch.zeros(VOCAB, H)
    tensors["d2t"] = torch.zeros(VOCAB, dtype=torch.long)
    del tensors["t2d"]


def _shards(index):
    def build(target, folder):
        tensors = speculators_files(target, folder)
        (folder / "model.safetensors").unlink()
        if index is not None:
            save_file({"fc.weight": tensors["fc.weight"]}, str(folder / "a.safetensors"))
            save_file({"fc.weight": tensors["fc.weight"]}, str(folder / "b.safetensors"))
            (folder / "model.safetensors.index.json").write_text(json.dumps(index))

    return build


@pytest.mark.parametrize(
    "build, match",
    [
        (
            _speculators_case(_set(["transformer_layer_config"], [])),
            r"`transformer_layer_config` in .* must be an object",
        ),
        (
            _speculators_case(_set(["target_hidden_size"], 64)),
            r"`target_hidden_size` in .* must be null or the head's hidden size 32, but is 64",
        ),
        (
            _speculators_case(_set(["transformer_layer_config", "rope_parameters"], 5)),
            r"`rope_parameters` in .* must be an object, but is 5",
        ),
        (
            _speculators_case(_set(["transformer_layer_config", "rope_scaling"], "x")),
            r"`rope_scaling` in .* must be an object or null, but is 'x'",
        ),
        (_speculators_case(_full_vocab_with_d2t_only), r"must hold both `d2t` and `t2d` or neither"),
        (_shards(None), r"must find its weights in .*model.safetensors' \(safetensors\), but there is none"),
        (
            _shards({"weight_map": {"fc.weight": "../x.safetensors"}}),
            r"must have a `weight_map` of tensor names to \.safetensors file names in the folder",
        ),
        (
            _shards({"weight_map": {"fc.weight": "a.safetensors", "x": "b.safetensors"}}),
            r"`fc.weight` must be in one weight file, but is in 'a.safetensors' and 'b.safetensors'",
        ),
    ],
)
def test_more_bad_speculators_folders_are_refused(target, tmp_path, build, match):
    build(target, tmp_path)
    with pytest.raises(InvalidPoolError, match=match):
        load_feature_head(tmp_path, target)


def test_json_files_are_bounded(target, tmp_path, monkeypatch):
    import hf_metasd.feature_head.io as io

    speculators_files(target, tmp_path)
    (tmp_path / "config.json").write_text("[" * 20 + "]" * 20)
    with pytest.raises(InvalidPoolError, match=r"config.json' must nest at most 16 deep, but nests deeper"):
        load_feature_head(tmp_path, target)
    monkeypatch.setattr(io, "MAX_JSON_BYTES", 10)
    with pytest.raises(InvalidPoolError, match=r"config.json' must hold at most 10 bytes, but has 40"):
        load_feature_head(tmp_path, target)


def test_every_other_message_is_pinned(target, head):
    config = head.config.to_dict()
    features, next_ids = prompt_inputs(target, head)
    cases = [
        (
            InvalidPoolTypeError,
            r"`rope_parameters` must be a dict with a string `rope_type`, but is \[1\]",
            lambda: FeatureHeadConfig(**{**config, "rope_parameters": [1]}),
        ),
        (
            InvalidPoolTypeError,
            r"`rope_parameters` must map names to numbers or strings, but 'x' is \{'a': 1\}",
            lambda: FeatureHeadConfig(
                **{**config, "rope_parameters": {"rope_type": "default", "rope_theta": 1.0, "x": {"a": 1}}}
            ),
        ),
        (
            InvalidPoolTypeError,
            r"the feature head config must be a JSON object, but is list",
            lambda: FeatureHeadConfig.from_dict([1]),
        ),
        (
            InvalidPoolError,
            r"`target` must be a Llama-family causal LM .* but is Linear",
            lambda: FeatureHeadConfig.for_target(torch.nn.Linear(2, 2)),
        ),
        (
            InvalidPoolError,
            r"`hidden_size` of the feature head must be the target's hidden size 32, but is 64",
            lambda: FeatureHeadConfig(**{**config, "hidden_size": 64}).check_target(target),
        ),
        (
            InvalidPoolError,
            r"`embedding` must be the target's input embedding of shape \(96, 32\), but is Embedding of shape \(10, 32\)",
            lambda: FeatureHead(head.config, torch.nn.Embedding(10, 32)),
        ),
        (
            InvalidPoolError,
            r"`rope_parameters` must be rotary settings transformers' Llama accepts, but .* is refused \(KeyError",
            lambda: FeatureHead(
                FeatureHeadConfig(**{**config, "rope_parameters": {"rope_type": "no-such-rope", "rope_theta": 1.0}}),
                target.get_input_embeddings(),
            ),
        ),
        (
            InvalidPoolError,
            r"`target_ids` must hold draft_vocab_size = 48 ids, but holds 2",
            lambda: head.set_vocab_map([1, 2]),
        ),
        (
            InvalidPoolError,
            r"`x` must have `t2d` marking exactly the 2 target ids `d2t` maps to, but marks 0",
            lambda: check_vocab_map(
                torch.zeros(2, dtype=torch.long), torch.zeros(VOCAB, dtype=torch.bool), VOCAB, "`x`"
            ),
        ),
        (
            MetaSDConfigError,
            r"`next_ids` must have shape \(B, T\) with T >= 1 and `features` \(B, T, kH\), but they have \(1, 3\) and \(1, 9, 96\)",
            lambda: head.draft(features, next_ids[:, :3], 2, cache=head.new_cache()),
        ),
        (
            MetaSDTypeError,
            r"`num_tokens` must be an int >= 1, but is 0",
            lambda: head.draft(features, next_ids, 0, cache=head.new_cache()),
        ),
        (
            MetaSDConfigError,
            r'`layout` must be "hf_metasd" \(no keyword arguments\) or "speculators", but is \'onnx\'',
            lambda: save_head(head, "unused", layout="onnx"),
        ),
        (
            InvalidPoolError,
            r"`layer_ids` must be in \[0, 8\] for a target of 8 layers, but is \[9\]",
            lambda: FeatureRecorder(target, (9,)),
        ),
        (
            MetaSDConfigError,
            r"`features\(\)` must follow a forward pass of the target inside `with recorder:`",
            lambda: FeatureRecorder(target, (2,)).features(),
        ),
    ]
    for error, match, call in cases:
        with pytest.raises(error, match=match):
            call()
    recorder = FeatureRecorder(target, (2, LAYERS))
    with recorder, torch.no_grad():
        with pytest.raises(MetaSDConfigError, match=r"a `FeatureRecorder` must be entered once at a time"):
            recorder.__enter__()
        target(PROMPT)
        target.model.norm(torch.zeros(1, 3, H))  # the norm alone: its slot now holds another pass's tokens
        with pytest.raises(MetaSDConfigError, match=r"the recorded layers must come from one pass, but have shapes"):
            recorder.features()
