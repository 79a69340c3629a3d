"""FaultTolerantStrategy: data parallelism across replica groups that survives the loss of a group (torchft).

Each replica group is its own job (``accelerando launch --fault_tolerance`` starts one per group and
restarts a group that fails). Every step, the groups alive form a quorum through torchft's lighthouse;
gradients are averaged over them by torchft's fault-tolerant process group (gloo here); the step is
committed only when the all-reduce succeeded everywhere. A restarted group joins the next quorum, copies
the weights and optimizer state of a live group over HTTP (no checkpoint is read), and from that step on
holds the same weights as the others, bit for bit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

import accelerando.core.runtime as rt
from accelerando.backends.strategies.base import Strategy
from accelerando.backends.strategies.fault_tolerance.hsdp import (
    LocalShardState,
    group_mesh,
    shard_within_group,
)
from accelerando.backends.strategies.fault_tolerance.manager import ManagerHandle, start_manager
from accelerando.plugins.fault_tolerance import FaultTolerancePlugin

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torchft import Manager

    from accelerando.backends.precision.base import Precision
    from accelerando.core.runtime import Runtime

__all__ = ["FaultTolerantStrategy", "current_step"]


def _plugin(runtime: Runtime) -> FaultTolerancePlugin:
    """The FaultTolerancePlugin among the runtime's handlers, else one filled from the settings."""
    plugins = getattr(runtime, "plugins", None)
    if plugins is None:  # built from the state view: the runtime being built is the active one
        current = rt.current()
        plugins = current.plugins if current is not None else None
    found = plugins.handler(FaultTolerancePlugin) if plugins is not None else None
    return found if found is not None else FaultTolerancePlugin()


