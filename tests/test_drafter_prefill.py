"""`hf_metasd.drafters.prefill`: a bfloat16 model drafter's catch-ups in float32, chosen by measurement, lossless."""

from __future__ import annotations

import pytest
import torch
from conftest import greedy, metasd_greedy, prompts, sharpen, tiny_llama

from hf_metasd.drafters import ModelDrafter, PromptLookupDrafter
from hf_metasd.drafters.prefill import (
    MEASURED_LENGTHS,
    PrefillChoice,
    choose_prefill_dtype,
    clear_prefill_choices,
    crossover,
    float32_body,
    float32_prefill_applies,
)


@pytest.fixture(autouse=True)
def _fresh_choices():
    clear_prefill_choices()
    yield
    clear_prefill_choices()


def _bf16_drafter_model(seed: int = 2):
    return sharpen(tiny_llama(seed, layers=1)).bfloat16()


class ScriptedClock:
    """A clock under which a timed run lasts `cost(variant, length)`: the variants and lengths come in the order
    `choose_prefill_dtype` times them (repeats x lengths x (stored, float32))."""

    def __init__(self, cost, repeats: int):
        self.order = [(name, n) for _ in range(repeats) for n in MEASURED_LENGTHS for name in ("stored", "float32")]
        self.cost, self.now, self.calls = cost, 0.0, 0

    def __call__(self) -> float:
        if self.calls % 2 == 1:  # the stop of a run
            self.now += self.cost(*self.order[self.calls // 2])
        self.calls += 1
        return self.now


# ---------------------------------------------------------------------------------------------------------------------
# the crossover of two cost lines, by hand
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("stored", "float32", "margin", "expected"),
    [
        # 0.9 (1 + 1.5T) vs 4 + 0.2T ms: 0.9 + 1.35T > 4 + 0.2T  <=>  1.15T > 3.1  <=>  T > 2.70
        ((1e-3, 1.5e-3), (4e-3, 0.2e-3), 0.1, 3),
        # 0.9 (4 + 1T) vs 10 + 0.27T: 3.6 + 0.9T > 10 + 0.27T  <=>  0.63T > 6.4  <=>  T > 10.16
        ((4e-3, 1e-3), (10e-3, 0.27e-3), 0.1, 11),
        # float32 cheaper to start and per token: from the shortest catch-up on
        ((5e-3, 1e-3), (1e-3, 0.5e-3), 0.1, 2),
        # float32 dearer per token: never
        ((1e-3, 0.2e-3), (1e-3, 0.3e-3), 0.1, None),
        # equal lines: the margin keeps the stored dtype
        ((1e-3, 1e-3), (1e-3, 1e-3), 0.1, None),
    ],
)
def test_crossover_is_the_first_length_where_float32_wins_by_the_margin(stored, float32, margin, expected):
    assert crossover(stored, float32, margin) == expected


def test_takes_float32_from_min_tokens_on():
    choice = PrefillChoice(11)
    assert [choice.takes_float32(n) for n in (1, 10, 11, 600)] == [False, False, True, True]
    assert not PrefillChoice(None).takes_float32(10_000)


# ---------------------------------------------------------------------------------------------------------------------
# the choice is a measurement (a scripted clock), cached per process
# ---------------------------------------------------------------------------------------------------------------------
def test_the_choice_is_made_by_measurement():
    model = _bf16_drafter_model()
    # stored: 4 ms + 1 ms per token; float32: 10 ms + 0.27 ms per token (the shape measured on the benchmark's CPU)
    costs = {"stored": (4e-3, 1e-3), "float32": (10e-3, 0.27e-3)}
    clock = ScriptedClock(lambda name, n: costs[name][0] + costs[name][1] * n, repeats=2)
    choice = choose_prefill_dtype(model, float32_body(model), timer=clock)
    assert choice.measured and choice.seconds > 0
    assert choice.stored == pytest.approx(costs["stored"]) and choice.float32 == pytest.approx(costs["float32"])
    assert choice.min_tokens == 11  # by hand in the crossover test above


def test_a_machine_where_the_narrow_dtype_is_faster_keeps_it():
    model = _bf16_drafter_model()
    clock = ScriptedClock(lambda name, n: (2e-3 if name == "stored" else 3e-3) * (1 + 0.1 * n), repeats=2)
    assert choose_prefill_dtype(model, float32_body(model), timer=clock).min_tokens is None


def test_the_choice_is_cached_until_cleared():
    model = _bf16_drafter_model()

    def cost(name, n):
        return (1e-3 if name == "stored" else 4e-3) + (1e-3 if name == "stored" else 0.1e-3) * n

    clock = ScriptedClock(cost, repeats=2)
    first = choose_prefill_dtype(model, float32_body(model), timer=clock)
    calls = clock.calls
    again = choose_prefill_dtype(model, float32_body(model), timer=clock)
    assert clock.calls == calls, "a cached choice must not time anything"
    assert (again.min_tokens, again.seconds) == (first.min_tokens, 0.0)
    clear_prefill_choices()
    fresh = ScriptedClock(cost, repeats=2)
    choose_prefill_dtype(model, float32_body(model), timer=fresh)
    assert fresh.calls == calls


# ---------------------------------------------------------------------------------------------------------------------
# where it applies, and the drafter's argument
# ---------------------------------------------------------------------------------------------------------------------
def test_applies_to_bfloat16_and_float16_cpu_causal_lms_only():
    assert float32_prefill_applies(_bf16_drafter_model())
    assert float32_prefill_applies(tiny_llama(2, layers=1).half())
    assert not float32_prefill_applies(tiny_llama(2, layers=1))
    assert not float32_prefill_applies(torch.nn.Linear(4, 4).bfloat16())


def test_float32_prefill_must_be_a_bool_or_none():
    with pytest.raises(TypeError, match=r"`float32_prefill` must be True, False or None, but is 'yes'\. Pass None"):
        ModelDrafter(_bf16_drafter_model(), float32_prefill="yes")


def test_float32_prefill_cannot_be_forced_on_a_float32_model():
    with pytest.raises(
        ValueError,
        match=r"`float32_prefill` must be True only for a bfloat16 or float16 .* but the "
        r"model is LlamaForCausalLM in torch\.float32 on cpu\. Pass None or False\.",
    ):
        ModelDrafter(tiny_llama(2, layers=1), float32_prefill=True)


def test_a_float32_model_never_builds_a_body():
    drafter = ModelDrafter(tiny_llama(2, layers=1))
    drafter.catch_up(torch.randint(1, 90, (1, 40)))
    assert drafter.float32_prefill is False and drafter.prefill_choice is None


# ---------------------------------------------------------------------------------------------------------------------
# what the float32 catch-up computes, and what it leaves behind
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("head", [None, list(range(0, 96, 2))])
def test_a_float32_catch_up_computes_the_model_in_float32(head):
    model = _bf16_drafter_model()
    ids = torch.randint(1, 90, (1, 30), generator=torch.Generator().manual_seed(0))
    drafter = ModelDrafter(model, float32_prefill=True, head_token_ids=head)
    got = drafter.catch_up(ids, return_logits=True)
    assert drafter.prefill_choice == PrefillChoice(2)
    # the reference: the whole body in float32, its last hidden states rounded to bfloat16 before the (bf16) head
    reference_model = _bf16_drafter_model().float()
    hidden = reference_model.model(input_ids=ids).last_hidden_state.bfloat16()
    expected = model.lm_head(hidden).float()
    if head is not None:
        masked = torch.full_like(expected, float("-inf"))
        masked[..., head] = expected[..., head]
        expected = masked
    torch.testing.assert_close(got, expected, rtol=0, atol=0.05)
    # the stored-dtype catch-up differs by rounding only
    stored = ModelDrafter(model, float32_prefill=False, head_token_ids=head).catch_up(ids, return_logits=True)
    torch.testing.assert_close(got, stored, rtol=0, atol=0.5)


def test_the_cache_is_the_models_dtype_again_and_drafting_goes_on():
    model = _bf16_drafter_model()
    drafter = ModelDrafter(model, float32_prefill=True)
    ids = torch.randint(1, 90, (1, 20))
    drafter.catch_up(ids)
    assert {layer.keys.dtype for layer in drafter._cache.layers} == {torch.bfloat16}
    tokens, logits = drafter.draft(ids, 3)
    longer = torch.cat([ids, tokens, torch.randint(1, 90, (1, 12))], dim=-1)
    drafter.catch_up(longer)  # a second float32 catch-up on a bf16 cache that single steps extended
    assert drafter._cache.get_seq_length() == longer.shape[1]
    assert {layer.keys.dtype for layer in drafter._cache.layers} == {torch.bfloat16}


def test_the_users_model_is_left_as_it_was():
    model = _bf16_drafter_model()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    embeddings = model.get_input_embeddings()
    drafter = ModelDrafter(model, float32_prefill=True)
    drafter.catch_up(torch.randint(1, 90, (1, 20)))
    assert model.get_input_embeddings() is embeddings and model.dtype == torch.bfloat16
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_spawned_copies_share_one_body_and_one_choice():
    drafter = ModelDrafter(_bf16_drafter_model(), float32_prefill=True)
    first, second = drafter.spawn(), drafter.spawn()
    first.catch_up(torch.randint(1, 90, (1, 20)))
    assert second.prefill_choice is first.prefill_choice is drafter.prefill_choice
    assert second._float32_body(20) is first._float32_body(20)


@pytest.mark.parametrize("float32_prefill", [True, False, None])
def test_generate_is_lossless_with_float32_catch_ups(target, float32_prefill):
    # long prompts, so that the prompt's prefill and the catch-ups after other arms take the float32 body
    pool = [ModelDrafter(_bf16_drafter_model(), name="bf16", float32_prefill=float32_prefill), PromptLookupDrafter()]
    for prompt in prompts(3, seed=5, min_len=20, max_len=40):
        reference = greedy(target, prompt, 24)
        out = metasd_greedy(
            target, prompt, 24, assistant_models=pool, meta_policy="round_robin", num_assistant_tokens=3
        )
        assert torch.equal(out, reference)
