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
        on = metasd_greedy(
            target, prompt, 16, assistant_models=drafters, num_assistant_tokens=3, meta_skinny_gemm=True
        )
        assert calls, "verification passes of 4 tokens must take the transposed product"
        calls.clear()
        off = metasd_greedy(
            target, prompt, 16, assistant_models=drafters, num_assistant_tokens=3, meta_skinny_gemm=False
        )
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
