"""`hf_metasd.kernels.skinny_linear`: same products, only where it applies, always undone, lossless in generate."""

from __future__ import annotations

import pytest
import torch
from conftest import greedy, metasd_greedy, prompts

from hf_metasd import MetaSDConfigError
from hf_metasd.kernels import skinny_linear, skinny_linear_applies


def _counting_mm(monkeypatch):
    calls = []
    original = torch.mm

    def mm(a, b):
        calls.append((tuple(a.shape), tuple(b.shape)))
        return original(a, b)

    monkeypatch.setattr(torch, "mm", mm)
    return calls


@pytest.mark.parametrize("rows", [2, 3, 5, 8])
def test_transposed_product_equals_linear(rows, monkeypatch):
    torch.manual_seed(0)
    layer = torch.nn.Linear(24, 40)
    x = torch.randn(1, rows, 24)
    expected = layer(x)
    calls = _counting_mm(monkeypatch)
    with skinny_linear(layer) as changed:
        got = layer(x)
    assert changed == 1
    assert calls == [((40, 24), (24, rows))], "the transposed product must be what ran"
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_transposed_product_returns_a_contiguous_tensor(bias):
    # a strided last dimension would follow the activation into attention, where SDPA leaves its flash kernel
    layer = torch.nn.Linear(24, 40, bias=bias)
    with skinny_linear(layer):
        got = layer(torch.randn(1, 4, 24))
    assert got.is_contiguous() and got.stride(-1) == 1


@pytest.mark.parametrize("rows", [1, 9, 64])
def test_other_row_counts_run_the_layers_own_forward(rows, monkeypatch):
    layer = torch.nn.Linear(8, 8, bias=False)
    calls = _counting_mm(monkeypatch)
    with skinny_linear(layer):
        layer(torch.randn(1, rows, 8))
    assert calls == []


def test_only_float32_cpu_linear_layers_without_a_replaced_forward_change():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4).bfloat16(), torch.nn.Embedding(5, 4))
    hooked = torch.nn.Linear(4, 4)
    hooked.forward = lambda x: x  # what accelerate's hooks do
    model.append(hooked)
    with skinny_linear(model) as changed:
        assert changed == 1
        assert "forward" in model[0].__dict__ and "forward" not in model[1].__dict__
    assert "forward" not in model[0].__dict__
    assert model[3].__dict__["forward"] is not None, "a forward set by someone else must be left in place"
    assert skinny_linear_applies(model) and not skinny_linear_applies(model[1])


def test_layers_get_their_forward_back_after_an_exception():
    layer = torch.nn.Linear(4, 4)
    with pytest.raises(RuntimeError, match="boom"), skinny_linear(layer):
        raise RuntimeError("boom")
    assert "forward" not in layer.__dict__


@pytest.mark.parametrize("bad", [1, 0, "8", True])
def test_max_rows_must_be_an_int_of_at_least_two(bad):
    match = r"`max_rows` must be an int >= 2, but is .*\. Pass e\.g\. 8\."
    with pytest.raises(ValueError, match=match), skinny_linear(torch.nn.Linear(2, 2), max_rows=bad):
        pass


def test_generate_routes_the_verification_passes_and_stays_lossless(target, drafters, monkeypatch):
    """With and without the kernel: the target's greedy output, and only with it does `torch.mm` run."""
    for prompt in prompts(6, seed=7):
        reference = greedy(target, prompt, 16)
        calls = _counting_mm(monkeypatch)
        # every call from nothing (no learned priors), so that each one drafts and verifies 4-token passes
        fresh = {"num_assistant_tokens": 3, "meta_learned_priors": False}
        on = metasd_greedy(target, prompt, 16, assistant_models=drafters, meta_skinny_gemm=True, **fresh)
        assert calls, "verification passes of 4 tokens must take the transposed product"
        calls.clear()
        off = metasd_greedy(target, prompt, 16, assistant_models=drafters, meta_skinny_gemm=False, **fresh)
        assert calls == []
        assert torch.equal(on, reference) and torch.equal(off, reference)
        monkeypatch.undo()
    assert all("forward" not in m.__dict__ for m in target.modules()), "generate must undo the kernel"


def test_meta_skinny_gemm_must_be_a_bool_or_none(target, drafters):
    calls = []
    handle = target.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(
            MetaSDConfigError, match=r"`meta_skinny_gemm` must be True, False or None \(automatic\), but is 'yes'\."
        ):
            metasd_greedy(target, prompts(1)[0], 4, assistant_models=drafters, meta_skinny_gemm="yes")
    finally:
        handle.remove()
    assert not calls


