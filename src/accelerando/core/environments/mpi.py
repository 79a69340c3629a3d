"""Processes started by an MPI launcher: Open MPI, MPICH / PMI, Intel MPI, MVAPICH."""

from __future__ import annotations

from collections.abc import Mapping

from typing_extensions import override

from accelerando.core.environments.base import ClusterEnvironment, env_int
from accelerando.core.environments.detection import MPI_RANK_VARIABLES, MPI_SIZE_VARIABLES, started_by_mpirun

__all__ = ["MPIEnvironment"]

# Each MPI flavour names the same facts differently; first match wins.
_SIZE = MPI_SIZE_VARIABLES
_RANK = MPI_RANK_VARIABLES
_LOCAL_RANK = (
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "MV2_COMM_WORLD_LOCAL_RANK",
    "PALS_LOCAL_RANKID",
)
_LOCAL_SIZE = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE")


class MPIEnvironment(ClusterEnvironment):
    """Rank and size from the MPI launcher's variables; the rendezvous address from MASTER_ADDR/PORT.

    MPI does not tell where rank 0 runs, so multi-machine jobs must export MASTER_ADDR (the launcher
    does); on one machine 127.0.0.1 is used.
    """

    name = "mpi"

    @override
    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return started_by_mpirun(environ)

    @property
    @override
    def world_size(self) -> int:
        return env_int(self._environ, *_SIZE, default=1) or 1

    @property
    @override
    def rank(self) -> int:
        return env_int(self._environ, *_RANK, default=0) or 0

    @property
    @override
    def local_world_size(self) -> int:
        return env_int(self._environ, *_LOCAL_SIZE, default=self.world_size) or self.world_size

    @property
    @override
    def local_rank(self) -> int:
        value = env_int(self._environ, *_LOCAL_RANK)
        return value if value is not None else self.rank % max(self.local_world_size, 1)
