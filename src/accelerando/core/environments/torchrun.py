"""Processes started by torchrun / torch.distributed.elastic (or anything that sets the same variables)."""

from __future__ import annotations

from collections.abc import Mapping

from typing_extensions import override

from accelerando.core.environments.base import ClusterEnvironment, env_int
from accelerando.core.environments.detection import started_by_torchrun

__all__ = ["TorchElasticEnvironment"]


class TorchElasticEnvironment(ClusterEnvironment):
    """Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and MASTER_PORT."""

    name = "torchrun"

    @override
    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return started_by_torchrun(environ)

    @property
    @override
    def world_size(self) -> int:
        return env_int(self._environ, "WORLD_SIZE", default=1) or 1

    @property
    @override
    def rank(self) -> int:
        return env_int(self._environ, "RANK", default=0) or 0

    @property
    @override
    def local_rank(self) -> int:
        return env_int(self._environ, "LOCAL_RANK", default=0) or 0

    @property
    @override
    def local_world_size(self) -> int:
        return env_int(self._environ, "LOCAL_WORLD_SIZE", default=self.world_size) or self.world_size

    @property
    @override
    def node_rank(self) -> int:
        group = env_int(self._environ, "GROUP_RANK", "NODE_RANK")
        return group if group is not None else super().node_rank
