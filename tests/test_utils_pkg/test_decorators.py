"""The skip decorators of accelerando.test_utils decide from the hardware, libraries and RUN_SLOW."""

from __future__ import annotations

import unittest

import pytest

from accelerando.common import imports
from accelerando.test_utils import testing


def _skipped(decorated: object) -> bool:
    return bool(getattr(decorated, "__unittest_skip__", False))


def _reason(decorated: object) -> str:
    return str(getattr(decorated, "__unittest_skip_why__", ""))


def _test() -> None:
    """A test function to decorate."""


@pytest.mark.parametrize(
    "value, skipped", [(None, True), ("", True), ("no", True), ("yes", False), ("1", False)]
)
def test_slow_follows_run_slow(monkeypatch, value, skipped):
    if value is None:
        monkeypatch.delenv("RUN_SLOW", raising=False)
    else:
        monkeypatch.setenv("RUN_SLOW", value)
    assert _skipped(testing.slow(_test)) is skipped


def test_slow_refuses_a_non_yes_no_value(monkeypatch):
    monkeypatch.setenv("RUN_SLOW", "maybe")
    with pytest.raises(ValueError, match="RUN_SLOW"):
        testing.slow(_test)


def test_skip_always_skips_functions_and_classes():
    class Case(unittest.TestCase):
        def test_x(self):
            raise AssertionError("never runs")

    assert _skipped(testing.skip(_test))
    result = unittest.TestResult()
    testing.skip(Case)("test_x").run(result)
    assert len(result.skipped) == 1 and not result.failures


def test_device_decorators_on_a_cpu_machine(monkeypatch):
    monkeypatch.setattr(testing, "torch_device", "cpu")
    monkeypatch.setattr(testing, "device_count", 1)
    assert not _skipped(testing.require_cpu(_test))
    assert _skipped(testing.require_non_cpu(_test))
    assert _skipped(testing.require_single_device(_test))
    assert _skipped(testing.require_multi_device(_test))
    assert not _skipped(testing.require_non_xpu(_test))


def test_device_decorators_on_a_multi_gpu_machine(monkeypatch):
    monkeypatch.setattr(testing, "torch_device", "cuda")
    monkeypatch.setattr(testing, "device_count", 4)
    monkeypatch.setattr(imports, "is_cuda_available", lambda: True)
    monkeypatch.setattr(imports, "is_torch_xla_available", lambda **_: False)
    monkeypatch.setattr(testing, "family_count", lambda name: 4 if name == "cuda" else 0)
    assert _skipped(testing.require_cpu(_test))
    assert not _skipped(testing.require_non_cpu(_test))
    assert not _skipped(testing.require_cuda(_test))
    assert not _skipped(testing.require_multi_device(_test))
    assert not _skipped(testing.require_multi_gpu(_test))
    assert not _skipped(testing.require_multi_gpu_or_xpu(_test))
    assert _skipped(testing.require_single_gpu(_test))
    assert _skipped(testing.require_single_device(_test))
    assert _skipped(testing.require_multi_xpu(_test))


def test_require_cuda_is_refused_under_torch_xla(monkeypatch):
    monkeypatch.setattr(imports, "is_cuda_available", lambda: True)
    monkeypatch.setattr(imports, "is_torch_xla_available", lambda **_: True)
    assert _skipped(testing.require_cuda(_test))
    assert _skipped(testing.require_non_torch_xla(_test))


def test_library_decorators_follow_availability(monkeypatch):
    monkeypatch.setattr(imports, "is_peft_available", lambda: False, raising=False)
    decorated = testing.require_peft(_test)
    assert _skipped(decorated) and "peft" in _reason(decorated)
    monkeypatch.setattr(imports, "is_peft_available", lambda: True, raising=False)
    assert not _skipped(testing.require_peft(_test))
    monkeypatch.setattr(imports, "is_deepspeed_available", lambda: False)
    assert _skipped(testing.require_deepspeed(_test))


def test_library_decorator_without_a_check_asks_for_the_module(monkeypatch):
    monkeypatch.delattr(imports, "is_timm_available", raising=False)
    monkeypatch.setattr(imports, "is_package_available", lambda name, *a: name != "timm")
    assert _skipped(testing.require_timm(_test))


@pytest.mark.parametrize(
    "wandb, tensorboard, comet, skipped",
    [
        (True, False, False, False),
        (False, True, False, False),
        (False, False, False, True),
        (True, True, True, True),
    ],
)
def test_require_trackers(monkeypatch, wandb, tensorboard, comet, skipped):
    monkeypatch.setattr(imports, "is_wandb_available", lambda: wandb)
    monkeypatch.setattr(imports, "is_tensorboard_available", lambda: tensorboard)
    monkeypatch.setattr(imports, "is_comet_ml_available", lambda: comet)
    assert _skipped(testing.require_trackers(_test)) is skipped


def test_require_torch_min_version():
    assert not _skipped(testing.require_torch_min_version(version="1.0")(_test))
    assert _skipped(testing.require_torch_min_version(_test, version="99.0"))
    with pytest.raises(ValueError, match="version"):
        testing.require_torch_min_version(_test)


def test_decorated_test_case_class_is_skipped_when_run():
    @testing.require_non_cpu
    class Case(unittest.TestCase):
        def test_x(self):
            raise AssertionError("never runs on CPU")

    result = unittest.TestResult()
    if testing.torch_device == "cpu":
        Case("test_x").run(result)
        assert len(result.skipped) == 1


def test_run_first_leaves_the_test_runnable():
    decorated = testing.run_first(_test)
    assert decorated is _test or decorated.__name__ == "_test"


def test_every_decorator_has_its_name_and_a_docstring():
    for name in testing.__all__:
        if name.startswith("require_"):
            decorator = getattr(testing, name)
            assert decorator.__name__ == name
            assert decorator.__doc__
