"""Read-only views the reference's Accelerator has as attributes: its FP8 recipe handlers, whether a
LOMO optimizer is prepared, and the loggers ``log_with`` asked for.

The reference sets these in its constructor and its ``prepare``; here each is a property computed
from what the Accelerator already holds (the precision in effect, the kwargs handlers, the prepared
optimizers, the tracking manager), so none can go stale. ``accelerator.py`` declares them with the
factories below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from accelerando.core.enums import FP8BackendType
from accelerando.core.enums_on_demand import LoggerType

if TYPE_CHECKING:
    from accelerando.facade.observing import Observability
    from accelerando.facade.registry import PreparedObjects


class _Holder(Protocol):
    """What these views read of the Accelerator (declared here: the facade does not import it)."""

    _precision: object
    _registry: PreparedObjects
    _observability: Observability

    @property
    def fp8_backend(self) -> FP8BackendType: ...

    @property
    def fp8_recipe_handler(self) -> object: ...

    @property
    def te_recipe_handler(self) -> object: ...

    @property
    def msamp_recipe_handler(self) -> object: ...

    @property
    def ao_recipe_handler(self) -> object: ...


__all__ = ["fp8_recipe_handler", "has_fp8_handler", "has_lomo_optimizer", "requested_loggers"]


def fp8_recipe_handler(backend: str, doc: str) -> property:
    """A property: the recipe handler in effect when the FP8 backend is ``backend`` ("AO", "TE",
    "MSAMP"), the one given in code or the backend's default (as the reference fills it), else None.
    """

    def read(self: _Holder) -> object:
        if self.fp8_backend != FP8BackendType(backend):
            return None
        return getattr(self._precision, "recipe", None)

    return property(read, doc=doc)


def has_fp8_handler(accelerator: _Holder) -> bool:
    """Whether an FP8 recipe handler is in effect (given in code, or the FP8 backend's default)."""
    handlers = (
        accelerator.fp8_recipe_handler,
        accelerator.te_recipe_handler,
        accelerator.msamp_recipe_handler,
        accelerator.ao_recipe_handler,
    )
    return any(handler is not None for handler in handlers)


def has_lomo_optimizer(accelerator: _Holder) -> bool:
    """Whether a prepared optimizer is a LOMO / AdaLomo one (it updates during ``backward``)."""
    return any(hasattr(opt.optimizer, "fused_backward") for opt in accelerator._registry.optimizers)


def requested_loggers(accelerator: _Holder) -> list[object]:
    """The trackers ``log_with`` asked for, as the reference lists them: a ``LoggerType`` for each
    built-in tracker, the user's own trackers as given; empty without ``log_with``.
    """
    tracking = accelerator._observability.tracking
    if tracking is None:
        return []
    known = {member.value for member in LoggerType}
    found: list[object] = []
    for entry in tracking._requested:
        name = getattr(entry, "name", None)
        builtin = isinstance(entry, type) and isinstance(name, str) and name in known
        found.append(LoggerType(name) if builtin else entry)
    return found
