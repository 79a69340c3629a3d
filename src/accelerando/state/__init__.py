"""Process state: who am I, how many of us are there, which device do I use.

``PartialState`` and ``AcceleratorState`` keep the reference's names and attributes but hold no
decisions of their own: they are read-only views over the process's Runtime
(:mod:`accelerando.core.runtime`), which the connector builds. Every instance shares one dictionary (the
Borg pattern), so ``PartialState()`` anywhere is the same object. ``GradientState`` tracks
accumulation and dataloader progress.
"""

from __future__ import annotations

from accelerando.core.enums import DistributedType
from accelerando.core.gradient_state import GradientState
from accelerando.state.accelerator_state import (
    AcceleratorState,
    get_active_deepspeed_plugin,
    select_deepspeed_plugin,
)
from accelerando.state.partial import PartialState, _split  # noqa: F401 - _split: tests import it from here
from accelerando.state.shared import ThreadLocalSharedDict, do_nothing, is_initialized

__all__ = [
    "AcceleratorState",
    "DistributedType",
    "GradientState",
    "PartialState",
    "ThreadLocalSharedDict",
    "do_nothing",
    "get_active_deepspeed_plugin",
    "is_initialized",
    "select_deepspeed_plugin",
]
