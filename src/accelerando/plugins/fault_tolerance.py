"""FaultTolerancePlugin: per-step fault tolerance across replica groups, with torchft.

Beyond the reference (Accelerate has no fault-tolerance plugin). The job runs as several replica
groups, each its own ``accelerando launch`` job of ``--num_processes`` processes, coordinated by a
torchft lighthouse. Gradients are averaged over the groups that are alive at each step; when a group
fails, the others keep stepping, and the group restarts and copies the weights and optimizer state of a
live group before it trains again (no checkpoint is read). Launch with::

    accelerando launch --fault_tolerance --ft_replica_groups 2 --max_restarts 3 train.py

Passing the plugin in code (``Accelerator(kwargs_handlers=[FaultTolerancePlugin(...)])``) turns fault
tolerance on as ``--fault_tolerance`` does; its unset fields come from the launch settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from accelerando.core.settings import fill_unset
from accelerando.plugins.kwargs_handler import KwargsHandler

__all__ = ["FaultTolerancePlugin", "TorchFTPlugin"]


@dataclass
class FaultTolerancePlugin(KwargsHandler):
    """Options of torchft's manager for this replica group (accelerando-specific, not in the reference).

    Args:
        lighthouse: the lighthouse address (``http://host:port``); None = ``--ft_lighthouse`` or the one
            the launch started.
        replica_id: this replica group's number; None = the one the launch gave the group.
        min_replicas: replica groups that must take part in a step for it to be committed (default 1:
            a lone survivor keeps training).
        timeout: seconds an all-reduce across groups, a commit or a weight transfer may wait (default 60).
        use_async_quorum: compute the next quorum during the forward pass (faster steps; a recovering
            group then sits out the step it recovers in) instead of before it.
        init_sync: at step 0, copy the weights of one group to the others; set False only when every
            group builds identical weights (same seed).

    Raises:
        ValueError: ``min_replicas`` below 1, ``timeout`` not positive or ``replica_id`` negative.
    """

    lighthouse: str | None = None
    replica_id: int | None = None
    min_replicas: int | None = None
    timeout: float | None = None
    use_async_quorum: bool = False
    init_sync: bool = True

    def __post_init__(self) -> None:

        fill_unset(self, "fault_tolerance", prefix="ft_")
        if self.min_replicas is not None and (
            not isinstance(self.min_replicas, int) or self.min_replicas < 1
        ):
            raise ValueError(
                f"FaultTolerancePlugin.min_replicas must be an integer >= 1, got {self.min_replicas!r}"
            )
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(
                f"FaultTolerancePlugin.timeout must be a number of seconds > 0, got {self.timeout!r}"
            )
        if self.replica_id is not None and (not isinstance(self.replica_id, int) or self.replica_id < 0):
            raise ValueError(
                f"FaultTolerancePlugin.replica_id must be an integer >= 0, got {self.replica_id!r}"
            )


#: torchft's own name for the same options.
TorchFTPlugin = FaultTolerancePlugin
