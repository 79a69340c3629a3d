"""Gradient clipping and optimizer steps over a mix of DTensor and plain parameters.

After tensor parallelism alone, split layers hold ``DTensor`` parameters and the rest (norms,
unsplit layers) plain tensors, each whole on every rank. torch's clipping and the optimizers'
``foreach`` kernels refuse such mixed lists, so gradients are grouped by layout here: each group's
norm is computed by torch (a sharded group's norm is summed over its ranks), and the groups'
norms are combined.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, ParamSpec, TypeVar

import torch

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.placement_types import Placement

_P = ParamSpec("_P")
_R = TypeVar("_R")

__all__ = [
    "clip_grad_norm",
    "clip_grad_value",
    "group_by_layout",
    "has_mixed_layouts",
    "step_with_replication",
]


def _layout(tensor: torch.Tensor) -> tuple[DeviceMesh, tuple[Placement, ...]] | None:
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        return (tensor.device_mesh, tuple(tensor.placements))
    return None


def group_by_layout(tensors: Iterable[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Split ``tensors`` into lists of one layout each (plain tensors together; DTensors by mesh and placements)."""
    groups: dict[tuple[DeviceMesh, tuple[Placement, ...]] | None, list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault(_layout(tensor), []).append(tensor)
    return list(groups.values())


def has_mixed_layouts(tensors: Iterable[torch.Tensor]) -> bool:
    """Whether ``tensors`` mix plain tensors and DTensors (or DTensors of several meshes)."""
    return len(group_by_layout(tensors)) > 1


def _full(norm: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def clip_grad_norm(
    parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
) -> torch.Tensor:
    """Clip the gradients of ``parameters`` to a total norm of ``max_norm``; return the norm before clipping.

    The norm is the one of the whole (unsplit) gradients, the same on every rank and equal to a
    single-process run's.
    """
    params = [p for p in parameters if p.grad is not None]
    if not params:
        return torch.tensor(0.0)
    norm_type = float(norm_type)
    groups = group_by_layout(params)
    norms = [
        _full(torch.nn.utils.get_total_norm([p.grad for p in group if p.grad is not None], norm_type))
        for group in groups
    ]
    device = norms[0].device
    total = torch.nn.utils.get_total_norm([n.to(device) for n in norms], norm_type)
    for group in groups:
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return total


def clip_grad_value(parameters: Iterable[torch.Tensor], clip_value: float) -> None:
    """Clamp every gradient element of ``parameters`` into ``[-clip_value, clip_value]``."""
    params = [p for p in parameters if p.grad is not None]
    for group in group_by_layout(params):
        torch.nn.utils.clip_grad_value_(group, clip_value)


def step_with_replication(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """Wrap an optimizer method so that plain tensors count as replicated DTensors inside it.

    The plain parameters of a tensor-parallel model are whole on every rank, so treating them as
    replicated is exact; it lets ``foreach`` kernels take them in the same list as the DTensors.
    """
    from torch.distributed.tensor.experimental import implicit_replication

    @functools.wraps(method)
    def wrapped(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with implicit_replication():
            return method(*args, **kwargs)

    return wrapped
