"""The Accelerator facade: join_uneven_inputs, bypass_device_map, use_parallelism_config."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from accelerando import Accelerator

pytestmark = pytest.mark.usefixtures("fresh_state")


def _loader(n: int = 5) -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(n, dtype=torch.float32)), batch_size=1)


class _Stream(IterableDataset):
    def __iter__(self):
        yield from (torch.tensor([float(i)]) for i in range(3))


# ------------------------------------------------------------------------------ join_uneven_inputs
def test_join_uneven_inputs_overrides_and_restores_batch_samplers() -> None:
    acc = Accelerator()
    model = acc.prepare(nn.Linear(1, 1))
    before = acc.prepare(_loader())
    assert before.batch_sampler.even_batches is True
    with acc.join_uneven_inputs([model], even_batches=False):
        assert before.batch_sampler.even_batches is False
        inside = acc.prepare(_loader())  # prepared inside: keeps the Accelerator's value, no crash on exit
        assert inside.batch_sampler.even_batches is True
    assert before.batch_sampler.even_batches is True
    assert inside.batch_sampler.even_batches is True


def test_join_uneven_inputs_restores_after_an_error_and_leaves_none_alone() -> None:
    acc = Accelerator()
    model = acc.prepare(nn.Linear(1, 1))
    loader = acc.prepare(_loader())
    loader.batch_sampler.even_batches = False
    with pytest.raises(RuntimeError, match="boom"):
        with acc.join_uneven_inputs([model], even_batches=True):
            assert loader.batch_sampler.even_batches is True
            raise RuntimeError("boom")
    assert loader.batch_sampler.even_batches is False
    with acc.join_uneven_inputs([model]):  # no even_batches: nothing touched
        assert loader.batch_sampler.even_batches is False


def test_join_uneven_inputs_warns_for_iterable_loaders() -> None:
    acc = Accelerator()
    model = acc.prepare(nn.Linear(1, 1))
    acc.prepare(DataLoader(_Stream(), batch_size=1))
    with pytest.warns(UserWarning, match="iterable datasets"):
        with acc.join_uneven_inputs([model], even_batches=False):
            pass
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with acc.join_uneven_inputs([model]):
            pass


# ------------------------------------------------------------------------------ bypass_device_map
def _spread_model() -> nn.Module:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    model.hf_device_map = {"0": "cpu", "1": "disk"}
    return model


def test_spread_model_refused_in_a_distributed_run_unless_bypassed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCELERATE_BYPASS_DEVICE_MAP", raising=False)
    acc = Accelerator()
    acc.prepare(_spread_model())  # one process: allowed as the reference does
    # the preparer reads the process count from the state
    monkeypatch.setattr(type(acc.state), "num_processes", property(lambda self: 2), raising=False)
    with pytest.raises(ValueError, match="ACCELERATE_BYPASS_DEVICE_MAP"):
        acc.prepare(_spread_model())
    one_device = nn.Linear(2, 2)
    one_device.hf_device_map = {"": "cpu"}
    acc.prepare(one_device)  # a map onto one device is not a spread model
    monkeypatch.setenv("ACCELERATE_BYPASS_DEVICE_MAP", "true")
    model = _spread_model()
    assert acc.prepare(model) is not None


# ------------------------------------------------------------------------------ use_parallelism_config
def test_use_parallelism_config_builds_one_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from accelerando import ParallelismConfig
    from accelerando.facade.parallelism_settings import default_parallelism_config

    for name in ("ACCELERATE_USE_PARALLELISM_CONFIG", "PARALLELISM_CONFIG_TP_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert default_parallelism_config(None) is None
    given = ParallelismConfig()
    monkeypatch.setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "true")
    assert default_parallelism_config(given) is given  # code wins
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "3")
    built = default_parallelism_config(None)
    assert isinstance(built, ParallelismConfig) and built.tp_size == 3
    monkeypatch.delenv("PARALLELISM_CONFIG_TP_SIZE")
    acc = Accelerator()
    assert isinstance(acc.state.parallelism_config, ParallelismConfig)


# ------------------------------------------------------------------------------ fp8_backend / dynamo
def test_fp8_backend_is_an_fp8_backend_type() -> None:
    from accelerando.utils.dataclasses import FP8BackendType

    assert Accelerator().fp8_backend == FP8BackendType.NO


def test_prepare_model_compiles_through_the_dynamo_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    from accelerando.plugins.dynamo import TorchDynamoPlugin

    seen: list[object] = []

    def compile_stub(self, model, distributed_type=None):
        seen.append(distributed_type)
        return model

    monkeypatch.setattr(TorchDynamoPlugin, "compile", compile_stub)
    acc = Accelerator(dynamo_plugin=TorchDynamoPlugin(backend="eager", use_regional_compilation=True))
    acc.prepare(nn.Linear(2, 2))
    assert seen == [acc.distributed_type]
