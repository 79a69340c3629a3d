"""Processes started by SLURM's ``srun`` (one task per process)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from typing_extensions import override

from accelerando.core.environments.base import ClusterEnvironment, env_int
from accelerando.core.environments.detection import started_by_srun

__all__ = ["SLURMEnvironment", "first_host"]


def first_host(nodelist: str) -> str:
    """Return the first host of a SLURM node list such as ``"gpu[003-005,9],cpu1"`` -> ``"gpu003"``.

    Raises:
        ValueError: the list is empty or malformed.
    """
    nodelist = nodelist.strip()
    match = re.match(r"^([^,\[]+)(\[([^\]]+)\])?", nodelist)
    if not match or not match.group(1):
        raise ValueError(f"cannot read a host from SLURM node list {nodelist!r}")
    prefix, ranges = match.group(1), match.group(3)
    if ranges is None:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


class SLURMEnvironment(ClusterEnvironment):
    """SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID / SLURM_NODEID; rank 0's host from the node list."""

    name = "slurm"

    @override
    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return started_by_srun(environ)

    @property
    @override
    def world_size(self) -> int:
        return env_int(self._environ, "SLURM_NTASKS", default=1) or 1

    @property
    @override
    def rank(self) -> int:
        return env_int(self._environ, "SLURM_PROCID", default=0) or 0

    @property
    @override
    def local_rank(self) -> int:
        return env_int(self._environ, "SLURM_LOCALID", default=0) or 0

    @property
    @override
    def local_world_size(self) -> int:
        raw = self._environ.get("SLURM_TASKS_PER_NODE", "")
        match = re.match(r"^(\d+)", raw)
        return int(match.group(1)) if match else self.world_size

    @property
    @override
    def node_rank(self) -> int:
        value = env_int(self._environ, "SLURM_NODEID")
        return value if value is not None else super().node_rank

    @property
    @override
    def main_address(self) -> str:
        if self._environ.get("MASTER_ADDR"):
            return self._environ["MASTER_ADDR"]
        nodelist = self._environ.get("SLURM_JOB_NODELIST") or self._environ.get("SLURM_NODELIST")
        return first_host(nodelist) if nodelist else "127.0.0.1"

    @property
    @override
    def main_port(self) -> int:
        explicit = env_int(self._environ, "MASTER_PORT")
        if explicit is not None:
            return explicit
        # Derive a port from the job id so that every task of the job agrees without talking.
        job_id = env_int(self._environ, "SLURM_JOB_ID", default=0) or 0
        return 15000 + job_id % 20000
