"""The cluster-environment contract: where rank, world size and the rendezvous address come from."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

__all__ = ["ClusterEnvironment", "env_int"]


def env_int(environ: Mapping[str, str], *names: str, default: int | None = None) -> int | None:
    """Return the first of ``names`` set in ``environ`` as an int, else ``default``.

    Raises:
        ValueError: the variable is set but is not an integer (names the variable).
    """
    for name in names:
        raw = environ.get(name)
        if raw is not None and raw != "":
            try:
                return int(raw)
            except ValueError as exc:
                raise ValueError(f"environment variable {name}={raw!r} must be an integer") from exc
    return default


class ClusterEnvironment(ABC):
    """Describes this process's place in a job, read once from the environment.

    Contract: ``detect(environ)`` is a cheap classmethod that says whether the variables of this kind
    of job are present; the constructor then reads them. Instances are immutable snapshots.
    ``main_address``/``main_port`` are what ``torch.distributed`` must rendezvous on.
    """

    name: str = "base"

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = dict(environ)

    @classmethod
    @abstractmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """Return True when ``environ`` looks like this kind of job."""

    @property
    @abstractmethod
    def world_size(self) -> int:
        """Total number of processes."""

    @property
    @abstractmethod
    def rank(self) -> int:
        """Global index of this process."""

    @property
    @abstractmethod
    def local_rank(self) -> int:
        """Index of this process on its machine."""

    @property
    def local_world_size(self) -> int:
        """Processes on this machine (defaults to the world size)."""
        return self.world_size

    @property
    def node_rank(self) -> int:
        """Index of this machine."""
        return self.rank // max(self.local_world_size, 1)

    @property
    def main_address(self) -> str:
        """Host of the rank-0 process."""
        return self._environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        """Rendezvous port."""
        return env_int(self._environ, "MASTER_PORT", default=29500) or 29500

    @property
    def restart_count(self) -> int:
        """How many times the launcher's elastic agent restarted this job's processes (0 on the first try).

        Read from ``TORCHELASTIC_RESTART_COUNT`` (set by torchrun and ``accelerando launch``); 0 when unset.
        The agent keeps its rendezvous store across restarts, so whatever a try writes there is kept
        apart from the previous tries' keys by this number (see :func:`accelerando.core.process_group.start`).

        Raises:
            ValueError: the variable is set but is not an integer.
        """
        return env_int(self._environ, "TORCHELASTIC_RESTART_COUNT", default=0) or 0

    def rendezvous_env(self) -> dict[str, str]:
        """Variables torch.distributed's env:// rendezvous needs, for environments that lack them."""
        return {
            "MASTER_ADDR": self.main_address,
            "MASTER_PORT": str(self.main_port),
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
        }

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(rank={self.rank}, world_size={self.world_size}, "
            f"local_rank={self.local_rank}, node_rank={self.node_rank})"
        )
