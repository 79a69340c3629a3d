"""What the reference's Megatron-LM functions read of the Accelerator they are given.

The public functions (``initialize``, ``prepare_data_loader``, the train steps ...) take the
Accelerator, as in the reference, and read only its ``state``: the Megatron-LM plugin, the device and
the process count. :class:`MegatronAccelerator` names that; :class:`Holder` is the strategy's own
stand-in built from its Runtime (the strategy never reads the Accelerator).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from accelerando.plugins.megatron import MegatronLMPlugin

__all__ = ["Holder", "HolderState", "MegatronAccelerator", "MegatronState"]


class MegatronState(Protocol):
    """The part of ``accelerator.state`` the Megatron-LM functions read."""

    @property
    def megatron_lm_plugin(self) -> MegatronLMPlugin | None:
        """The Megatron-LM plugin, or None when the Accelerator has none."""
        ...

    @property
    def device(self) -> torch.device:
        """This process's device."""
        ...

    @property
    def num_processes(self) -> int:
        """The number of processes of the job."""
        ...


class MegatronAccelerator(Protocol):
    """An Accelerator as the Megatron-LM functions see it: its ``state``."""

    @property
    def state(self) -> MegatronState:
        """The process state holding the Megatron-LM plugin."""
        ...


@dataclass(frozen=True)
class HolderState:
    """The strategy's :class:`MegatronState`, read from its Runtime."""

    megatron_lm_plugin: MegatronLMPlugin | None
    device: torch.device
    num_processes: int


@dataclass(frozen=True)
class Holder:
    """The strategy's :class:`MegatronAccelerator`: what it hands the reference's functions."""

    state: HolderState
