"""LocalSGD (2 real processes), ParallelismConfig arithmetic, and the clear refusals of unsupported backends."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from accelerando import ParallelismConfig
from suite_support import run_distributed_preloaded


def _local_sgd_rank():
    import torch.distributed as dist

    from accelerando import Accelerator
    from accelerando.local_sgd import LocalSGD

    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    acc = Accelerator()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    rank = dist.get_rank()
    x = torch.full((8, 4), float(rank + 1))
    history = []
    with LocalSGD(acc, model, local_sgd_steps=2) as local_sgd:
        for _ in range(3):
            acc.backward(model(x).pow(2).mean())
            opt.step()
            opt.zero_grad()
            local_sgd.step()
            history.append(acc.unwrap_model(model).weight.detach().clone())
    final = acc.unwrap_model(model).weight.detach().clone()
    return history, final


def test_local_sgd_averages_every_k_steps():
    (h0, f0), (h1, f1) = run_distributed_preloaded(_local_sgd_rank, 2)
    assert not torch.equal(h0[0], h1[0])  # step 1: trained locally, no all-reduce
    torch.testing.assert_close(h0[1], h1[1])  # step 2: averaged
    assert not torch.equal(h0[2], h1[2])
    torch.testing.assert_close(f0, f1)  # leaving the context averages


def test_parallelism_config_arithmetic():
    config = ParallelismConfig(dp_shard_size=2, tp_size=2)
    assert config.total_size == 4 and config.active_mesh_dims == ["dp_shard", "tp"]
    assert config.fsdp_enabled and config.tp_enabled and not config.cp_enabled
    config.validate(4)
    with pytest.raises(ValueError, match="dp_shard=2 x cp=1 x tp=2|= 4 processes but the job has 8"):
        config.validate(8)
    with pytest.raises(ValueError, match="tp_size"):
        ParallelismConfig(tp_size=0)


def test_gpu_only_backends_refuse_clearly_on_cpu():
    from accelerando.utils import convert_model

    # Transformer Engine needs CUDA: the error names the backend that runs here.
    with pytest.raises(ImportError, match="fp8_backend ao"):
        convert_model(nn.Linear(2, 2))


def test_multi_device_parallelism_config_and_stateful_flags(fresh_state):
    from accelerando import Accelerator, DataLoaderConfiguration, DistributedType, ParallelismConfig
    from accelerando.backends.connector import is_multi_device

    accelerator = Accelerator(
        cpu=True,
        dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True),
        parallelism_config=ParallelismConfig(),
    )
    assert accelerator.multi_device is False  # one CPU process
    assert isinstance(accelerator.parallelism_config, ParallelismConfig)
    assert accelerator.use_stateful_dataloader is True
    assert is_multi_device(DistributedType.MULTI_GPU) and is_multi_device(DistributedType.MULTI_XPU)
    assert not is_multi_device(DistributedType.MULTI_CPU) and not is_multi_device(DistributedType.FSDP)
