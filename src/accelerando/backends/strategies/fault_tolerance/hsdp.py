"""HSDP under fault tolerance: FSDP2 shards the model inside a replica group, torchft averages across groups.

The processes of one replica group shard every prepared model with ``fully_shard`` over the group's
own mesh (``dp_shard``). FSDP2's reduce-scatter averages the gradients inside the group; its all-reduce
hook then averages each process's gradient shard with the processes of the same rank in the other groups
through torchft's fault-tolerant process group (a dead group makes the step fail and be dropped, as with
DDP). A recovering process copies the local shards of its peer of the same rank in a live group: the
shard layout is the same in every group, so the state travels as plain tensors, not DTensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.distributed.tensor import DTensor

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torchft import Manager

__all__ = ["LocalShardState", "group_mesh", "shard_within_group"]

_StateDict = dict[str, object]


def group_mesh(device_type: str, group_size: int) -> DeviceMesh:
    """The replica group's one-axis mesh ``("dp_shard",)`` (collective over the group's processes)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (group_size,), mesh_dim_names=("dp_shard",))


def shard_within_group(model: torch.nn.Module, manager: Manager, mesh: DeviceMesh) -> torch.nn.Module:
    """Shard ``model`` with FSDP2 over ``mesh`` and average its gradient shards across replica groups.

    Returns:
        The same module, now an ``FSDPModule``.
    """
    from torch.distributed.fsdp import FSDPModule, fully_shard

    fully_shard(model, mesh=mesh)
    assert isinstance(model, FSDPModule)

    def average_across_groups(reduced_shard: torch.Tensor) -> None:
        manager.allreduce(reduced_shard).wait()

    model.set_all_reduce_hook(average_across_groups)
    return model


def _local(value: object) -> object:
    """A DTensor's local shard; containers walked; anything else as it is."""
    if isinstance(value, DTensor):
        return value.to_local()
    if isinstance(value, dict):
        return {k: _local(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_local(v) for v in value]
    return value


class LocalShardState:
    """The recovery state of a sharded model or optimizer: this process's shards as plain tensors.

    Args:
        target: an FSDP2-sharded model, or an optimizer over its parameters.
    """

    def __init__(self, target: torch.nn.Module | torch.optim.Optimizer) -> None:
        self.target = target

    def state_dict(self) -> _StateDict:
        """The target's state dict with every DTensor replaced by its local shard."""
        local = _local(self.target.state_dict())
        assert isinstance(local, dict)
        return local

    def load_state_dict(self, state: _StateDict) -> None:
        """Load what a peer's :meth:`state_dict` returned into the target's shards."""
        if isinstance(self.target, torch.nn.Module):
            with torch.no_grad():
                for name, tensor in self.target.state_dict().items():
                    shard = tensor.to_local() if isinstance(tensor, DTensor) else tensor
                    received = state[name]
                    assert isinstance(received, torch.Tensor)
                    shard.copy_(received)
            return
        self.target.load_state_dict(state)
        # The optimizer state came as local tensors: give the per-parameter ones back their DTensor layout.
        for param, param_state in self.target.state.items():
            if not isinstance(param, DTensor):
                continue
            for key, value in param_state.items():
                if isinstance(value, torch.Tensor) and not isinstance(value, DTensor) and value.dim() > 0:
                    param_state[key] = DTensor.from_local(
                        value, param.device_mesh, param.placements, run_check=False
                    )
