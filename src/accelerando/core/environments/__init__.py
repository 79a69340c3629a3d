"""Cluster environments: each knows how to read rank and world size for one kind of job.

``detect_environment`` tries them in order; the first whose ``detect`` matches wins. Adding a kind of
job means adding a file and one line to ``ENVIRONMENTS``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from accelerando.core.environments.base import ClusterEnvironment
from accelerando.core.environments.mpi import MPIEnvironment
from accelerando.core.environments.ray import RayTrainEnvironment
from accelerando.core.environments.single import SingleProcessEnvironment
from accelerando.core.environments.slurm import SLURMEnvironment
from accelerando.core.environments.torchrun import TorchElasticEnvironment

__all__ = [
    "ENVIRONMENTS",
    "ClusterEnvironment",
    "MPIEnvironment",
    "RayTrainEnvironment",
    "SLURMEnvironment",
    "SingleProcessEnvironment",
    "TorchElasticEnvironment",
    "detect_environment",
]

# Order matters: torchrun inside a SLURM/MPI allocation sets its own variables and must win; a Ray Train
# worker also carries torchrun's variables (Ray exports them) but its context is the authority.
ENVIRONMENTS: tuple[type[ClusterEnvironment], ...] = (
    RayTrainEnvironment,
    TorchElasticEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    SingleProcessEnvironment,
)


def detect_environment(environ: Mapping[str, str] | None = None) -> ClusterEnvironment:
    """Return the cluster environment this process runs in (single process when nothing matches)."""
    env = os.environ if environ is None else environ
    for kind in ENVIRONMENTS:
        if kind.detect(env):
            return kind(env)
    return SingleProcessEnvironment(env)