class FaultTolerantStrategy(Strategy):
    """Wrap models in torchft's ``DistributedDataParallel`` and optimizers in its commit protocol.

    Chosen by the connector for ``--fault_tolerance`` (setting ``fault_tolerance``) or a
    ``FaultTolerancePlugin`` among the kwargs handlers. Every prepared model and optimizer is registered
    with the manager under ``model_<i>`` / ``optimizer_<i>``: that is what a recovering group receives.
    The distributed type is the replica group's own (``NO`` for a group of one process): collectives of
    the Accelerator (``gather``, ``reduce``, ...) stay inside the group; only gradients cross groups.

    A replica group of several processes runs HSDP: a ``ParallelismConfig(dp_shard_size=N)`` with N the
    group's process count shards each model with FSDP2 inside the group, and torchft averages the
    gradient shards across groups (:mod:`accelerando.backends.strategies.fault_tolerance.hsdp`).

    Raises:
        NotImplementedError: a replica group of several processes without ``dp_shard_size`` equal to its
            process count (torchft's DDP averages across groups only: the group's processes would drift).
        ValueError: no lighthouse address or replica id is known (launch with ``--fault_tolerance``).
    """

    name = "fault_tolerant"
    # No capability interface (strategies/base.py, checkpointing/target.py): torch's autocast and loss
    # scaler around torchft's DDP, full state dicts loaded by checkpointing; not ReplicatesParameters:
    # the weights are the same on every group, but a plain all-reduce would cross only this group.

    def __init__(self, runtime: Runtime, precision: Precision, **options: object) -> None:
        super().__init__(runtime, precision, **options)
        self.distributed_type = runtime.distributed_type
        group_size = int(runtime.num_processes)
        config = getattr(runtime, "parallelism_config", None) or getattr(
            getattr(runtime, "plugins", None), "parallelism_config", None
        )
        shards = config.dp_shard_size if config is not None else 1
        if group_size != 1 and shards != group_size:
            raise NotImplementedError(
                f"this replica group has {group_size} processes and ParallelismConfig(dp_shard_size={shards}): "
                "under fault tolerance the processes of a group must shard the model (HSDP, dp_shard_size = "
                f"{group_size}: --use_fsdp --fsdp_version 2 --parallelism_config_dp_shard_size {group_size}); "
                "or launch with --num_processes 1 and more --ft_replica_groups"
            )
        self.plugin = _plugin(runtime)
        settings = getattr(runtime, "settings", None)
        self._handle: ManagerHandle = start_manager(
            self.plugin,
            int(runtime.process_index),
            group_size,
            bind_address=getattr(settings, "bind_address", None),
            insecure=bool(getattr(settings, "ft_insecure", False)),
        )
        self._registered = 0
        #: The group's ("dp_shard",) mesh when the group shards its models (HSDP), else None.
        self.shard_mesh: DeviceMesh | None = None
        if group_size > 1:
            self.shard_mesh = group_mesh(runtime.device.type, group_size)

    @property
    def manager(self) -> Manager:
        """This replica group's torchft ``Manager`` (step count, participants, errors)."""
        return self._handle.manager

    def _register(self, kind: str, target: torch.nn.Module | torch.optim.Optimizer) -> None:
        """Register ``target``'s state with the manager: what a recovering group copies from a live one."""
        key = f"{kind}_{self._registered}"
        self._registered += 1
        if self.shard_mesh is not None:
            shards = LocalShardState(target)
            self.manager.register_state_dict_fn(key, shards.load_state_dict, shards.state_dict)
            return

        def load(state: dict[str, object]) -> None:  # a module's load_state_dict returns the key report
            target.load_state_dict(state)

        self.manager.register_state_dict_fn(key, load, target.state_dict)

    def prepare_model(
        self, model: torch.nn.Module, device_placement: bool = True, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        """Move ``model`` to the device, register its weights for recovery, wrap it in torchft's DDP.

        In a sharding group (HSDP) the model is sharded with FSDP2 instead, then registered. A model with
        nothing to train (or prepared for evaluation) is only moved and registered.
        """
        model = super().prepare_model(model, device_placement, evaluation_mode)
        trains = not evaluation_mode and any(p.requires_grad for p in model.parameters())
        if self.shard_mesh is not None and trains:
            model = shard_within_group(model, self.manager, self.shard_mesh)
        self._register("model", model)
        if not trains or self.shard_mesh is not None:
            return model
        from torchft import DistributedDataParallel

        return DistributedDataParallel(self.manager, model)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Register the optimizer's state for recovery and wrap it in the quorum/commit protocol."""
        from accelerando.backends.strategies.fault_tolerance.optimizer import FaultTolerantOptimizer

        self._register("optimizer", optimizer)
        return FaultTolerantOptimizer(self.manager, optimizer)

    def current_step(self) -> int:
        """Steps committed so far by the replica groups (a recovered group takes the live groups' count)."""
        return int(self.manager.current_step())

    def shutdown(self) -> None:
        """Stop this group's manager (also done at interpreter exit)."""
        self._handle.shutdown()


class _Built(Protocol):
    """What :func:`current_step` reads of an Accelerator: the strategy the connector built for it."""

    @property
    def _strategy(self) -> object: ...


def current_step(accelerator: _Built) -> int:
    """The number of steps committed by a fault-tolerant run: where a training loop stands.

    A restarted replica group starts at the step the live groups reached, so a loop written as
    ``while current_step(accelerator) < total_steps`` resumes where the job is, without a checkpoint.

    Args:
        accelerator: an ``Accelerator`` built with fault tolerance.

    Returns:
        The committed step count (0 before the first committed step).

    Raises:
        ValueError: the Accelerator does not run with fault tolerance (the message says how to turn it on).
    """
    strategy = accelerator._strategy
    if not isinstance(strategy, FaultTolerantStrategy):
        raise ValueError(
            f"current_step() needs an Accelerator running with fault tolerance, and this one uses the "
            f"{getattr(strategy, 'name', type(strategy).__name__)!r} strategy: launch with --fault_tolerance "
            "or pass kwargs_handlers=[FaultTolerancePlugin()]"
        )
    return strategy.current_step()
