"""This process's place on the device mesh: its rank along each parallelism axis."""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelerando.facade.context import ServiceContext

if TYPE_CHECKING:
    from accelerando.parallelism_config import ParallelismConfig

__all__ = ["MeshRanks"]


class MeshRanks:
    """Ranks of this process along the mesh axes (0 along an axis the job does not have).

    Args:
        context: the Accelerator's shared services record: its Runtime's mesh and
            ``ParallelismConfig``, and the process view (process index, local main process).
    """

    def __init__(self, context: ServiceContext) -> None:
        self.context = context
        self.state = context.state
        self.parallelism_config: ParallelismConfig | None = context.runtime.plugins.parallelism_config

    def rank(self, dim: str) -> int:
        """This process's rank along a mesh dimension (raw or flattened); 0 when the mesh lacks it."""
        mesh = self.context.mesh
        if mesh is None:
            return 0
        try:
            return int(mesh[dim].get_local_rank())
        except (KeyError, RuntimeError, ValueError):
            return 0

    @property
    def tensor_parallel_rank(self) -> int:
        """Rank on the tensor-parallel mesh axis (0 without one)."""
        return self.rank("tp")

    @property
    def pipeline_parallel_rank(self) -> int:
        """Rank on the pipeline-parallel mesh axis (0 without one)."""
        return self.rank("pp")

    @property
    def context_parallel_rank(self) -> int:
        """Rank on the context-parallel mesh axis (0 without one)."""
        return self.rank("cp")

    @property
    def data_parallel_rank(self) -> int:
        """Rank among the processes that read different batches (the process index without a mesh).

        With a mesh it is the rank on the flattened ``dp`` dimension (replicas x shards).
        """
        if self.context.mesh is None:
            return self.state.process_index
        return self.rank("dp")

    @property
    def data_parallel_shard_rank(self) -> int:
        """Rank on the FSDP ``dp_shard`` mesh axis (0 without a sharding axis)."""
        config = self.parallelism_config
        if config is None or not config.dp_shard_enabled:
            return 0
        return self.rank("dp_shard")

    @property
    def should_save_model(self) -> bool:
        """Whether this process writes model files when every process saves its part.

        Replicas (a ``dp_replicate`` rank other than 0) and context-parallel copies (a ``cp`` rank
        other than 0) hold what another process already writes, so they do not. Without a
        parallelism config, each machine's first process saves.
        """
        config = self.parallelism_config
        if config is None:
            return self.state.is_local_main_process
        duplicate_dims = [
            dim
            for dim, on in (("dp_replicate", config.dp_replicate_enabled), ("cp", config.cp_enabled))
            if on
        ]
        return all(self.rank(dim) == 0 for dim in duplicate_dims)