class _Timer:
    """A fake clock: each timed product costs `stock` or `skinny` units, in the order the measurement calls them."""

    def __init__(self, stock: float, skinny: float):
        self.now, self.calls, self.durations = 0.0, 0, [stock, skinny]

    def __call__(self):
        # every measured call reads the clock twice (start, end); ends advance by the product's cost, alternating
        self.calls += 1
        if self.calls % 2 == 0:
            self.now += self.durations[(self.calls // 2 - 1) % 2]
        return self.now


@pytest.mark.parametrize(
    ("stock", "skinny", "expected"), [(2.0, 1.0, "skinny"), (1.0, 2.0, "stock"), (1.0, 0.99, "stock")]
)
def test_the_kernel_is_chosen_by_measurement(stock, skinny, expected):
    from hf_metasd.kernels import choose_verification_kernel, clear_kernel_choices

    clear_kernel_choices()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 8), torch.nn.Linear(8, 16))
    timer = _Timer(stock, skinny)
    choice = choose_verification_kernel(model, [4], repeats=3, timer=lambda: timer())
    assert choice.kernel == expected and choice.measured
    # two groups of shapes ((16, 8) twice, (8, 16) once), 3 repeats each: the medians times the layer counts
    assert choice.stock_seconds == pytest.approx(3 * stock) and choice.skinny_seconds == pytest.approx(3 * skinny)
    # cached for the process: a second call measures nothing
    again = choose_verification_kernel(model, [4], timer=lambda: 1 / 0)
    assert again.kernel == expected and again.seconds == 0.0
    clear_kernel_choices()


def test_generate_reports_the_measured_kernel(target, drafters):
    from hf_metasd.kernels import clear_kernel_choices

    clear_kernel_choices()
    out = metasd_greedy(target, prompts(1)[0], 8, assistant_models=drafters, return_dict_in_generate=True)
    stats = out.metasd
    assert stats.kernel in ("stock", "skinny") and set(stats.kernel_timings) == {"stock_seconds", "skinny_seconds"}
    assert stats.kernel_choice_seconds > 0
    forced = metasd_greedy(
        target, prompts(1)[0], 8, assistant_models=drafters, meta_skinny_gemm=True, return_dict_in_generate=True
    )
    assert forced.metasd.kernel == "skinny" and forced.metasd.kernel_timings == {}
    assert torch.equal(forced.sequences, out.sequences)


def test_a_draft_cap_above_max_rows_still_measures_the_kernel_and_checks_short_passes(target, drafters, monkeypatch):
    import hf_metasd.kernels
    from hf_metasd.kernels import DEFAULT_MAX_ROWS, clear_kernel_choices

    asked = []
    choose = hf_metasd.kernels.choose_verification_kernel
    monkeypatch.setattr(
        hf_metasd.kernels,
        "choose_verification_kernel",
        lambda model, rows: asked.append(rows) or choose(model, rows),
    )
    clear_kernel_choices()
    num = DEFAULT_MAX_ROWS + 4  # above the transposed product's rows: it was "stock" for every pass, unmeasured
    out = metasd_greedy(
        target, prompts(1)[0], 12, assistant_models=drafters, num_assistant_tokens=num, return_dict_in_generate=True
    )
    assert asked == [[DEFAULT_MAX_ROWS]]  # timed at the longest pass the transposed product applies to
    assert set(out.metasd.kernel_timings) == {"stock_seconds", "skinny_seconds"}
    assert {k for k in out.metasd.kernels if k is not None} <= {"stock", "skinny"} and any(out.metasd.kernels)
    assert torch.equal(out.sequences, greedy(target, prompts(1)[0], 12))
    clear_kernel_choices()


def test_bfloat16_targets_are_never_measured():
    from hf_metasd.kernels import choose_verification_kernel

    choice = choose_verification_kernel(torch.nn.Linear(8, 8).bfloat16(), [4], timer=lambda: 1 / 0)
    assert choice.kernel == "stock" and not choice.measured


