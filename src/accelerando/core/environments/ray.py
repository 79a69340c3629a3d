"""Processes that Ray Train started: the workers of a ``TorchTrainer``'s ``train_func``.

Ray Train starts one worker per rank, sets up their process group itself (gloo or nccl, before
``train_func`` runs) and exports ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT``
and ``ACCELERATE_TORCH_DEVICE``. An accelerando script run unchanged inside ``train_func`` must use
that group, not start a second one: :func:`accelerando.core.process_group.start` adopts a group that already
exists, and this environment reads rank, world size and local rank from Ray Train's own context (the
source of the variables, and present even where they are not).

Detection never imports Ray: a process that has not imported ``ray.train`` cannot be a Ray Train
worker (its ``train_func`` arrives through Ray, which imports it), so :meth:`RayTrainEnvironment.detect`
looks in :data:`sys.modules` first, and only then asks Ray whether a training context exists.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from typing_extensions import override

from accelerando.core.environments.base import ClusterEnvironment, env_int
from accelerando.core.environments.detection import in_ray_train_worker, ray_train_context

if TYPE_CHECKING:
    from ray.train import TrainContext

__all__ = ["RayTrainEnvironment"]


class RayTrainEnvironment(ClusterEnvironment):
    """Rank, world size and local rank from Ray Train's context; the rendezvous from Ray's variables.

    The process group exists already when the script builds its ``Accelerator``; ``main_address`` and
    ``main_port`` say where Ray placed its rendezvous (informational). ``restart_count`` is 0: Ray Train
    restarts a failed run with new worker processes and a new group, so no key of an earlier try can
    be read by a later one.
    """

    name = "ray_train"

    def __init__(self, environ: Mapping[str, str], context: TrainContext | None = None) -> None:
        super().__init__(environ)
        self._context = context if context is not None else ray_train_context()

    @override
    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return in_ray_train_worker(environ)

    def _read(self, method: str, *names: str, default: int) -> int:
        if self._context is not None:
            return int(getattr(self._context, method)())
        return env_int(self._environ, *names, default=default) or default

    @property
    @override
    def world_size(self) -> int:
        return self._read("get_world_size", "WORLD_SIZE", default=1)

    @property
    @override
    def rank(self) -> int:
        return self._read("get_world_rank", "RANK", default=0)

    @property
    @override
    def local_rank(self) -> int:
        return self._read("get_local_rank", "LOCAL_RANK", default=0)

    @property
    @override
    def local_world_size(self) -> int:
        return self._read("get_local_world_size", "LOCAL_WORLD_SIZE", default=self.world_size)

    @property
    @override
    def node_rank(self) -> int:
        return self._read("get_node_rank", "NODE_RANK", default=0)

    @property
    @override
    def restart_count(self) -> int:
        return 0
