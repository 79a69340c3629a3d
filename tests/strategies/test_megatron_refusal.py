"""Megatron-LM on a machine without megatron-core / CUDA: the Accelerator is built, ``prepare`` refuses."""

from __future__ import annotations

import pytest
import torch

from accelerando.utils.megatron_lm import MegatronLMUnavailableError
from suite_support import reset_accelerator_state

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA"
)


@pytest.fixture
def accelerator():
    from accelerando import Accelerator
    from accelerando.plugins.megatron import MegatronLMPlugin

    reset_accelerator_state(partial=False)
    yield Accelerator(cpu=True, megatron_lm_plugin=MegatronLMPlugin(tp_degree=2))
    reset_accelerator_state(partial=False)


def _check_message(message: str) -> None:
    assert "megatron-core" in message and "CUDA" in message
    assert "ParallelismConfig(tp_size=...)" in message
    assert "PipelineParallelPlugin" in message


def test_creation_succeeds_and_prepare_refuses_naming_the_alternatives(accelerator):
    from accelerando.core.enums import DistributedType

    assert accelerator.distributed_type == DistributedType.MEGATRON_LM
    assert type(accelerator._strategy).__name__ == "MegatronStrategy"
    model = torch.nn.Linear(4, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(MegatronLMUnavailableError) as info:
        accelerator.prepare(model)
    _check_message(str(info.value))
    # It is also an ImportError / RuntimeError / ValueError, and nothing was wrapped or moved.
    assert isinstance(info.value, (ImportError)) and isinstance(info.value, RuntimeError)
    assert isinstance(info.value, ValueError)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_every_prepare_path_refuses(accelerator):
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(MegatronLMUnavailableError, match="PipelineParallelPlugin"):
        accelerator.prepare(model, optimizer)
    with pytest.raises(MegatronLMUnavailableError, match="megatron-core"):
        accelerator.prepare_model(model)
    with pytest.raises(MegatronLMUnavailableError, match="megatron-core"):
        accelerator.prepare_optimizer(optimizer)
