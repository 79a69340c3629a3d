"""Which kind of job started this process, read from its markers without importing every environment.

Each cluster environment is recognised by a few variables (or, for Ray Train, a loaded module); the
tests below are what the environments' ``detect`` class methods call, and what
:func:`accelerando.core.environments.detect_environment` runs in :data:`DETECTION_ORDER` so that only
the environment that matches is imported (the first Accelerator of a process loads one, not five).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ray.train import TrainContext

__all__ = [
    "DETECTION_ORDER",
    "MPI_RANK_VARIABLES",
    "MPI_SIZE_VARIABLES",
    "in_ray_train_worker",
    "ray_train_context",
    "started_by_mpirun",
    "started_by_srun",
    "started_by_torchrun",
]

#: The world size and rank variables of Open MPI, MPICH / Intel MPI (PMI), MVAPICH2 and PMIx launchers.
MPI_SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "PMIX_SIZE")
MPI_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK", "PMIX_RANK")


def ray_train_context() -> TrainContext | None:
    """Ray Train's context of this worker (``ray.train.get_context()``), or None outside a Ray Train worker.

    Never imports Ray: a process that has not imported ``ray.train`` cannot be a Ray Train worker (its
    ``train_func`` arrives through Ray, which imports it).

    Returns:
        The ``TrainContext`` (rank, world size, local rank, storage) when this process runs a
        ``train_func`` of a Ray trainer; None when Ray Train was never imported here, or this process is
        a driver, a plain Ray task or any other process.
    """
    if "ray.train" not in sys.modules:
        return None
    train = sys.modules["ray.train"]
    try:
        return train.get_context()
    except (RuntimeError, AttributeError, ValueError):  # Ray raises RuntimeError outside a train_func
        return None


def in_ray_train_worker(environ: Mapping[str, str]) -> bool:
    """Whether this process runs a Ray Train ``train_func`` (its context, not its variables, decides)."""
    return ray_train_context() is not None


def started_by_torchrun(environ: Mapping[str, str]) -> bool:
    """Whether torchrun (or a launcher that sets its variables) started this process."""
    return all(environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def started_by_mpirun(environ: Mapping[str, str]) -> bool:
    """Whether an MPI launcher started this process (a world size and a rank of one of the MPI families)."""
    return any(environ.get(k) for k in MPI_SIZE_VARIABLES) and any(environ.get(k) for k in MPI_RANK_VARIABLES)


def started_by_srun(environ: Mapping[str, str]) -> bool:
    """Whether ``srun`` started this process as one task of a job step."""
    # An interactive allocation (salloc / a batch script's shell) sets SLURM_NTASKS too, but only
    # srun-started tasks carry SLURM_PROCID together with a step id.
    return bool(environ.get("SLURM_PROCID") and environ.get("SLURM_NTASKS") and environ.get("SLURM_STEP_ID"))


#: (test, module, class) in order of precedence; a process that matches none is a single process.
#: torchrun inside a SLURM/MPI allocation sets its own variables and must win; a Ray Train worker also
#: carries torchrun's variables (Ray exports them) but its context is the authority.
DETECTION_ORDER: tuple[tuple[Callable[[Mapping[str, str]], bool], str, str], ...] = (
    (in_ray_train_worker, "accelerando.core.environments.ray", "RayTrainEnvironment"),
    (started_by_torchrun, "accelerando.core.environments.torchrun", "TorchElasticEnvironment"),
    (started_by_mpirun, "accelerando.core.environments.mpi", "MPIEnvironment"),
    (started_by_srun, "accelerando.core.environments.slurm", "SLURMEnvironment"),
)
