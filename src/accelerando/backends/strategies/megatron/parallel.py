"""Collectives over Megatron-LM's data-parallel group (every process when megatron-core is not running)."""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = [
    "avg_losses_across_data_parallel_group",
    "data_parallel_group",
    "gather_across_data_parallel_groups",
]


def data_parallel_group() -> dist.ProcessGroup | None:
    """The data-parallel process group: megatron-core's when its model parallelism is initialised,
    else the default group; None when torch.distributed is not initialised (one process).
    """
    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        from megatron.core import parallel_state  # type: ignore[import-not-found]
    except ImportError:
        return dist.group.WORLD
    if parallel_state.model_parallel_is_initialized():
        group = parallel_state.get_data_parallel_group()
        assert isinstance(group, dist.ProcessGroup), "megatron-core's data-parallel group is initialised"
        return group
    return dist.group.WORLD


def avg_losses_across_data_parallel_group(losses: list[torch.Tensor]) -> torch.Tensor:
    """Average each loss over the data-parallel processes.

    Args:
        losses: scalar tensors (one per loss kind).

    Returns:
        A 1-D tensor, entry i the mean of ``losses[i]`` over the data-parallel group (the values
        themselves in one process).
    """
    averaged = torch.cat([loss.detach().clone().float().reshape(1) for loss in losses])
    group = data_parallel_group()
    if group is None:
        return averaged
    dist.all_reduce(averaged, group=group)
    return averaged / dist.get_world_size(group=group)


def gather_across_data_parallel_groups(tensor: object) -> object:
    """Concatenate ``tensor`` (or every tensor of a nested list / tuple / dict) over the data-parallel group.

    Tensors are gathered along dimension 0 (0-d tensors become one entry per process); one process
    returns them as they are.
    """
    group = data_parallel_group()
    if isinstance(tensor, dict):
        return {key: gather_across_data_parallel_groups(value) for key, value in tensor.items()}
    if isinstance(tensor, (list, tuple)):
        return type(tensor)(gather_across_data_parallel_groups(value) for value in tensor)
    if not isinstance(tensor, torch.Tensor) or group is None:
        return tensor
    local = tensor.contiguous() if tensor.dim() else tensor.reshape(1)
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group=group))]
    dist.all_gather(parts, local, group=group)
    return torch.cat(parts, dim=0)
