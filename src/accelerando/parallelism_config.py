"""ParallelismConfig: how the processes of a job are laid out on a device mesh.

The mesh axes, outermost first, are ``dp_replicate`` (plain data parallel copies), ``dp_shard``
(FSDP sharding), ``cp`` (context parallel) and ``tp`` (tensor parallel). Their sizes must multiply to
the number of processes; one object checks that arithmetic and builds the mesh.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ParallelismConfig"]

_AXES = ("dp_replicate", "dp_shard", "cp", "tp")


@dataclass
class ParallelismConfig:
    """Sizes of each parallelism axis (1 = not used).

    Args:
        dp_replicate_size: data-parallel replicas. dp_shard_size: FSDP shards per replica.
        tp_size: tensor-parallel degree. cp_size: context-parallel degree.
        tp_handler / cp_handler: backend-specific options, kept for compatibility.

    Raises:
        ValueError: a size below 1.
    """

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    tp_handler: Any = None
    cp_handler: Any = None

    def __post_init__(self) -> None:
        for axis in _AXES:
            value = getattr(self, f"{axis}_size")
            if value is None:
                setattr(self, f"{axis}_size", 1)
            elif not isinstance(value, int) or value < 1:
                raise ValueError(f"ParallelismConfig.{axis}_size must be an integer >= 1, got {value!r}")

    @property
    def total_size(self) -> int:
        """Processes the layout needs: the product of every axis size."""
        total = 1
        for axis in _AXES:
            total *= getattr(self, f"{axis}_size")
        return total

    @property
    def active_mesh_dims(self) -> list[str]:
        """Names of the axes larger than 1, outermost first."""
        return [axis for axis in _AXES if getattr(self, f"{axis}_size") > 1]

    @property
    def dp_enabled(self) -> bool:
        """Whether gradients are averaged over several data-parallel ranks."""
        return self.dp_replicate_size > 1 or self.dp_shard_size > 1

    @property
    def fsdp_enabled(self) -> bool:
        """Whether parameters are sharded (dp_shard or cp axis)."""
        return self.dp_shard_size > 1 or self.cp_size > 1

    @property
    def tp_enabled(self) -> bool:
        """Whether tensor parallelism is used."""
        return self.tp_size > 1

    @property
    def cp_enabled(self) -> bool:
        """Whether context parallelism is used."""
        return self.cp_size > 1

    def validate(self, num_processes: int) -> None:
        """Check the layout fits ``num_processes``.

        Raises:
            ValueError: the product of the sizes differs from the process count (with the product shown).
        """
        if self.total_size != num_processes:
            sizes = " x ".join(f"{axis}={getattr(self, f'{axis}_size')}" for axis in _AXES)
            raise ValueError(
                f"ParallelismConfig needs {sizes} = {self.total_size} processes but the job has {num_processes}; "
                "change the sizes so that their product is the process count"
            )

    def build_device_mesh(self, device_type: str) -> Any:
        """Create the ``DeviceMesh`` of the active axes (None when no axis is larger than 1)."""
        from accelerando.state import PartialState

        self.validate(PartialState().num_processes)
        dims = self.active_mesh_dims
        if not dims:
            return None
        from torch.distributed.device_mesh import init_device_mesh

        shape = tuple(getattr(self, f"{axis}_size") for axis in dims)
        return init_device_mesh(device_type, shape, mesh_dim_names=tuple(dims))
