"""Cluster environments: each knows how to read rank and world size for one kind of job.

``detect_environment`` runs the tests of :data:`~accelerando.core.environments.detection.DETECTION_ORDER`
in order and imports only the environment that matches (a single process when none does). Adding a
kind of job means adding a file, its test in ``detection.py`` and one line to ``DETECTION_ORDER``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from accelerando.core._lazy import lazy_getattr
from accelerando.core.environments.base import ClusterEnvironment
from accelerando.core.environments.detection import DETECTION_ORDER
from accelerando.core.environments.single import SingleProcessEnvironment

if TYPE_CHECKING:
    from accelerando.core.environments.mpi import MPIEnvironment
    from accelerando.core.environments.ray import RayTrainEnvironment
    from accelerando.core.environments.slurm import SLURMEnvironment
    from accelerando.core.environments.torchrun import TorchElasticEnvironment

__all__ = [
    "ClusterEnvironment",
    "MPIEnvironment",
    "RayTrainEnvironment",
    "SLURMEnvironment",
    "SingleProcessEnvironment",
    "TorchElasticEnvironment",
    "detect_environment",
]

# The environments a process does not run in are imported only when named.
__getattr__ = lazy_getattr(
    __name__,
    {module_class: module for _, module, module_class in DETECTION_ORDER},
    globals(),
)


def detect_environment(environ: Mapping[str, str] | None = None) -> ClusterEnvironment:
    """Return the cluster environment this process runs in (single process when nothing matches)."""
    env = os.environ if environ is None else environ
    for started_here, module, class_name in DETECTION_ORDER:
        if started_here(env):
            kind: type[ClusterEnvironment] = getattr(importlib.import_module(module), class_name)
            return kind(env)
    return SingleProcessEnvironment(env)
