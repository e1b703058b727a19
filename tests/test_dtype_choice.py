"""``--dtype auto`` (`hf_metasd.benchmark.dtype`): bfloat16 only where the machine has bfloat16 matrix units and a
plain step measures no slower than in float32; the choice is said; a user's model is never converted."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama

from hf_metasd.benchmark import dtype as auto
from hf_metasd.benchmark.run import load_target


def _fake_steps(monkeypatch, float32: float, bfloat16: float):
    def seconds(model, repeats=9, context=32):
        value = bfloat16 if next(model.parameters()).dtype == torch.bfloat16 else float32
        return [value] * repeats

    monkeypatch.setattr(auto, "plain_step_seconds", seconds)


def test_without_bfloat16_units_float32_is_kept_and_nothing_is_measured(monkeypatch):
    monkeypatch.setattr(auto, "bfloat16_units", lambda device="cpu": None)
    monkeypatch.setattr(auto, "plain_step_seconds", lambda *a, **k: pytest.fail("measured without units"))
    model = tiny_llama(0)
    chosen, choice = auto.choose_dtype(model)
    assert chosen is model and choice.dtype == "float32" and choice.units is None
    assert choice.describe() == "dtype auto -> float32 (no bfloat16 matrix units on this machine)"


@pytest.mark.parametrize(
    ("float32", "bfloat16", "expected"),
    [(0.040, 0.030, "bfloat16"), (0.040, 0.041, "bfloat16"), (0.040, 0.045, "float32")],
)
def test_with_units_the_measured_plain_step_decides(monkeypatch, float32, bfloat16, expected):
    """bfloat16 when its step is at most 1 + NOISE times float32's (0.041 / 0.040 is within 5 %, 0.045 is not)."""
    monkeypatch.setattr(auto, "bfloat16_units", lambda device="cpu": "avx512_bf16")
    _fake_steps(monkeypatch, float32, bfloat16)
    model = tiny_llama(0)
    chosen, choice = auto.choose_dtype(model)
    assert choice.dtype == expected
    assert next(chosen.parameters()).dtype == getattr(torch, expected)
    assert next(model.parameters()).dtype == torch.float32  # the float32 model is not converted in place
    assert choice.float32_ms == pytest.approx(1000 * float32) and choice.bfloat16_ms == pytest.approx(1000 * bfloat16)
    assert choice.describe().startswith(f"dtype auto -> {expected} (avx512_bf16; a plain step: bfloat16 ")


def test_the_measurement_runs_on_a_real_model():
    seconds = auto.plain_step_seconds(tiny_llama(0), repeats=3)
    assert len(seconds) == 3 and all(s > 0 for s in seconds)


def test_auto_needs_a_float32_model():
    with pytest.raises(ValueError, match=r"`model` must be loaded in float32 .* but is torch.bfloat16\. Load it"):
        auto.choose_dtype(tiny_llama(0).to(torch.bfloat16))


def test_an_unknown_dtype_is_refused_before_loading(monkeypatch):
    from hf_metasd.benchmark import run

    monkeypatch.setattr(run, "load_models", lambda *a: pytest.fail("loaded"))
    with pytest.raises(ValueError, match=r"`dtype` must be one of \['auto', 'float32', 'bfloat16'\], but is 'fp8'"):
        load_target("smollm2", "fp8", 2)


def test_load_target_resolves_auto_and_says_so(monkeypatch):
    from hf_metasd.benchmark import run

    model = tiny_llama(0)
    monkeypatch.setattr(run, "load_models", lambda models, dtype, threads: (model, None))
    monkeypatch.setattr(auto, "bfloat16_units", lambda device="cpu": "amx_bf16")
    _fake_steps(monkeypatch, 0.05, 0.03)
    said = []
    target, _, name = load_target("smollm2", "auto", 2, said.append)
    assert name == "bfloat16" and next(target.parameters()).dtype == torch.bfloat16
    assert said == ["dtype auto -> bfloat16 (amx_bf16; a plain step: bfloat16 30.0 ms, float32 50.0 ms)"]


def test_cpu_units_are_reported_from_torch():
    assert auto.bfloat16_units("cpu") in (None, "amx_bf16", "avx512_bf16")
    assert auto.bfloat16_units("meta") is None
