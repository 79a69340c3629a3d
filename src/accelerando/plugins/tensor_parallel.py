"""TorchTensorParallelPlugin: tensor parallelism through DTensor on the ``tp`` axis of the device mesh."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from accelerando.plugins.kwargs_handler import KwargsHandler

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["TorchTensorParallelPlugin"]

_MESH_AXES = ("dp_replicate", "dp_shard", "cp", "tp")


@dataclass
class TorchTensorParallelPlugin(KwargsHandler):
    """Tensor-parallel degree, and optionally the plan, for ``Accelerator(torch_tp_plugin=...)``.

    ``ParallelismConfig(tp_size=...)`` is the main way to ask for tensor parallelism; this plugin
    is kept for scripts that pass it. Given alone, it becomes ``ParallelismConfig(tp_size=tp_size,
    dp_shard_size=<remaining processes>)``; given with a ParallelismConfig, both must agree.

    Args:
        tp_size: tensor-parallel degree (ranks each weight of a split layer is divided over).
        torch_device_mesh: a ready ``DeviceMesh`` with a ``"tp"`` dimension to use instead of
            building one.
        tp_plan: module-name pattern -> style (``"colwise"``, ``"rowwise"``, ... see
            ``accelerando.backends.strategies.composable.plan``, or torch ``ParallelStyle`` objects); None =
            the plan the model declares (transformers ``tp_plan``).

    Raises:
        ValueError: ``tp_size`` below 1, a mesh without a ``"tp"`` dimension or of another tp size,
            or a ``tp_plan`` that is not a mapping.
    """

    tp_size: int = 1
    torch_device_mesh: DeviceMesh | None = None
    tp_plan: Mapping[str, object] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.tp_size, bool) or not isinstance(self.tp_size, int) or self.tp_size < 1:
            raise ValueError(f"tp_size must be an integer >= 1, got {self.tp_size!r}")
        if self.tp_plan is not None and not isinstance(self.tp_plan, Mapping):
            raise ValueError(
                f"tp_plan must map module-name patterns to styles, got {type(self.tp_plan).__name__}"
            )
        mesh = self.torch_device_mesh
        if mesh is not None:
            names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
            if "tp" not in names:
                raise ValueError(
                    f"torch_device_mesh has dimensions {names}, none named 'tp'; build it with "
                    "init_device_mesh(..., mesh_dim_names=(..., 'tp'))"
                )
            size = int(mesh["tp"].size())
            if self.tp_size == 1:
                self.tp_size = size
            elif size != self.tp_size:
                raise ValueError(
                    f"tp_size={self.tp_size} but torch_device_mesh's 'tp' dimension has {size} ranks; make them equal"
                )

    def parallelism_sizes(self, num_processes: int) -> dict[str, int]:
        """The ParallelismConfig sizes this plugin stands for in a job of ``num_processes``.

        The mesh's own dimension sizes when a mesh was given; else ``tp_size`` and the remaining
        processes on ``dp_shard`` (tensor parallelism cannot sit on plain replication).

        Raises:
            ValueError: ``tp_size`` does not divide the process count, or the mesh has a dimension
                a ParallelismConfig does not know.
        """
        mesh = self.torch_device_mesh
        if mesh is not None:
            names = tuple(mesh.mesh_dim_names or ())  # a mesh without names was refused when built
            unknown = [name for name in names if name not in _MESH_AXES]
            if unknown:
                raise ValueError(
                    f"torch_device_mesh has dimensions {list(unknown)} that a ParallelismConfig does not know; name "
                    f"its dimensions among {list(_MESH_AXES)}"
                )
            return {f"{name}_size": int(mesh[name].size()) for name in names}
        if num_processes % self.tp_size:
            raise ValueError(
                f"TorchTensorParallelPlugin(tp_size={self.tp_size}) does not divide the job's {num_processes} "
                f"processes; use a tp_size that divides {num_processes}"
            )
        return {"tp_size": self.tp_size, "dp_shard_size": num_processes // self.tp_size}