# ---------------------------------------------------------------------------------------------------------------------
# the first choice, checked on whole verification passes (`PassKernels`)
# ---------------------------------------------------------------------------------------------------------------------
def test_pass_kernels_try_both_then_follow_the_cheaper_and_recheck_on_a_doubling_schedule():
    from hf_metasd.kernels import PassKernels

    kernels = PassKernels(None, "stock")  # a first choice that a burst of load could have got wrong
    ran = []
    for _ in range(40):
        kernel = kernels.choose(3)
        ran.append(kernel)
        kernels.observe(3, kernel, 0.1 if kernel == "skinny" else 0.3)
    # stock first (pass 0), skinny once (pass 1), then skinny leads; stock is re-checked once skinny has
    # 4 * 2**1 = 8 passes (pass 9), then 4 * 2**2 = 16 (pass 18) and 4 * 2**3 = 32 (pass 35)
    stock_at = [i for i, kernel in enumerate(ran) if kernel == "stock"]
    assert stock_at == [0, 9, 18, 35]
    assert kernels.best(3) == "skinny" and kernels.summary()[3]["stock"] == pytest.approx(0.3)
    assert kernels.choose(9) is None and kernels.best(9) is None  # beyond max_rows: no choice there
    kernels.observe(9, "skinny", 5.0)  # ignored: the transposed product never applies there
    assert 9 not in kernels.summary()


def test_a_one_token_pass_starts_on_the_stock_kernel_whatever_the_first_choice():
    """Plain `generate`'s kernel first, then the row repeated twice once, then the cheaper, re-checked as above."""
    from hf_metasd.kernels import PassKernels

    kernels = PassKernels(None, "skinny")
    ran = []
    for _ in range(12):
        kernel = kernels.choose(1)
        ran.append(kernel)
        kernels.observe(1, kernel, 0.05 if kernel == "skinny" else 0.07)
    assert ran[:3] == ["stock", "skinny", "skinny"] and ran.index("stock", 1) == 9  # re-check at 4 * 2**1 passes
    assert kernels.best(1) == "skinny" and kernels.summary()[1] == pytest.approx({"stock": 0.07, "skinny": 0.05})
    slower = PassKernels(None, "skinny")
    slower.observe(1, "stock", 0.05)
    slower.observe(1, "skinny", 0.05)
    assert slower.best(1) == "stock"  # a tie keeps the stock kernel for one token


def test_pass_kernels_are_kept_per_length_and_per_target_and_the_first_choice_wins_ties():
    from hf_metasd.kernels import PassKernels

    model = torch.nn.Linear(4, 4)
    first = PassKernels(model, "skinny")
    first.observe(4, "skinny", 0.2)
    first.observe(4, "stock", 0.2)
    assert first.best(4) == "skinny" and first.choose(2) == "skinny"  # a tie; length 2 has no pass yet
    later = PassKernels(model, "stock")  # a later call of the same process and target reads the same passes
    assert later.summary() == {4: {"skinny": 0.2, "stock": 0.2}} and later.best(4) == "stock"
    assert PassKernels(torch.nn.Linear(4, 4), "skinny").summary() == {}
    with pytest.raises(ValueError, match=r"`first_choice` must be one of \['skinny', 'stock'\], but is 'fast'\."):
        PassKernels(None, "fast")


def test_the_switch_turns_the_transposed_product_off_between_passes(monkeypatch):
    from hf_metasd.kernels import KernelSwitch

    layer, x = torch.nn.Linear(16, 32), torch.randn(1, 4, 16)
    switch = KernelSwitch(skinny=False)
    calls = _counting_mm(monkeypatch)
    with skinny_linear(layer, switch=switch):
        assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias)) and calls == []
        switch.skinny = True
        layer(x)
    assert len(calls) == 1


def test_the_switch_computes_one_row_as_the_row_repeated_twice_only_when_asked(monkeypatch):
    from hf_metasd.kernels import KernelSwitch

    layer, x = torch.nn.Linear(16, 32), torch.randn(1, 1, 16)
    switch = KernelSwitch(skinny=True)
    assert repr(switch) == "KernelSwitch(skinny=True, one_row=False)"
    calls = _counting_mm(monkeypatch)
    with skinny_linear(layer, switch=switch):
        assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias)) and calls == []
        switch.one_row = True
        y = layer(x)
    assert len(calls) == 1 and y.shape == (1, 1, 32)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, layer.weight, layer.bias))
    with skinny_linear(layer):  # no switch (a forced kernel): one row keeps the layer's own forward
        layer(x)
    assert len(calls) == 1


