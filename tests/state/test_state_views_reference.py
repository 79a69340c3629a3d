"""The state views as code written for the reference sees them: shared dicts, reset errors, flags."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from accelerando import Accelerator
from accelerando.plugins.accumulation import GradientAccumulationPlugin
from accelerando.state import AcceleratorState, GradientState, PartialState

_RESET = r"This happens if `{}\._reset_state\(\)`"


@pytest.mark.usefixtures("fresh_state")
def test_partial_state_shared_dict_is_filled_after_an_accelerator() -> None:
    assert PartialState._shared_state == {}
    Accelerator(cpu=True)
    shared = PartialState._shared_state
    assert shared["_cpu"] is True
    assert shared["device"] == torch.device("cpu")
    assert shared["num_processes"] == 1 and shared["process_index"] == 0
    assert {"backend", "debug", "distributed_type", "local_process_index", "fork_launched"} <= set(shared)


@pytest.mark.slow
def test_transformers_use_configured_state_accepts_an_existing_state(tmp_path) -> None:
    """transformers reads ``PartialState._shared_state`` to find a configured state (fresh interpreter)."""
    pytest.importorskip("transformers")
    code = textwrap.dedent(
        f"""
        import accelerando
        accelerando.install_as_accelerate()
        import transformers
        from accelerate import Accelerator
        Accelerator(cpu=True)
        args = transformers.TrainingArguments(
            output_dir={str(tmp_path)!r}, use_cpu=True, accelerator_config={{"use_configured_state": True}}
        )
        print("device", args.device)
        """
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "device cpu" in result.stdout


@pytest.mark.usefixtures("fresh_state")
def test_partial_state_after_reset_names_the_reset() -> None:
    state = PartialState()
    with pytest.raises(AttributeError, match="'PartialState' object has no attribute 'other'"):
        state.other  # noqa: B018
    state._reset_state()
    with pytest.raises(AttributeError, match=_RESET.format("PartialState")) as caught:
        state.num_processes  # noqa: B018
    assert "`PartialState` object has no attribute `num_processes`" in str(caught.value)
    assert state.initialized is False
    state.mine = "value"
    assert state.mine == "value"
    assert PartialState().num_processes == 1  # a new construction brings the state back


@pytest.mark.usefixtures("fresh_state")
def test_accelerator_state_after_reset_names_the_reset() -> None:
    accelerator = Accelerator(cpu=True)
    with pytest.raises(AttributeError, match="'AcceleratorState' object has no attribute 'other'"):
        accelerator.state.other  # noqa: B018
    accelerator.state._reset_state()
    with pytest.raises(AttributeError, match=_RESET.format("AcceleratorState")):
        accelerator.num_processes  # noqa: B018
    with pytest.raises(AttributeError, match=_RESET.format("AcceleratorState")):
        accelerator.state.distributed_type  # noqa: B018
    assert PartialState().num_processes == 1  # the process state was kept
    assert AcceleratorState().num_processes == 1


@pytest.mark.usefixtures("fresh_state")
def test_gradient_state_plugin_kwargs_hold_the_changed_fields() -> None:
    state = GradientState()
    assert state.plugin_kwargs == {}
    plugin = GradientAccumulationPlugin(num_steps=2, adjust_scheduler=False, sync_each_batch=True)
    accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=plugin)
    assert state.plugin_kwargs == {"num_steps": 2, "adjust_scheduler": False, "sync_each_batch": True}
    accelerator.gradient_accumulation_steps = 5
    assert state.plugin_kwargs["num_steps"] == 5


@pytest.mark.usefixtures("fresh_state")
def test_prepare_flags_what_it_prepared() -> None:
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(list(range(4)), batch_size=2)
    other = [1, 2, 3]
    model, optimizer, loader, other = accelerator.prepare(model, optimizer, loader, other)
    assert model._is_accelerate_prepared is True
    assert optimizer._is_accelerate_prepared is True
    assert loader._is_accelerate_prepared is True
    assert not hasattr(other, "_is_accelerate_prepared")


@pytest.mark.usefixtures("fresh_state")
def test_quantized_model_with_cpu_offload_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import accelerando.accelerator as module

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    model.is_loaded_in_8bit = True
    model.hf_device_map = {"": "cpu"}
    monkeypatch.setattr(module, "is_bitsandbytes_multi_backend_available", lambda: False)
    with pytest.raises(ValueError, match="CPU or disk offload"):
        accelerator.prepare_model(model)
    monkeypatch.setattr(module, "is_bitsandbytes_multi_backend_available", lambda: True)
    assert accelerator.prepare_model(model) is not None


@pytest.mark.usefixtures("fresh_state")
def test_cpu_cannot_be_asked_for_once_placed_on_an_accelerator() -> None:
    import accelerando.core.runtime as runtime
    from accelerando.core.settings import resolve_runtime_settings

    context = PartialState()._process
    runtime.set_process(dataclasses.replace(context, device=torch.device("cuda", 0)))
    with pytest.raises(ValueError, match="cpu=True cannot be honoured"):
        PartialState(cpu=True)
    with pytest.raises(ValueError, match="cpu=True cannot be honoured"):
        runtime.start_process(resolve_runtime_settings({"cpu": True}))
    assert PartialState().device.type == "cuda"  # cpu=False (the default) keeps the placement
    runtime.set_process(context)
    assert PartialState(cpu=True).device.type == "cpu"
