"""A precision this hardware only emulates is reported once per process, naming the faster choice."""

from __future__ import annotations

import logging

import pytest

from accelerando.backends.precision import advice, build_precision


@pytest.fixture
def cpu(monkeypatch: pytest.MonkeyPatch):
    """A CPU whose native kernels the test chooses; the once-per-process memory starts empty."""
    native: dict[str, bool] = {"bf16": True, "fp16": False}
    monkeypatch.setattr(advice, "cpu_has_native", lambda dtype: native[dtype])
    monkeypatch.setattr(advice, "_WARNED", set())
    return native


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name.endswith("advice")
    ]


def test_fp16_on_cpu_warns_once_naming_the_choice_hardware_and_better_option(cpu, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        build_precision("fp16", "cpu")
        build_precision("fp16", "cpu")
    (message,) = _warnings(caplog)
    assert "mixed_precision='fp16'" in message and "CPU" in message and "emulated" in message
    assert "mixed_precision='bf16' is faster" in message


def test_no_and_native_bf16_on_cpu_stay_silent(cpu, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        build_precision("no", "cpu")
        build_precision("bf16", "cpu")
    assert _warnings(caplog) == []


def test_bf16_on_a_cpu_without_bf16_kernels_points_to_float32(cpu) -> None:
    cpu["bf16"] = False
    found = advice.precision_advice("bf16", "cpu")
    assert found is not None and found.better == "no"
    fp16 = advice.precision_advice("fp16", "cpu")
    assert fp16 is not None and fp16.better == "no"  # bf16 would be emulated too


def test_fp8_on_cpu_is_emulated(cpu) -> None:
    found = advice.precision_advice("fp8", "cpu", "ao")
    assert found is not None and "torchao emulates" in found.message and found.better == "bf16"


@pytest.mark.parametrize(
    ("precision", "capability", "backend", "better"),
    [
        ("bf16", (7, 0), None, "fp16"),
        ("bf16", (8, 0), None, None),
        ("fp16", (7, 0), None, None),
        ("fp8", (8, 0), "ao", "bf16"),
        ("fp8", (9, 0), "ao", None),
        ("fp8", (9, 0), "te", None),
    ],
)
def test_gpu_advice_follows_compute_capability(monkeypatch, precision, capability, backend, better) -> None:
    monkeypatch.setattr(advice, "_cuda_capability", lambda: capability)
    found = advice.precision_advice(precision, "cuda", backend)
    assert (found.better if found else None) == better
    if found:
        assert f"compute capability {capability[0]}.{capability[1]}" in found.message


def test_this_machine_answers_without_error() -> None:
    advice.cpu_has_native.cache_clear()
    assert isinstance(advice.cpu_has_native("bf16"), bool)
    assert isinstance(advice.cpu_has_native("fp16"), bool)
