"""Settings are resolved once per Accelerator (plugins included), in the connector."""

from __future__ import annotations

import pytest

from suite_support import reset_accelerator_state


@pytest.fixture
def count_resolutions(monkeypatch, fresh_state):
    """Count how often the environment is read into settings (what a "resolution" costs)."""
    import sys

    import accelerando.core.settings  # noqa: F401 - loads the resolver module

    resolve_module = sys.modules["accelerando.core.settings.resolve"]

    calls: list[int] = []
    real = resolve_module.env_layer

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(resolve_module, "env_layer", counting)
    resolve_module.forget_process_settings()
    yield calls
    resolve_module.forget_process_settings()


def test_one_resolution_per_accelerator_with_plugins(monkeypatch, count_resolutions):
    from accelerando import Accelerator
    from accelerando.plugins.deepspeed import DeepSpeedPlugin
    from accelerando.plugins.fsdp import FullyShardedDataParallelPlugin
    from accelerando.plugins.megatron import MegatronLMPlugin

    monkeypatch.setenv("ACCELERANDO_MIXED_PRECISION", "bf16")
    monkeypatch.setenv("FSDP_SHARDING_STRATEGY", "SHARD_GRAD_OP")
    fsdp, deepspeed, megatron = FullyShardedDataParallelPlugin(), DeepSpeedPlugin(), MegatronLMPlugin()
    accelerator = Accelerator(cpu=True)
    assert len(count_resolutions) == 1
    # The plugins and the Accelerator saw the same environment.
    assert fsdp.sharding_strategy == "SHARD_GRAD_OP" and deepspeed.zero_stage == 2 and megatron.tp_degree == 1
    assert accelerator.mixed_precision == "bf16"
    assert accelerator.settings.source("mixed_precision") == "env:ACCELERANDO_MIXED_PRECISION"

    # A changed environment is read again, once, for the next Accelerator and its plugins.
    reset_accelerator_state()
    monkeypatch.setenv("ACCELERANDO_MIXED_PRECISION", "no")
    FullyShardedDataParallelPlugin()
    DeepSpeedPlugin()
    second = Accelerator(cpu=True, gradient_accumulation_steps=2)
    assert len(count_resolutions) == 2
    assert second.mixed_precision == "no" and second.gradient_accumulation_steps == 2


def test_code_can_say_cpu_false_over_the_launcher(monkeypatch, fresh_state):
    from accelerando.core.settings import resolve_runtime_settings

    monkeypatch.setenv("ACCELERATE_USE_CPU", "1")
    assert resolve_runtime_settings().cpu is True
    settings = resolve_runtime_settings({"cpu": False})
    assert settings.cpu is False and settings.source("cpu") == "code"


def test_state_views_are_read_only(fresh_state):
    from accelerando import Accelerator
    from accelerando.state import AcceleratorState, PartialState

    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    state = AcceleratorState()
    assert state.mixed_precision == "bf16" and state.distributed_type == accelerator.distributed_type
    with pytest.raises(AttributeError, match="read-only view"):
        state.mixed_precision = "fp16"
    with pytest.raises(AttributeError, match="read-only view"):
        PartialState().num_processes = 4
    assert accelerator._strategy.runtime is accelerator.runtime
    assert accelerator.runtime.settings is accelerator.settings
