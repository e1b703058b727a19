"""The feature head as a drafter kind (issue 34): lossless in `generate` through both entry points, the target's
features recorded during verification only (hooks gone after the call, also when it raises; none at all without a
feature-head drafter), every feature-head drafter of a call fed, a pool round trip, and the kind's errors."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from conftest import VOCAB, greedy, metasd_greedy, prompts, tiny_llama
from torch.nn import functional as F

import hf_metasd
import hf_metasd.decoding
from hf_metasd import DrafterCompatibilityError, InvalidPoolError, MetaSDConfigError
from hf_metasd.drafters import DrafterSpec, FeatureHeadDrafter, ModelDrafter, PromptLookupDrafter
from hf_metasd.feature_head import FeatureHead, FeatureHeadConfig, FeatureRecorder
from hf_metasd.pool import DrafterPool

MAX_NEW = 20
PROMPTS = prompts(4, seed=77)
_HEADS: dict[tuple[int, tuple[int, ...]], FeatureHead] = {}


def trained_head(target, layer_ids: tuple[int, ...] = (1, 2)) -> FeatureHead:
    """A head trained for ~1 s on `target`'s own greedy answers (cached per target and layers): for each position
    ``j`` it learns the target's choice after position ``j + 1`` from the feature at ``j`` and the token at ``j + 1``
    (the first drafting step of `FeatureHead.draft`), so that it drafts what the target keeps, often."""
    key = (id(target), tuple(layer_ids))
    if key not in _HEADS:
        g = torch.Generator().manual_seed(0)
        prompt = torch.randint(1, VOCAB, (48, 4), generator=g)
        seqs = target.generate(prompt, do_sample=False, max_new_tokens=24, attention_mask=torch.ones_like(prompt))
        with torch.no_grad(), FeatureRecorder(target, layer_ids) as recorder:
            choices = target(seqs).logits.argmax(-1)
        features = recorder.features()
        torch.manual_seed(0)
        head = FeatureHead(FeatureHeadConfig.for_target(target, layer_ids=layer_ids), target.get_input_embeddings())
        optimizer = torch.optim.Adam(head.parameters(), lr=5e-3)
        for _ in range(150):
            logits, _ = head(head.fuse(features[:, :-1]), seqs[:, 1:], head.new_cache())
            loss = F.cross_entropy(logits.flatten(0, 1), choices[:, 1:].flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        _HEADS[key] = head.eval().requires_grad_(False)
    return _HEADS[key]


def random_head(target, layer_ids: tuple[int, ...] = (2,), seed: int = 3) -> FeatureHead:
    """An untrained head (EAGLE-1's choice of layers by default: the top layer's output)."""
    torch.manual_seed(seed)
    config = FeatureHeadConfig.for_target(target, layer_ids=layer_ids)
    return FeatureHead(config, target.get_input_embeddings()).eval()


def _pre_hooks(model) -> int:
    return sum(len(module._forward_pre_hooks) for module in model.modules())


@pytest.fixture(scope="module")
def references(target):
    return [greedy(target, p, MAX_NEW) for p in PROMPTS]


# ---------------------------------------------------------------------------------------------------------------------
# lossless, and drafting from the second round on
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("entry", ["custom_generate", "enable"])
def test_greedy_output_is_the_targets_and_the_head_drafts_from_round_two(target, references, entry):
    drafter = FeatureHeadDrafter(trained_head(target))
    accepted = 0
    for prompt, reference in zip(PROMPTS, references):
        kwargs = {"assistant_models": [drafter], "meta_policy": "fixed", "return_dict_in_generate": True}
        if entry == "enable":
            hf_metasd.enable()
            out = target.generate(prompt, do_sample=False, max_new_tokens=MAX_NEW, **kwargs)
        else:
            out = metasd_greedy(target, prompt, MAX_NEW, **kwargs)
        assert torch.equal(out.sequences, reference)
        stats = out.metasd
        assert stats.abstained[0] == [0] and stats.drafted[0] == 0  # no feature yet: the first round abstains
        assert all(n > 0 for n in stats.drafted[1:-1])  # then it drafts every round (the last may be cut)
        accepted += sum(stats.accepted)
    assert accepted > 0  # a trained head drafts what the target keeps
    assert _pre_hooks(target) == 0


def test_an_untrained_head_on_the_top_layer_is_lossless(target, references):
    drafter = FeatureHeadDrafter(random_head(target), name="eagle1")
    for prompt, reference in zip(PROMPTS, references):
        out = metasd_greedy(target, prompt, MAX_NEW, assistant_models=[drafter], return_dict_in_generate=True)
        assert torch.equal(out.sequences, reference)
        assert out.metasd.drafter_names == ["eagle1", "no_draft"]


def test_sampling_runs_and_drafts(target):
    drafter = FeatureHeadDrafter(trained_head(target))
    torch.manual_seed(0)
    out = target.generate(
        PROMPTS[0],
        do_sample=True,
        top_k=0,
        temperature=0.7,
        max_new_tokens=MAX_NEW,
        custom_generate=hf_metasd.generate,
        assistant_models=[drafter],
        meta_policy="fixed",
        return_dict_in_generate=True,
    )
    assert out.sequences.shape[1] == PROMPTS[0].shape[1] + MAX_NEW
    assert sum(out.metasd.drafted) > 0 and sum(out.metasd.accepted) > 0


def test_a_mixed_pool_is_lossless_and_every_feature_head_is_fed_every_round(target, references):
    """Two feature heads on different layers, prompt lookup and a model drafter: each round drafts with one arm, but
    every feature head observes every round (a head fed only on its own rounds would find a gap and raise)."""
    pool = [
        FeatureHeadDrafter(trained_head(target), name="eagle3"),
        PromptLookupDrafter(),
        ModelDrafter(tiny_llama(2, layers=1), name="small"),
        FeatureHeadDrafter(random_head(target), name="eagle1"),
    ]
    for policy in ("round_robin", "ucb"):
        for prompt, reference in zip(PROMPTS, references):
            out = metasd_greedy(
                target, prompt, MAX_NEW, assistant_models=pool, meta_policy=policy, return_dict_in_generate=True
            )
            assert torch.equal(out.sequences, reference), policy
        if policy == "round_robin":
            assert {0, 3} <= {arm for arm, n in zip(out.metasd.arms, out.metasd.drafted) if n > 0}


def test_a_passed_cache_continues_like_plain_generate(target):
    drafter = FeatureHeadDrafter(trained_head(target))
    prompt = PROMPTS[1]
    first = target.generate(prompt, do_sample=False, max_new_tokens=6, return_dict_in_generate=True)
    follow_up = torch.cat([first.sequences, torch.tensor([[7, 41, 3]])], dim=-1)
    plain = target.generate(follow_up, do_sample=False, max_new_tokens=12, cache=copy.deepcopy(first.cache))
    out = metasd_greedy(
        target,
        follow_up,
        12,
        cache=copy.deepcopy(first.cache),
        assistant_models=[drafter],
        meta_policy="fixed",
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, plain) and torch.equal(plain, greedy(target, follow_up, 12))
    assert sum(out.metasd.drafted) > 0


# ---------------------------------------------------------------------------------------------------------------------
# the hooks: during verification only
# ---------------------------------------------------------------------------------------------------------------------
def test_no_pre_hook_is_left_on_the_target_even_when_generate_raises(target):
    drafter = FeatureHeadDrafter(trained_head(target))
    calls = []

    def fail_on_the_third_pass(module, args, output):
        calls.append(1)
        if len(calls) == 3:
            assert _pre_hooks(target) == 2  # the recorder's hooks are on (1, 2) during the pass
            raise RuntimeError("boom")

    handle = target.model.layers[0].register_forward_hook(fail_on_the_third_pass)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            metasd_greedy(target, PROMPTS[0], MAX_NEW, assistant_models=[drafter], meta_policy="fixed")
    finally:
        handle.remove()
    assert len(calls) == 3 and _pre_hooks(target) == 0


def test_a_pool_without_a_feature_head_records_nothing(target, references, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a FeatureRecorder was built for a pool without a feature head")

    monkeypatch.setattr(hf_metasd.decoding, "FeatureRecorder", refuse)
    out = metasd_greedy(target, PROMPTS[0], MAX_NEW, assistant_models=[PromptLookupDrafter()])
    assert torch.equal(out, references[0])


# ---------------------------------------------------------------------------------------------------------------------
# a pool round trip
# ---------------------------------------------------------------------------------------------------------------------
def test_a_pool_with_a_feature_head_round_trips(target, references, tmp_path):
    pool = DrafterPool([FeatureHeadDrafter(trained_head(target), name="eagle3"), PromptLookupDrafter()], target=target)
    pool.save_pretrained(tmp_path / "a")  # no store_weights needed: the head is always stored
    assert (tmp_path / "a/feature_head/eagle3/feature_head_config.json").is_file()
    assert (tmp_path / "a/feature_head/eagle3/feature_head.safetensors").is_file()
    loaded = DrafterPool.from_pretrained(tmp_path / "a", target=target)
    head = loaded.drafters[0].head
    assert type(loaded.drafters[0]) is FeatureHeadDrafter and loaded.drafters[0].name == "eagle3"
    assert head.embedding is target.get_input_embeddings()  # shared, not stored
    for name, tensor in trained_head(target).state_dict().items():
        torch.testing.assert_close(head.state_dict()[name], tensor)
    for prompt, reference in zip(PROMPTS, references):
        mine = metasd_greedy(target, prompt, MAX_NEW, assistant_models=loaded, return_dict_in_generate=True)
        theirs = metasd_greedy(target, prompt, MAX_NEW, assistant_models=pool, return_dict_in_generate=True)
        assert torch.equal(mine.sequences, reference) and torch.equal(theirs.sequences, reference)


@pytest.mark.parametrize(
    "rope, match",
    [
        (
            {"low_freq_factor": 0},
            r"`rope_parameters\['low_freq_factor'\]` must be a number in \(0, 1000000\], but is 0\.",
        ),
        (
            {"low_freq_factor": 4.0, "high_freq_factor": 4.0},
            r"`rope_parameters\['high_freq_factor'\]` must be greater than `low_freq_factor` \(llama3 divides by their "
            r"difference\), but is 4\.0 with `low_freq_factor` 4\.0\.",
        ),
        (
            {"rope_type": "linear", "factor": 0},
            r"`rope_parameters\['factor'\]` must be a number in \[1, 1000000\], but is 0\.",
        ),
    ],
)
def test_a_pool_feature_heads_rope_numbers_are_checked_on_load(target, tmp_path, rope, match):
    """Read from a pool, rope numbers that transformers would divide by zero with (or turn into non-finite
    frequencies) are named, instead of a division by zero reported as an unreadable file to download again."""
    DrafterPool([FeatureHeadDrafter(random_head(target), name="h")], target=target).save_pretrained(tmp_path)
    path = tmp_path / "feature_head/h/feature_head_config.json"
    data = json.loads(path.read_text())
    llama3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0}
    llama3.update(high_freq_factor=4.0, original_max_position_embeddings=256)
    path.write_text(json.dumps({**data, "rope_parameters": {**llama3, **rope}}))
    with pytest.raises(InvalidPoolError, match=match + r" Fix the value, or rebuild the config"):
        DrafterPool.from_pretrained(tmp_path, target=target)
    path.write_text(json.dumps({**data, "rope_parameters": llama3}))  # the fix: numbers in range
    loaded = DrafterPool.from_pretrained(tmp_path, target=target)
    assert loaded.drafters[0].head.config.rope_parameters == llama3


def test_a_feature_head_entry_needs_a_path_and_no_params(target, tmp_path):
    with pytest.raises(InvalidPoolError, match=r"drafter 'h' must have a `path`"):
        FeatureHeadDrafter.validate_spec(DrafterSpec("feature_head", "h"), "drafter 'h'")
    DrafterPool([FeatureHeadDrafter(random_head(target), name="h")], target=target).save_pretrained(tmp_path)
    config = (tmp_path / "config.json").read_text()
    (tmp_path / "config.json").write_text(config.replace('"params": {}', '"params": {"layers": 3}'))
    with pytest.raises(InvalidPoolError, match=r"must have `params` that `FeatureHeadDrafter` accepts"):
        DrafterPool.from_pretrained(tmp_path, target=target)


# ---------------------------------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------------------------------
def test_the_head_must_fit_the_target(target):
    wide = tiny_llama(0, hidden=64)
    with pytest.raises(
        DrafterCompatibilityError,
        match=r"`hidden_size` of drafter 'fh' must be the target's hidden size 64, but is 32\.",
    ):
        FeatureHeadDrafter(random_head(target), name="fh").check_compatible(wide)
    with pytest.raises(DrafterCompatibilityError, match=r"`hidden_size` of drafter 'fh'"):
        metasd_greedy(wide, PROMPTS[0], 4, assistant_models=[FeatureHeadDrafter(random_head(target), name="fh")])
    with pytest.raises(TypeError, match=r"`head` must be a `FeatureHead`, but is str\."):
        FeatureHeadDrafter("head")


def test_observed_features_must_be_contiguous_and_match_the_sequence(target):
    drafter = FeatureHeadDrafter(random_head(target), name="fh").spawn(target)
    ids = torch.tensor([[5, 6, 7, 8]])
    assert drafter.draft(ids, 3)[0].shape == (1, 0)  # nothing observed: abstains
    drafter.observe(torch.randn(1, 3, 32), ids[:, 1:], 0)
    with pytest.raises(MetaSDConfigError, match=r"`start` must be 3 \(the position after the features drafter 'fh'"):
        drafter.observe(torch.randn(1, 1, 32), ids[:, :1], 4)
    with pytest.raises(MetaSDConfigError, match=r"`features` must have shape \(1, T, kH\) and `next_ids` \(1, T\)"):
        drafter.observe(torch.randn(1, 2, 32), ids[:, :1], 3)
    with pytest.raises(MetaSDConfigError, match=r"`input_ids` must have 4 tokens .* but has 5\."):
        drafter.draft(torch.tensor([[5, 6, 7, 8, 9]]), 3)
    tokens, logits = drafter.draft(ids, 3)
    assert tokens.shape == (1, 3) and logits.shape == (1, 3, VOCAB)
    assert drafter.draft(ids, 3)[0].shape == (1, 0)  # everything observed was fed: abstains until the next pass


class _Spy(FeatureHeadDrafter):
    """Logs what every per-call copy observes (a list shared by the copies)."""

    kind = "feature_head"  # not registered: the same kind name, used in memory only
    log: list = []

    def observe(self, features, next_ids, start):
        self.log.append((features, next_ids, start))
        super().observe(features, next_ids, start)


@pytest.mark.parametrize("passed_cache", [False, True])
def test_the_observed_features_are_the_targets_at_every_kept_position(target, passed_cache):
    """What the drafters observe over a call, put together, is the target's features at every position but the last
    of the final sequence (one pass over it, no cache), and the tokens that follow them: nothing missed, nothing
    rejected, in order; with a cache passed in, from the first position the call feeds (its features are what plain
    `generate`'s continuation computes there, not checked here)."""
    _Spy.log = []
    prompt, kwargs, start = PROMPTS[2], {}, 0
    if passed_cache:
        first = target.generate(prompt, do_sample=False, max_new_tokens=5, return_dict_in_generate=True)
        kwargs["cache"] = copy.deepcopy(first.cache)
        prompt, start = torch.cat([first.sequences, torch.tensor([[9, 4]])], dim=-1), first.cache.get_seq_length()
    pool = [_Spy(trained_head(target), name="spy"), PromptLookupDrafter(), tiny_llama(2, layers=1)]
    out = metasd_greedy(target, prompt, MAX_NEW, assistant_models=pool, meta_policy="round_robin", **kwargs)
    with torch.no_grad(), FeatureRecorder(target, (1, 2)) as recorder:
        target(out)
    starts = [s for _, _, s in _Spy.log]
    assert starts[0] == start and len(starts) > 3
    features = torch.cat([f for f, _, _ in _Spy.log], dim=1)
    next_ids = torch.cat([n for _, n, _ in _Spy.log], dim=1)
    assert torch.equal(next_ids, out[:, start + 1 :])
    assert features.shape == (1, out.shape[1] - 1 - start, 64)
    if not passed_cache:  # (plain `generate` continues a passed cache at other position ids than one pass uses)
        torch.testing.assert_close(features, recorder.features()[:, :-1], atol=1e-4, rtol=1e-4)


def test_a_left_padded_prompt_with_hidden_states_feeds_the_features_of_both_first_passes(target):
    """With a left-padded prompt and hidden states asked for, the first round verifies in two passes (the prompt
    alone, as plain's prefill, then the candidates): the drafters still observe every kept position once, in order,
    with the target's features there (checked at the unpadded positions against one pass over the output)."""
    _Spy.log = []
    pad = 2
    prompt = torch.cat([torch.zeros(1, pad, dtype=torch.long), PROMPTS[2]], dim=-1)
    mask = torch.cat([torch.zeros(1, pad, dtype=torch.long), torch.ones_like(PROMPTS[2])], dim=-1)
    pool = [ModelDrafter(copy.deepcopy(target), name="copy"), _Spy(trained_head(target), name="spy")]
    out = metasd_greedy(
        target,
        prompt,
        MAX_NEW,
        attention_mask=mask,
        assistant_models=pool,
        meta_policy="round_robin",
        output_hidden_states=True,
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, greedy(target, prompt, MAX_NEW, attention_mask=mask))
    assert out.metasd.drafted[0] > 0 and out.metasd.accepted[0] > 0  # the first round's two passes both kept rows
    sequence = out.sequences
    full_mask = torch.cat([mask, torch.ones(1, MAX_NEW, dtype=torch.long)], dim=-1)
    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad(), FeatureRecorder(target, (1, 2)) as recorder:
        target(sequence, attention_mask=full_mask, position_ids=positions)
    starts = [s for _, _, s in _Spy.log]
    assert starts[0] == 0 and len(starts) > 3
    features = torch.cat([f for f, _, _ in _Spy.log], dim=1)
    next_ids = torch.cat([n for _, n, _ in _Spy.log], dim=1)
    assert torch.equal(next_ids, sequence[:, 1:])
    assert features.shape == (1, sequence.shape[1] - 1, 64)
    torch.testing.assert_close(features[:, pad:], recorder.features()[:, pad:-1], atol=1e-4, rtol=1e-4)
