"""FP8 training: choose the backend (torchao "ao", Transformer Engine "te", MS-AMP "msamp") and build it.

The choice, in order: the FP8 recipe handler given in code (``AORecipeKwargs`` -> ao,
``TERecipeKwargs`` -> te, ``MSAMPRecipeKwargs`` -> msamp, ``FP8RecipeKwargs(backend=...)``), else the
``fp8_backend`` setting (``--fp8_backend``, ``fp8_config.backend``, ``ACCELERATE_FP8_BACKEND``), else the
first installed backend that runs on this hardware (te, msamp, then ao). The choice and its reason
are logged. A backend that cannot run here is refused with the fix (on CPU: use "ao").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from accelerando.backends.precision.base import Precision
from accelerando.backends.precision.fp8.ao import AOPrecision
from accelerando.backends.precision.fp8.base import FP8Precision
from accelerando.backends.precision.fp8.choice import _NAMES, choose_fp8_backend, fp8_backend_problem
from accelerando.backends.precision.fp8.gpu import MSAMPPrecision, TEPrecision
from accelerando.core.settings import process_settings
from accelerando.logging import get_logger

if TYPE_CHECKING:
    from accelerando.core.settings import Settings

__all__ = ["FP8Precision", "build_fp8_precision", "choose_fp8_backend", "fp8_backend_problem"]

logger = get_logger(__name__)


def build_fp8_precision(
    device_type: str, handlers: Mapping[type, object] | None = None, settings: Settings | None = None
) -> Precision:
    """Build the FP8 precision of the chosen backend (see :func:`choose_fp8_backend`).

    Args:
        device_type: the torch device type the model trains on.
        handlers: kwargs handlers given in code; None reads them from the active runtime when the
            model is prepared.
        settings: resolved settings; None reads the process's (environment and launcher).

    Raises:
        ValueError / RuntimeError: as :func:`choose_fp8_backend`.
    """
    if settings is None:
        settings = process_settings()
    backend, recipe, reason = choose_fp8_backend(handlers, settings, device_type)
    logger.info(f"FP8 training with {_NAMES[backend]} ({reason})", main_process_only=True)
    if backend == "ao":
        precision: FP8Precision = AOPrecision(device_type, recipe)
    else:
        precision = (TEPrecision if backend == "te" else MSAMPPrecision)(device_type, recipe)
    precision._handlers_given = handlers is not None
    precision._settings = settings
    return precision
