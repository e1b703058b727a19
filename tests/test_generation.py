"""MetaSD through `generate`: lossless greedy output, both entry points, telemetry, policy lifetime."""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB, greedy, metasd_greedy, prompts
from transformers.generation.utils import GenerationMixin

import hf_metasd
from hf_metasd.policies import POLICY_REGISTRY, get_policy

MAX_NEW = 12
PROMPTS = prompts(20)


@pytest.fixture(scope="module")
def references(target):
    return [greedy(target, p, MAX_NEW) for p in PROMPTS]


@pytest.fixture(scope="module")
def pools(drafters, target_copy):
    """Pools of 1, 2 and 3 drafters; the 2-drafter pool holds an exact copy of the target."""
    d1, d2, d3 = drafters
    return {1: [d1], 2: [d2, target_copy], 3: [d1, d2, d3]}


def _policy_kwargs(name: str, pool_size: int) -> dict:
    if name == "precedence":
        return {"copier": 0, "model": pool_size - 1}
    return {"arm": pool_size - 1} if name == "fixed" else {}


@pytest.mark.parametrize("pool_size", [1, 2, 3])
@pytest.mark.parametrize("policy", sorted(POLICY_REGISTRY))
def test_greedy_is_lossless_for_every_policy(target, pools, references, policy, pool_size):
    kwargs = _policy_kwargs(policy, pool_size)
    for prompt, reference in zip(PROMPTS, references):
        out = metasd_greedy(
            target, prompt, MAX_NEW, assistant_models=pools[pool_size], meta_policy=policy, meta_policy_kwargs=kwargs
        )
        assert torch.equal(out, reference), f"{policy} with {pool_size} drafters changed the greedy output"


@pytest.mark.parametrize("reward", ["bd", "be"])
def test_greedy_is_lossless_with_both_rewards_and_a_long_output(target, pools, reward):
    prompt = PROMPTS[0]
    out = metasd_greedy(target, prompt, 60, assistant_models=pools[3], meta_reward=reward, num_assistant_tokens=3)
    assert torch.equal(out, greedy(target, prompt, 60))


def test_greedy_is_lossless_with_logits_processors(target, pools):
    kwargs = {"repetition_penalty": 1.3, "no_repeat_ngram_size": 3}
    for prompt in PROMPTS[:5]:
        reference = greedy(target, prompt, MAX_NEW, **kwargs)
        assert torch.equal(metasd_greedy(target, prompt, MAX_NEW, assistant_models=pools[2], **kwargs), reference)


def test_enable_routes_assistant_models_and_disable_restores(target, pools, references):
    original = GenerationMixin.generate
    hf_metasd.enable()
    hf_metasd.enable()  # idempotent
    assert hf_metasd.is_enabled() and GenerationMixin.generate is not original
    out = target.generate(PROMPTS[0], do_sample=False, max_new_tokens=MAX_NEW, assistant_models=pools[3])
    assert torch.equal(out, references[0])
    # without assistant_models the call is stock transformers
    assert torch.equal(target.generate(PROMPTS[0], do_sample=False, max_new_tokens=MAX_NEW), references[0])
    hf_metasd.disable()
    assert GenerationMixin.generate is original and not hf_metasd.is_enabled()


