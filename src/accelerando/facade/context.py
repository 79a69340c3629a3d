"""The one record every facade service of an Accelerator is built from.

``Accelerator._compose`` builds a :class:`ServiceContext` once; each service (preparer, collectives,
observability, checkpoints, mesh ranks) takes it plus its own extras, instead of a list of
collaborators each. What belongs to this Accelerator (its Runtime: settings, mesh, plugins,
distributed type; its strategy and precision) is read from here; process facts (rank, device,
process group) from ``state``, the process view.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from accelerando.backends.precision.base import Precision
    from accelerando.backends.strategies.base import Strategy
    from accelerando.core.gradient_state import GradientState
    from accelerando.core.runtime import Runtime
    from accelerando.core.settings import Settings
    from accelerando.facade.options import AcceleratorOptions
    from accelerando.facade.registry import PreparedObjects
    from accelerando.state import AcceleratorState

__all__ = ["ServiceContext"]


class ServiceContext:
    """What the facade's services of one Accelerator share (built once, never re-pointed).

    A plain class with slots, not a dataclass: it is built on every ``Accelerator()`` and generates
    no code at import (tests/runtime/test_first_accelerator_modules.py counts dataclasses built).

    Attributes:
        runtime: this Accelerator's Runtime (settings, mesh, plugins, distributed type).
        strategy: the strategy the connector built for it.
        precision: the precision the connector built for it.
        state: the process view (device, ranks, process group; the process-wide decisions).
        gradient_state: the accumulation state (sync steps, accumulation steps).
        options: the options a script may rebind on the Accelerator (dataloader config, project...).
        registry: the prepared and registered objects, and the save/load hooks.
    """

    __slots__ = ("gradient_state", "options", "precision", "registry", "runtime", "state", "strategy")

    def __init__(
        self,
        *,
        runtime: Runtime,
        strategy: Strategy,
        precision: Precision,
        state: AcceleratorState,
        gradient_state: GradientState,
        options: AcceleratorOptions,
        registry: PreparedObjects,
    ) -> None:
        self.runtime = runtime
        self.strategy = strategy
        self.precision = precision
        self.state = state
        self.gradient_state = gradient_state
        self.options = options
        self.registry = registry

    @property
    def settings(self) -> Settings:
        """This Accelerator's resolved settings."""
        return self.runtime.settings

    @property
    def mesh(self) -> DeviceMesh | None:
        """This Accelerator's device mesh, or None."""
        return self.runtime.mesh
