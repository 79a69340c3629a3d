"""The base of the FP8 precisions: no loss scaler, no autocast of its own, the recipe in effect."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import accelerando.core.runtime as rt
from accelerando.backends.precision.base import Precision
from accelerando.backends.precision.fp8.choice import choose_fp8_backend
from accelerando.core.enums import FP8BackendType

if TYPE_CHECKING:
    from accelerando.core.settings import Settings

__all__ = ["FP8Precision"]


class FP8Precision(Precision):
    """Base of the FP8 precisions: no loss scaler (FP8 scales per tensor), no autocast of its own.

    Attributes:
        fp8_backend: ``FP8BackendType`` member of the backend.
        recipe: the recipe handler in effect.
    """

    name = "fp8"
    backend_name = ""

    # Any: the backend's recipe handler (AORecipeKwargs, TERecipeKwargs...); each subclass reads its own.
    def __init__(self, device_type: str, recipe: Any) -> None:

        self.device_type = device_type
        self.recipe = recipe
        self.fp8_backend = FP8BackendType(self.backend_name.upper())
        self._handlers_given = True
        self._settings: Settings | None = None

    # Any: the recipe handler of this backend, as in __init__.
    def resolve_recipe(self) -> Any:
        """The recipe in effect, taking the handlers of the active runtime into account.

        Until the connector passes the kwargs handlers when it builds the precision, they are read
        from the runtime when the first model is prepared.

        Raises:
            RuntimeError / ValueError: the handlers select a backend that cannot run here.
        """
        if self._handlers_given:
            return self.recipe

        runtime = rt.current()
        handlers = runtime.plugins.handlers if runtime is not None else {}
        backend, recipe, _ = choose_fp8_backend(handlers, self._settings, self.device_type)
        if backend != self.backend_name:
            raise RuntimeError(
                f"the FP8 recipe handler selects {backend!r} but this Accelerator was built for "
                f"{self.backend_name!r}; set fp8_backend: {backend} (--fp8_backend {backend})"
            )
        self.recipe, self._handlers_given = recipe, True
        return recipe