def test_import_alone_does_not_patch_transformers():
    import subprocess
    import sys

    code = (
        "from transformers.generation.utils import GenerationMixin as G; before = G.generate; "
        "import hf_metasd; assert G.generate is before; hf_metasd.enable(); assert G.generate is not before; "
        "hf_metasd.disable(); assert G.generate is before"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_streamer_receives_the_tokens_through_enable(target, pools, references):
    class Collect:
        def __init__(self):
            self.chunks = []

        def put(self, value):
            self.chunks.append(value.reshape(-1))

        def end(self):
            self.ended = True

    hf_metasd.enable()
    streamer = Collect()
    out = target.generate(
        PROMPTS[1], do_sample=False, max_new_tokens=MAX_NEW, assistant_models=pools[2], streamer=streamer
    )
    assert torch.equal(torch.cat(streamer.chunks), out[0]) and streamer.ended


def test_telemetry_adds_up(target, pools):
    prompt = PROMPTS[2]
    out = metasd_greedy(
        target,
        prompt,
        30,
        assistant_models=pools[2],
        return_dict_in_generate=True,
        meta_reward="bd",
        meta_policy="ucb",
    )
    stats = out.metasd
    new_tokens = out.sequences.shape[1] - prompt.shape[1]
    assert isinstance(out, hf_metasd.MetaSDGenerateOutput)
    assert stats.rounds == len(stats.arms) == len(stats.drafted) == len(stats.accepted) == len(stats.rewards)
    assert sum(stats.pulls) == sum(r is not None for r in stats.rewards) and len(stats.pulls) == 2
    # every round is a pull but, with measured draft lengths, a last round whose length budget left nothing to draft
    unrewarded = [r for r, reward in enumerate(stats.rewards) if reward is None]
    assert unrewarded in ([], [stats.rounds - 1]) and all(stats.drafted[r] == 0 for r in unrewarded)
    assert sum(stats.accepted) + stats.rounds == new_tokens == stats.tokens
    assert all(0 <= a <= d for a, d in zip(stats.accepted, stats.drafted))
    assert all(r is None or 0.0 <= r <= 1.0 for r in stats.rewards)
    # the target's exact copy (arm 1) has every drafted token accepted and BD reward 1
    copy_rounds = [r for r, a in enumerate(stats.arms) if a == 1 and stats.drafted[r] > 0]
    assert copy_rounds and all(stats.accepted[r] == stats.drafted[r] for r in copy_rounds)
    assert all(stats.rewards[r] == pytest.approx(1.0, abs=1e-5) for r in copy_rounds)
    # the timed parts are disjoint pieces of the decoding loop: they sum to no more than its wall time (the share
    # they cover is pinned exactly under a fake clock in the next test; a real clock's share varies with the load)
    assert 0 < stats.total_seconds <= stats.wall_seconds
    assert sum(stats.new_tokens) == new_tokens
    assert stats.verify_seconds > 0 and stats.draft_seconds > 0
    assert "rounds" in stats.summary() and stats.to_dict()["pulls"] == stats.pulls


def test_every_model_forward_is_inside_a_timed_part(target, pools, fake_clock):
    # time advances only while a model runs: if the timed parts cover every forward of the target and the drafters
    # (and never time one twice), they add up to the wall time exactly
    with fake_clock.charging((target, 10.0), *((d, 1.0) for d in pools[2])):
        out = metasd_greedy(
            target,
            PROMPTS[2],
            30,
            assistant_models=pools[2],
            return_dict_in_generate=True,
            meta_reward="bd",
            meta_policy="ucb",
            meta_skinny_gemm=False,
        )
    stats = out.metasd
    assert stats.wall_seconds > 0 and stats.verify_seconds > 0 and stats.draft_seconds > 0
    assert stats.total_seconds == pytest.approx(stats.wall_seconds) and stats.other_seconds == pytest.approx(0.0)


def test_ucb_learns_to_pick_the_target_copy(target, pools):
    # BD (no clock in the reward): which drafter UCB learns is decided by acceptance alone
    out = metasd_greedy(
        target, PROMPTS[3], 80, assistant_models=pools[2], return_dict_in_generate=True, meta_reward="bd"
    )
    arms = out.metasd.arms
    assert arms[:2] == [0, 1]  # each drafter once, in pool order
    pulls = out.metasd.pulls
    assert pulls[1] >= 2 * pulls[0], pulls  # the exact copy (reward 1) is pulled far more than a random drafter


def test_draft_length_respects_the_length_budget(target, pools):
    out = metasd_greedy(
        target, PROMPTS[4], 7, assistant_models=pools[2], num_assistant_tokens=5, return_dict_in_generate=True
    )
    assert out.sequences.shape[1] - PROMPTS[4].shape[1] == 7
    assert all(d <= 5 for d in out.metasd.drafted)


def test_policy_by_name_starts_fresh_and_instance_keeps_learning(target, pools):
    fresh = {"meta_learned_priors": False, "meta_reward": "bd", "return_dict_in_generate": True}
    first = metasd_greedy(target, PROMPTS[5], 20, assistant_models=pools[3], **fresh)
    second = metasd_greedy(target, PROMPTS[5], 20, assistant_models=pools[3], **fresh)
    assert first.metasd.arms[:3] == second.metasd.arms[:3] == [0, 1, 2]
    assert first.metasd.learned_priors == second.metasd.learned_priors == {}

    policy = get_policy("ucb")
    a = metasd_greedy(
        target,
        PROMPTS[5],
        20,
        assistant_models=pools[3],
        meta_policy=policy,
        return_dict_in_generate=True,
        meta_reward="bd",
    )
    pulls_after_first = list(policy.counts)
    # the policy learns from rounds that drafted (the last round may have no length budget left to draft)
    assert sum(pulls_after_first) == sum(1 for d in a.metasd.drafted if d > 0)
    b = metasd_greedy(
        target,
        PROMPTS[6],
        20,
        assistant_models=pools[3],
        meta_policy=policy,
        return_dict_in_generate=True,
        meta_reward="bd",
    )
    assert sum(policy.counts) == sum(pulls_after_first) + sum(1 for d in b.metasd.drafted if d > 0)
    assert b.metasd.arms[:3] != [0, 1, 2] or pulls_after_first == [0, 0, 0]


def test_mixed_drafter_objects_and_models(target, drafters, target_copy, references):
    pool = [hf_metasd.ModelDrafter(target_copy, name="copy"), drafters[0]]
    out = metasd_greedy(target, PROMPTS[0], MAX_NEW, assistant_models=pool, return_dict_in_generate=True)
    assert torch.equal(out.sequences, references[0])
    assert out.metasd.drafter_names[0] == "copy"


def test_restricted_head_drafter_is_lossless(target, target_copy, references):
    head = torch.arange(0, VOCAB, 2)  # the drafter may propose even ids only
    drafter = hf_metasd.ModelDrafter(target_copy, name="even", head_token_ids=head)
    for prompt, reference in zip(PROMPTS[:5], references[:5]):
        out = metasd_greedy(target, prompt, MAX_NEW, assistant_models=[drafter], return_dict_in_generate=True)
        assert torch.equal(out.sequences, reference)
    tokens, logits = drafter.draft(PROMPTS[0], 3)
    assert (tokens % 2 == 0).all() and torch.isinf(logits[..., 1::2]).all()


def test_full_information_scores_every_drafter(target, pools, references):
    out = metasd_greedy(
        target,
        PROMPTS[0],
        MAX_NEW,
        assistant_models=pools[3],
        meta_policy="hedge",  # a full-information policy: every drafter is scored each round
        meta_reward="bd",
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, references[0])
    cf = out.metasd.counterfactual_rewards
    assert len(cf) == sum(1 for d in out.metasd.drafted if d > 0)
    assert all(len(r) == 3 and all(0.0 <= v <= 1.0 for v in r.values()) for r in cf[1:])


def test_full_information_trace_replays_in_the_simulator(target, drafters, target_copy):
    from hf_metasd.benchmark.simulate import replay

    pool = [drafters[0], target_copy]
    out = metasd_greedy(
        target,
        PROMPTS[9],
        40,
        assistant_models=pool,
        meta_policy="hedge",  # a full-information policy: every drafter is scored each round
        meta_reward="bd",
        return_dict_in_generate=True,
    )
    trace = out.metasd.to_trace()
    assert trace and all(set(r["arm_rewards"]) == {0, 1} for r in trace)
    # the copy would have accepted every verified token; its counterfactual BD is 1
    assert all(r["arm_rewards"][1] == pytest.approx(1.0, abs=1e-5) for r in trace)
    result = replay("ucb", trace)
    assert result.rounds == len(trace)


def test_cost_reward_runs_and_stays_lossless(target, pools, references):
    out = metasd_greedy(
        target, PROMPTS[0], MAX_NEW, assistant_models=pools[3], meta_reward="cost", return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, references[0])
    assert all(r is None or 0.0 <= r <= 1.0 for r in out.metasd.rewards)


class Silent(hf_metasd.Drafter):
    kind = "silent"
    returns_logits = False

    def draft(self, input_ids, num_tokens, *, logits_processor=None, do_sample=False):
        return input_ids[:, :0], None


def test_a_drafter_that_abstains_is_not_pulled_and_the_round_goes_to_the_fallback(target, target_copy, references):
    policy = get_policy("ucb")
    out = metasd_greedy(
        target,
        PROMPTS[0],
        MAX_NEW,
        assistant_models=[Silent(), target_copy],
        meta_policy=policy,
        meta_reward="bd",
        meta_draft_length="fixed",  # measured lengths could leave a last round with nothing to draft: no pull
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, references[0])
    stats = out.metasd
    # UCB asks the untried silent drafter first every round; it abstains every time and is never counted as pulled
    assert stats.empty_drafts == stats.rounds and policy.counts[0] == 0 and policy.sums[0] == 0.0
    assert all(arm == 1 for arm in stats.arms)  # every round was drafted by the drafter that had something
    assert policy.counts[1] == stats.rounds
    assert len(stats.catch_up_tokens) == stats.rounds


def test_a_fixed_drafter_that_abstains_leaves_the_round_to_the_target(target, target_copy, references):
    out = metasd_greedy(
        target,
        PROMPTS[0],
        MAX_NEW,
        assistant_models=[Silent(), target_copy],
        meta_policy="fixed",
        meta_policy_kwargs={"arm": 0},
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, references[0])
    assert out.metasd.rounds == MAX_NEW and set(out.metasd.arms) == {0} and sum(out.metasd.drafted) == 0


def test_a_fallback_outside_the_pool_is_named(target, target_copy):
    class BadFallback(hf_metasd.RandomPolicy):
        name = "bad_fallback"

        def select(self):
            return 0

        def fallback(self, exclude):
            return 7

    with pytest.raises(
        hf_metasd.PolicyArmError, match=r"must select an arm in \[0, 2\), but selected 7\. Fix `BadFallback\.fallback`"
    ):
        metasd_greedy(
            target,
            PROMPTS[0],
            4,
            assistant_models=[Silent(), target_copy],
            meta_policy=BadFallback(),
            meta_reward="bd",
        )


def test_a_fallback_that_repeats_an_abstained_arm_cannot_loop_forever(target, target_copy, references):
    class Stubborn(hf_metasd.RandomPolicy):
        name = "stubborn"

        def select(self):
            return 0

        def fallback(self, exclude):
            return 0

    out = metasd_greedy(
        target,
        PROMPTS[0],
        MAX_NEW,
        assistant_models=[Silent(), target_copy],
        meta_policy=Stubborn(),
        meta_reward="bd",
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, references[0])
    stats = out.metasd
    # at most one attempt per drafter and round (the last round has no room to draft)
    assert sum(stats.drafted) == 0 and 2 * (stats.rounds - 1) <= stats.empty_drafts <= 2 * stats.rounds


# ---------------------------------------------------------------------- transformers' own arguments, explicitly
ENTRIES = ("custom_generate", "enable")


def _custom_generate(target, entry: str, prompt, **kwargs):
    """``model.generate(..., custom_generate=hf_metasd.generate)``: bare, or with `hf_metasd.enable()` in effect."""
    if entry == "enable":
        hf_metasd.enable()
    kwargs = {"do_sample": False, "max_new_tokens": MAX_NEW, **kwargs}
    return target.generate(prompt, custom_generate=hf_metasd.generate, **kwargs)


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_lone_assistant_model_is_a_one_drafter_pool(target, drafters, target_copy, references, entry):
    """``custom_generate=hf_metasd.generate`` with transformers' ``assistant_model=`` alone: plain `generate` runs
    assisted decoding with it, MetaSD drafts with it as a pool of one (it was refused as "both are set")."""
    for drafter, prompt, reference in ((target_copy, PROMPTS[0], references[0]), (drafters[0], PROMPTS[1], None)):
        out = _custom_generate(target, entry, prompt, assistant_model=drafter, return_dict_in_generate=True)
        hf_metasd.disable()
        assisted = target.generate(prompt, do_sample=False, max_new_tokens=MAX_NEW, assistant_model=drafter)
        assert torch.equal(out.sequences, assisted)  # as plain assisted decoding, and as plain greedy decoding
        assert torch.equal(out.sequences, greedy(target, prompt, MAX_NEW) if reference is None else reference)
        assert isinstance(out, hf_metasd.MetaSDGenerateOutput) and len(out.metasd.drafter_names) == 2  # + no_draft
        assert sum(out.metasd.drafted) > 0
    # both: refused before any compute, as before
    with pytest.raises(hf_metasd.MetaSDConfigError, match=r"`assistant_model` must be None when `assistant_models`"):
        _custom_generate(target, entry, PROMPTS[0], assistant_model=drafters[0], assistant_models=drafters[1:])


def test_enable_without_custom_generate_leaves_a_lone_assistant_model_to_transformers(target, drafters, references):
    hf_metasd.enable()
    out = target.generate(
        PROMPTS[0], do_sample=False, max_new_tokens=MAX_NEW, assistant_model=drafters[0], return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, references[0]) and not isinstance(out, hf_metasd.MetaSDGenerateOutput)


class _Collect:
    def __init__(self):
        self.chunks, self.ended = [], False

    def put(self, value):
        self.chunks.append(value.reshape(-1))

    def end(self):
        self.ended = True


@pytest.mark.parametrize("custom", [False, True])
def test_enable_hands_streamer_and_assistant_model_over_explicitly(target, drafters, references, monkeypatch, custom):
    """Through `enable` (with or without ``custom_generate=hf_metasd.generate``) both arguments reach MetaSD as
    arguments (`generate_with_pool` takes them): nothing reads transformers' frame on that path."""

    def no_frame():
        raise AssertionError("a call through `enable` read transformers' frame")

    monkeypatch.setattr(hf_metasd.generation, "_bare_call_arguments", no_frame)
    hf_metasd.enable()
    extra = {"custom_generate": hf_metasd.generate} if custom else {}
    streamer = _Collect()
    out = target.generate(
        PROMPTS[1], do_sample=False, max_new_tokens=MAX_NEW, assistant_models=drafters, streamer=streamer, **extra
    )
    assert torch.equal(out, references[1]) and torch.equal(torch.cat(streamer.chunks), out[0]) and streamer.ended
    assert torch.equal(streamer.chunks[0], PROMPTS[1][0])  # the prompt first, as plain generate
    streamer = _Collect()
    out = _custom_generate(target, "enable", PROMPTS[0], assistant_model=drafters[0], streamer=streamer)
    assert torch.equal(out, references[0]) and torch.equal(torch.cat(streamer.chunks), out[0]) and streamer.ended
    with pytest.raises(
        hf_metasd.MetaSDConfigError,
        match=r"^`metasd_streamer` must be None when `streamer` is given, but both are set\. Pass the streamer once, "
        r"as `streamer=`\.$",
    ):
        target.generate(PROMPTS[0], assistant_models=drafters, streamer=_Collect(), metasd_streamer=_Collect())


def test_every_setting_reaches_the_precedence(target, drafters, monkeypatch):
    """`generate` hands `resolve_settings` each setting it was called with, by name (no `locals()`)."""
    from hf_metasd.settings import SETTINGS

    seen = {}
    resolve = hf_metasd.generation.resolve_settings

    def spy(call, *args, **kwargs):
        seen.update(call)
        return resolve(call, *args, **kwargs)

    monkeypatch.setattr(hf_metasd.generation, "resolve_settings", spy)
    values = {"num_assistant_tokens": 2, "meta_policy": "ucb", "meta_policy_kwargs": {"beta": 0.5}}
    values.update(meta_reward="speed", meta_skinny_gemm=False, meta_no_draft=True, meta_replay=False)
    values.update(meta_priors={"no_draft": 0.1}, meta_prior_weight=3.0, meta_learned_priors=False)
    values.update(meta_draft_length="fixed", meta_reproducible=False)
    assert set(values) == set(SETTINGS)
    metasd_greedy(target, PROMPTS[0], 4, assistant_models=drafters, **values)
    assert seen == values
