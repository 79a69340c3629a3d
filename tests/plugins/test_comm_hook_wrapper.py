"""DistributedDataParallelKwargs installs a PowerSGD hook wrapped to compress in fp16/bf16."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from accelerando.core.settings.machine import free_port
from accelerando.plugins.kwargs import DistributedDataParallelKwargs


@pytest.fixture
def one_process_group():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(free_port())
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


# bf16 compression is the same code path; torch accepts it only with NCCL (or XCCL), not on gloo.
@pytest.mark.parametrize("wrapper", ["fp16"])
def test_power_sgd_hook_with_a_compression_wrapper_registers(one_process_group, wrapper):
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    DistributedDataParallelKwargs(comm_hook="power_sgd", comm_wrapper=wrapper).register_comm_hook(model)
    ((hook, state),) = model._comm_hooks
    # torch's compress wrappers name the hook they return after the wrapped one and the compression.
    assert wrapper in hook.__name__ or "powerSGD" in hook.__name__
    assert type(state).__name__ == "PowerSGDState"
