"""Everything `generate` does, MetaSD does the same: stopping, streaming, configs, threads, side effects, telemetry."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from conftest import VOCAB, StopAfter, StopOnToken, greedy, metasd_greedy, prompts, tiny_llama
from transformers import GenerationConfig, StoppingCriteriaList

import hf_metasd
from hf_metasd import MetaSDConfigError
from hf_metasd.drafters import PromptLookupDrafter
from hf_metasd.policies.fixed import FixedPolicy

PROMPTS = prompts(6, seed=99)


@pytest.fixture(autouse=True)
def _both_entry_points(entry_point):
    """Every feature through both entry points: `metasd_greedy` goes through ``custom_generate=`` and through
    ``enable()`` (tests that name an entry point themselves run twice, the same way)."""
    return entry_point


# ---------------------------------------------------------------------- stopping
@pytest.mark.parametrize("n", [1, 2, 4, 7])
def test_a_custom_stopping_criterion_stops_exactly_where_plain_generate_stops(target, target_copy, n):
    prompt = PROMPTS[0]
    plain_criterion, meta_criterion = StopAfter(prompt.shape[1], n), StopAfter(prompt.shape[1], n)
    plain = greedy(target, prompt, 30, stopping_criteria=StoppingCriteriaList([plain_criterion]))
    out = metasd_greedy(
        target,
        prompt,
        30,
        assistant_models=[target_copy],
        num_assistant_tokens=5,
        stopping_criteria=StoppingCriteriaList([meta_criterion]),
        return_dict_in_generate=True,
    )
    assert plain.shape[1] - prompt.shape[1] == n
    assert torch.equal(out.sequences, plain)
    # called once per kept token with the sequence up to it, as plain generate does
    assert meta_criterion.calls == plain_criterion.calls
    assert out.metasd.tokens == n


def test_a_token_criterion_mid_draft_cuts_the_accepted_draft(target, target_copy):
    prompt = PROMPTS[1]
    reference = greedy(target, prompt, 20)
    token = int(reference[0, prompt.shape[1] + 3])  # the 4th new token
    kwargs = {"stopping_criteria": StoppingCriteriaList([StopOnToken(token)])}
    plain = greedy(target, prompt, 20, **kwargs)
    out = metasd_greedy(target, prompt, 20, assistant_models=[target_copy], num_assistant_tokens=6, **kwargs)
    assert torch.equal(out, plain)


def test_several_eos_ids_stop_like_plain_generate(target, target_copy, drafters):
    prompt = PROMPTS[2]
    reference = greedy(target, prompt, 20)
    eos = [int(reference[0, prompt.shape[1] + 5]), int(reference[0, prompt.shape[1] + 9])]
    plain = greedy(target, prompt, 20, eos_token_id=eos, pad_token_id=0)
    out = metasd_greedy(
        target, prompt, 20, assistant_models=[target_copy, drafters[0]], eos_token_id=eos, pad_token_id=0
    )
    assert torch.equal(out, plain) and plain.shape[1] < reference.shape[1]


def test_max_time_stops_the_call(target, drafters):
    start = time.perf_counter()
    out = metasd_greedy(target, PROMPTS[3], 400, assistant_models=drafters, max_time=0.05)
    assert time.perf_counter() - start < 5.0
    assert out.shape[1] < PROMPTS[3].shape[1] + 400


def _tokenizer(vocab: int):
    """A character-level tokenizer built in memory: token i is the character ``chr(33 + i)`` (no network)."""
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    chars = {chr(33 + i): i for i in range(vocab)}
    backend = Tokenizer(WordLevel(chars, unk_token="!"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="!")


def test_stop_strings_with_a_tokenizer_through_enable(target, target_copy):
    tokenizer = _tokenizer(VOCAB)
    prompt = PROMPTS[4]
    reference = greedy(target, prompt, 20)
    stop = tokenizer.convert_ids_to_tokens([int(reference[0, prompt.shape[1] + 4])])[0]
    plain = greedy(target, prompt, 20, stop_strings=[stop], tokenizer=tokenizer)
    hf_metasd.enable()
    out = target.generate(
        prompt,
        do_sample=False,
        max_new_tokens=20,
        assistant_models=[target_copy],
        stop_strings=[stop],
        tokenizer=tokenizer,
    )
    assert torch.equal(out, plain) and plain.shape[1] < reference.shape[1]


def test_stop_strings_without_a_tokenizer_are_refused_through_enable(target, target_copy):
    hf_metasd.enable()
    with pytest.raises(MetaSDConfigError, match="`tokenizer` must be passed to `generate` with `stop_strings`"):
        target.generate(PROMPTS[0], max_new_tokens=5, assistant_models=[target_copy], stop_strings=["a"])


# ---------------------------------------------------------------------- streaming
class Collect:
    def __init__(self):
        self.chunks, self.ended = [], False

    def put(self, value):
        self.chunks.append(value.reshape(-1))

    def end(self):
        self.ended = True


def test_streamer_with_custom_generate_gets_every_kept_token_then_end(target, target_copy, drafters):
    streamer = Collect()
    prompt = PROMPTS[5]
    out = metasd_greedy(target, prompt, 15, assistant_models=[target_copy, drafters[1]], streamer=streamer)
    assert torch.equal(torch.cat(streamer.chunks), out[0]) and streamer.ended
    assert torch.equal(streamer.chunks[0], prompt[0])  # the prompt first, as plain generate


def test_streamer_never_sees_tokens_past_a_stopping_criterion(target, target_copy):
    streamer, prompt = Collect(), PROMPTS[0]
    out = metasd_greedy(
        target,
        prompt,
        30,
        assistant_models=[target_copy],
        num_assistant_tokens=6,
        streamer=streamer,
        stopping_criteria=StoppingCriteriaList([StopAfter(prompt.shape[1], 3)]),
    )
    assert torch.equal(torch.cat(streamer.chunks), out[0]) and out.shape[1] == prompt.shape[1] + 3


def test_text_iterator_streamer_consumer_finishes(target, target_copy):
    from transformers import TextIteratorStreamer

    class Tok:
        def decode(self, ids, **kwargs):
            return " ".join(str(int(i)) for i in ids)

    streamer = TextIteratorStreamer(Tok(), skip_prompt=True, timeout=30)
    worker = threading.Thread(
        target=lambda: metasd_greedy(target, PROMPTS[1], 10, assistant_models=[target_copy], streamer=streamer)
    )
    worker.start()
    text = "".join(streamer)  # blocks forever if end() never comes
    worker.join(timeout=30)
    assert text.split() == [str(int(t)) for t in greedy(target, PROMPTS[1], 10)[0, PROMPTS[1].shape[1] :]]


# ---------------------------------------------------------------------- configuration
def _stats(target, pool, **kwargs):
    return metasd_greedy(target, PROMPTS[0], 12, assistant_models=pool, return_dict_in_generate=True, **kwargs).metasd


def test_settings_on_a_generation_config_are_honoured(target, drafters):
    config = GenerationConfig(num_assistant_tokens=2, meta_policy="round_robin", max_new_tokens=12, do_sample=False)
    out = target.generate(
        PROMPTS[0],
        generation_config=config,
        custom_generate=hf_metasd.generate,
        assistant_models=drafters,
        return_dict_in_generate=True,
    )
    assert out.metasd.num_assistant_tokens == 2 and out.metasd.policy == "round_robin"
    assert max(out.metasd.drafted) <= 2


def test_settings_on_the_models_generation_config_and_their_precedence(target, drafters):
    saved = target.generation_config
    try:
        target.generation_config = GenerationConfig(**saved.to_dict())
        target.generation_config.meta_policy = "round_robin"
        target.generation_config.num_assistant_tokens = 4
        stats = _stats(target, drafters)
        assert (stats.policy, stats.num_assistant_tokens) == ("round_robin", 4)
        # a passed config wins over the model's, a call kwarg over both
        passed = GenerationConfig(num_assistant_tokens=2, max_new_tokens=12)
        out = target.generate(
            PROMPTS[0],
            generation_config=passed,
            custom_generate=hf_metasd.generate,
            assistant_models=drafters,
            return_dict_in_generate=True,
        )
        assert (out.metasd.policy, out.metasd.num_assistant_tokens) == ("round_robin", 2)
        stats = _stats(target, drafters, num_assistant_tokens=1, meta_policy="ucb")
        assert (stats.policy, stats.num_assistant_tokens) == ("ucb", 1)
    finally:
        target.generation_config = saved


def test_settings_save_and_load_with_the_generation_config(tmp_path, target, drafters):
    GenerationConfig(meta_policy="round_robin", num_assistant_tokens=2, max_new_tokens=12).save_pretrained(tmp_path)
    config = GenerationConfig.from_pretrained(tmp_path)
    out = target.generate(
        PROMPTS[0],
        generation_config=config,
        custom_generate=hf_metasd.generate,
        assistant_models=drafters,
        return_dict_in_generate=True,
    )
    assert (out.metasd.policy, out.metasd.num_assistant_tokens) == ("round_robin", 2)


def test_unknown_meta_keys_on_a_config_are_refused_with_the_valid_ones(target, drafters):
    config = GenerationConfig(meta_polcy="ucb", max_new_tokens=5)
    with pytest.raises(
        MetaSDConfigError,
        match=r"must use the MetaSD settings \[.*'meta_policy'.*\], but has unknown \['meta_polcy'\]",
    ):
        target.generate(
            PROMPTS[0], generation_config=config, custom_generate=hf_metasd.generate, assistant_models=drafters
        )


def test_unknown_meta_kwargs_are_refused_through_enable(target, drafters):
    hf_metasd.enable()
    with pytest.raises(MetaSDConfigError, match=r"but has unknown \['meta_rewrd'\]"):
        target.generate(PROMPTS[0], max_new_tokens=5, assistant_models=drafters, meta_rewrd="be")


# ---------------------------------------------------------------------- threads and side effects
def test_one_pool_shared_by_concurrent_threads_gives_the_right_outputs(target, drafters, target_copy):
    pool = hf_metasd.DrafterPool([target_copy, *drafters, PromptLookupDrafter()], reward="speed")
    jobs = [PROMPTS[i % len(PROMPTS)] for i in range(12)]
    expected = [greedy(target, p, 12) for p in jobs]
    results: dict[int, torch.Tensor] = {}
    errors: list[BaseException] = []

    def work(i):
        try:
            results[i] = metasd_greedy(target, jobs[i], 12, assistant_models=pool)
        except BaseException as err:  # noqa: BLE001 - surfaced below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert all(torch.equal(results[i], expected[i]) for i in range(len(jobs)))


def test_a_call_leaves_the_drafter_models_training_flag_alone(target, drafters):
    drafter = tiny_llama(5, layers=1).train()
    metasd_greedy(target, PROMPTS[0], 8, assistant_models=[drafter, *drafters])
    assert drafter.training and all(m.training for m in drafter.modules())


def test_a_call_gives_the_peft_model_its_active_adapter_back(target):
    peft = pytest.importorskip("peft")
    base = tiny_llama(7, layers=1)
    lora = peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = peft.get_peft_model(base, lora, adapter_name="code")
    model.add_adapter("math", lora)
    model.set_adapter("code")
    grads = {n: p.requires_grad for n, p in model.named_parameters()}
    model.train()
    metasd_greedy(target, PROMPTS[1], 12, assistant_models=[model], meta_policy="round_robin")
    assert model.active_adapter == "code" and model.training
    assert {n: p.requires_grad for n, p in model.named_parameters()} == grads


# ---------------------------------------------------------------------- telemetry
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"meta_reward": "bd"}, {"meta_policy": "hedge", "meta_reward": "bd"}],
    ids=["default", "bd", "full-information"],
)
def test_the_time_parts_add_up_to_the_wall_time(target, drafters, target_copy, kwargs, fake_clock):
    # time advances only while a model runs (the target 10 units a pass, a drafter 1): the timed parts add up to the
    # wall time exactly iff they cover every forward once, whatever the feature (full information, ...)
    pool = [*drafters, target_copy]
    with fake_clock.charging((target, 10.0), *((d, 1.0) for d in pool)):
        out = metasd_greedy(
            target,
            PROMPTS[2],
            40,
            assistant_models=pool,
            return_dict_in_generate=True,
            meta_skinny_gemm=False,
            **kwargs,
        )
    stats = out.metasd
    assert stats.wall_seconds > 0 and stats.verify_seconds > 0
    assert stats.total_seconds == pytest.approx(stats.wall_seconds) and stats.other_seconds == pytest.approx(0.0)
    assert stats.tokens == out.sequences.shape[1] - PROMPTS[2].shape[1]


def test_abstentions_are_not_pulls(target, target_copy):
    silent = PromptLookupDrafter(max_matching_ngram_size=1, name="silent")
    out = metasd_greedy(
        target,
        torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]]),
        20,
        assistant_models=[silent, target_copy],
        meta_reward="bd",
        return_dict_in_generate=True,
    )
    stats = out.metasd
    assert sum(stats.pulls) == sum(r is not None for r in stats.rewards)
    assert stats.pulls[0] == sum(1 for a, r in zip(stats.arms, stats.rewards) if a == 0 and r is not None)
    assert sum(0 in a for a in stats.abstained) >= 1


def test_a_fallback_drafts_the_length_chosen_for_it(target, target_copy, monkeypatch):
    # the policy always asks the silent drafter first (3 tokens for it); when it abstains, the round goes to the
    # target's copy, which must draft its own length (1 token here), not the one chosen for the arm that abstained
    def choose(self, arm, cap=None):
        cap = self.max_tokens if cap is None else min(cap, self.max_tokens)
        return min(3 if arm == 0 else 1, cap)

    class AskSilentFirst(FixedPolicy):
        def fallback(self, exclude):
            return next((arm for arm in range(self.num_arms) if arm not in exclude), None)

    monkeypatch.setattr(hf_metasd.draft_length.DraftLength, "choose", choose)
    prompt = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    silent = PromptLookupDrafter(max_matching_ngram_size=1, name="silent")
    out = metasd_greedy(
        target,
        prompt,
        24,
        assistant_models=[silent, target_copy],
        meta_policy=AskSilentFirst(arm=0),
        meta_no_draft=False,
        return_dict_in_generate=True,
    )
    stats = out.metasd
    assert torch.equal(out.sequences, greedy(target, prompt, 24))
    fallbacks = [r for r, abstained in enumerate(stats.abstained) if abstained == [0] and stats.arms[r] == 1]
    assert fallbacks and all(stats.drafted[r] == 1 for r in fallbacks), (stats.arms, stats.drafted)


def test_a_policy_named_per_call_does_not_take_the_pools_settings_for_another_policy(target, drafters):
    pool = hf_metasd.DrafterPool(drafters, policy="ucb", policy_kwargs={"beta": 0.1})
    stats = _stats(target, pool, meta_policy="ucb_v")  # the pool's beta means nothing to UCB-V
    assert stats.policy == "ucb_v"
    assert _stats(target, pool).policy == "ucb"  # and the pool's own policy keeps its settings


@pytest.mark.parametrize("policy, expected", [("hedge", True), ("ucb", False)])
def test_hedge_turns_full_information_on_by_itself(target, target_copy, drafters, policy, expected):
    out = metasd_greedy(
        target,
        PROMPTS[1],
        12,
        assistant_models=[target_copy, drafters[1]],
        meta_policy=policy,
        return_dict_in_generate=True,
    )
    scored = out.metasd.counterfactual_rewards
    assert bool(scored) is expected  # hedge scores the drafters that did not draft, by itself
    if expected:
        assert all(len(rewards) >= 1 for rewards in scored)