def test_generate_times_its_plain_steps_under_both_one_row_products_and_stays_lossless(target, drafters):
    """The no-draft arm forced: every round after the prompt is a one-token pass; the first runs the stock kernel,
    the next the row repeated twice, and the output is plain greedy decoding's."""
    from hf_metasd.kernels import _PASS_COSTS

    _PASS_COSTS.pop(target, None)
    prompt = prompts(1, seed=4)[0]
    out = metasd_greedy(
        target,
        prompt,
        12,
        assistant_models=drafters,
        meta_policy="fixed",
        meta_policy_kwargs={"arm": len(drafters)},  # the no-draft arm
        meta_skinny_gemm=None,
        return_dict_in_generate=True,
    )
    stats = out.metasd
    assert torch.equal(out.sequences, greedy(target, prompt, 12))
    assert stats.drafted[1:] == [0] * (len(stats.drafted) - 1)
    assert stats.kernels[1:3] == ["stock", "skinny"]
    assert set(stats.kernel_pass_costs[1]) == {"stock", "skinny"}


def test_generate_checks_a_wrong_first_choice_on_its_passes_and_stays_lossless(target, drafters, monkeypatch):
    """A layer-level measurement that said "stock" (as a burst of load can make it say) while this process's passes
    of 4 tokens cost ten times more under it: the call verifies those passes with the transposed product."""
    from hf_metasd import kernels
    from hf_metasd.kernels import _PASS_COSTS, KernelChoice

    monkeypatch.setattr(kernels, "choose_verification_kernel", lambda *a, **k: KernelChoice("stock", 1.0, 1.1, True))
    _PASS_COSTS[target] = {(torch.get_num_threads(), 4): {"stock": (1.0, 3), "skinny": (0.1, 3)}}
    prompt = prompts(1, seed=3)[0]
    out = metasd_greedy(
        target,
        prompt,
        16,
        assistant_models=drafters,
        num_assistant_tokens=3,
        meta_draft_length="fixed",
        meta_no_draft=False,
        return_dict_in_generate=True,
    )
    stats = out.metasd
    assert torch.equal(out.sequences, greedy(target, prompt, 16))
    four = [kernel for kernel, drafted in zip(stats.kernels[1:], stats.drafted[1:]) if drafted == 3]
    assert four and set(four) == {"skinny"} and stats.kernel == "skinny"
    assert stats.kernels[0] is None  # the first pass holds the prompt
    assert set(stats.kernel_pass_costs[4]) == {"stock", "skinny"}


# ---------------------------------------------------------------------------------------------------------------------
# one call's kernels (`VerificationKernels`): the hook the candidate generator calls around each verification pass
# ---------------------------------------------------------------------------------------------------------------------
def test_verification_kernels_switch_before_a_pass_and_learn_after_it(monkeypatch):
    from hf_metasd.kernels import KernelChoice, VerificationKernels

    layer = torch.nn.Linear(16, 64)
    kernels = VerificationKernels(layer, KernelChoice("skinny", 1.0, 0.5, True))
    calls = _counting_mm(monkeypatch)
    with kernels.applied():
        assert kernels.before_pass(3) == "skinny" and kernels.switch.skinny
        layer(torch.randn(3, 16))
        assert len(calls) == 1  # the transposed product ran
        assert kernels.after_pass(3, "skinny", 0.2)  # the only kernel timed at 3: the fastest so far
        assert kernels.before_pass(3) == "stock" and not kernels.switch.skinny  # then the other one, once
        assert kernels.after_pass(3, "stock", 0.4) is False  # a re-check of the slower kernel
        assert kernels.before_pass(1) == "stock" and not kernels.switch.one_row
        kernels.after_pass(1, "stock", 0.1)
        assert kernels.before_pass(1) == "skinny" and kernels.switch.one_row  # the row repeated twice, once
        kernels.after_pass(1, "skinny", None)
        assert not kernels.switch.one_row  # only for the pass it was set for: drafters' steps never run it
    assert "forward" not in layer.__dict__
    assert kernels.summary(["skinny", "stock", "skinny", None]) == (
        "skinny",
        {"stock_seconds": 1.0, "skinny_seconds": 0.5},
        {1: {"stock": 0.1}, 3: {"skinny": 0.2, "stock": 0.4}},
    )


def test_forced_verification_kernels_hold_for_every_pass():
    from hf_metasd.kernels import VerificationKernels

    layer = torch.nn.Linear(16, 64)
    forced = VerificationKernels.for_call(layer, True, 3)
    assert not forced.choice.measured and forced.before_pass(4) is None and forced.after_pass(4, None, 0.1)
    with forced.applied():
        assert "forward" in layer.__dict__  # the transposed product for the whole call
    assert forced.summary([None, None]) == ("skinny", {}, {})
    assert VerificationKernels.for_call(layer, False, 3).summary([]) == ("stock", {}, {})
