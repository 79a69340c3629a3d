"""``to_kwargs()`` reports what differs from a handler built with nothing given, environment included."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from accelerando.core.settings import environment_hidden, environment_text, process_settings
from accelerando.plugins.dynamo import TorchDynamoPlugin
from accelerando.plugins.kwargs import KwargsHandler


@dataclass
class _Handler(KwargsHandler):
    a: int = 0
    b: bool = False


def test_plain_handler_reports_changed_fields_only() -> None:
    assert _Handler().to_kwargs() == {}
    assert _Handler(a=2).to_kwargs() == {"a": 2}


def test_dynamo_values_from_the_environment_count_as_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "aot_ts_nvfuser")
    monkeypatch.setenv("ACCELERATE_DYNAMO_MODE", "reduce-overhead")
    plugin = TorchDynamoPlugin()
    assert plugin.to_kwargs() == {"backend": "aot_ts_nvfuser", "mode": "reduce-overhead"}
    assert plugin.to_dict()["backend"] == "aot_ts_nvfuser"
    # the defaults were built without touching the process environment
    assert os.environ["ACCELERATE_DYNAMO_BACKEND"] == "aot_ts_nvfuser"


def test_environment_hidden_hides_settings_and_raw_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "2")
    with environment_hidden():
        assert process_settings().source("mixed_precision") == "default"
        assert environment_text("PARALLELISM_CONFIG_TP_SIZE", "1") == "1"
    assert process_settings()["mixed_precision"] == "bf16"
    assert environment_text("PARALLELISM_CONFIG_TP_SIZE") == "2"
