"""FP8 backend choice: which of torchao ("ao"), Transformer Engine ("te") and MS-AMP ("msamp") to use.

The choice, in order: the FP8 recipe handler given in code (``AORecipeKwargs`` -> ao,
``TERecipeKwargs`` -> te, ``MSAMPRecipeKwargs`` -> msamp, ``FP8RecipeKwargs(backend=...)``), else the
``fp8_backend`` setting (``--fp8_backend``, ``fp8_config.backend``, ``ACCELERATE_FP8_BACKEND``), else the
first installed backend that runs on this hardware (te, msamp, then ao). The choice and its reason
are logged. A backend that cannot run here is refused with the fix (on CPU: use "ao").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from accelerando.common import imports
from accelerando.common.environment import check_cuda_fp8_capability
from accelerando.logging import get_logger
from accelerando.plugins import fp8_recipes

if TYPE_CHECKING:
    from accelerando.core.settings import Settings

__all__ = ["choose_fp8_backend", "fp8_backend_problem"]

logger = get_logger(__name__)

_RECIPE_BACKENDS = {"AORecipeKwargs": "ao", "TERecipeKwargs": "te", "MSAMPRecipeKwargs": "msamp"}
_NAMES = {"ao": "torchao", "te": "Transformer Engine", "msamp": "MS-AMP"}
_RUNS_HERE = (
    "the backend that runs here is 'ao' (torchao, emulated without an FP8 GPU): pass "
    "kwargs_handlers=[AORecipeKwargs()] or set fp8_backend: ao (--fp8_backend ao)"
)


def fp8_backend_problem(backend: str, device_type: str) -> str | None:
    """Why ``backend`` cannot run on ``device_type`` here (None when it can).

    Args:
        backend: "ao", "te" or "msamp".
        device_type: the torch device type the model trains on.
    """
    if backend == "ao":
        if not imports.is_torchao_available():
            return "fp8_backend='ao' needs torchao: pip install torchao"
        return None
    package = {"te": imports.is_transformer_engine_available, "msamp": imports.is_msamp_available}[backend]
    install = {"te": "transformer-engine[pytorch]", "msamp": "ms-amp (github.com/Azure/MS-AMP)"}[backend]
    missing = []
    if device_type != "cuda":
        missing.append(f"a CUDA GPU (this run uses {device_type!r})")
    elif backend == "te":
        if not check_cuda_fp8_capability():
            missing.append("a GPU with FP8 support (compute capability 8.9 or newer)")
    if not package():
        missing.append(f"the package (pip install {install})")
    if not missing:
        return None
    return f"fp8_backend={backend!r} ({_NAMES[backend]}) needs " + " and ".join(missing) + f"; {_RUNS_HERE}"


def _recipe_handlers(handlers: Mapping[type, object]) -> list[object]:
    names = (*_RECIPE_BACKENDS, "FP8RecipeKwargs")
    return [h for cls, h in handlers.items() if cls.__name__ in names]


# Returns Any for the recipe handler: its class is the chosen backend's, whose precision reads its fields.
def choose_fp8_backend(
    handlers: Mapping[type, object] | None, settings: Settings | None, device_type: str
) -> tuple[str, Any, str]:
    """Pick the FP8 backend, its recipe handler and the reason for the choice.

    Args:
        handlers: kwargs-handler class -> instance given in code (None: none).
        settings: resolved settings (``fp8_backend`` and its source), or None.
        device_type: the torch device type the model trains on.

    Returns:
        ``(backend, recipe, reason)`` with backend in "ao", "te", "msamp"; ``recipe`` is the handler
        given in code or a default one.

    Raises:
        ValueError: several FP8 recipe handlers, or an unknown backend name.
        RuntimeError: the chosen backend cannot run here, or no backend is installed (with the fix).
    """
    given = _recipe_handlers(handlers or {})
    if len(given) > 1:
        names = ", ".join(type(h).__name__ for h in given)
        raise ValueError(f"pass one FP8 recipe handler, got {names}; keep the one of the backend you want")
    setting = settings.fp8_backend if settings is not None else None
    setting_source = (
        settings.source("fp8_backend") if settings is not None and setting is not None else "default"
    )
    backend: str | None = None
    recipe = given[0] if given else None
    if recipe is not None:
        backend = _RECIPE_BACKENDS.get(type(recipe).__name__)
        if backend is None:  # FP8RecipeKwargs: its backend field, else the setting (te/msamp only)
            backend = (getattr(recipe, "backend", None) or "").lower() or (
                setting if setting in ("te", "msamp") else None
            )
            if backend is None:
                backend = "te" if fp8_backend_problem("te", device_type) is None else "msamp"
        reason = f"{type(recipe).__name__} given in code"
        if setting is not None and setting != backend:
            logger.warning(
                f"fp8_backend={setting!r} (from {setting_source}) is overridden by {reason}, which selects {backend!r}"
            )
    elif setting is not None:
        backend, reason = str(setting).lower(), f"fp8_backend from {setting_source}"
    else:
        runnable = [b for b in ("te", "msamp", "ao") if fp8_backend_problem(b, device_type) is None]
        if not runnable:
            raise RuntimeError(
                "mixed_precision='fp8' needs an FP8 backend and none that runs here is installed: "
                "pip install torchao (runs everywhere, emulated without an FP8 GPU), or on FP8 GPUs "
                "transformer-engine; or use mixed_precision='bf16'"
            )
        backend = runnable[0]
        reason = f"automatic choice: {_NAMES[backend]} is installed and runs on {device_type}"
    if backend not in _NAMES:
        raise ValueError(f"unknown fp8_backend {backend!r}; choose 'ao' (torchao), 'te' or 'msamp'")
    problem = fp8_backend_problem(backend, device_type)
    if problem is not None:
        raise RuntimeError(problem)
    if recipe is None:
        recipe = {
            "ao": fp8_recipes.AORecipeKwargs,
            "te": fp8_recipes.TERecipeKwargs,
            "msamp": fp8_recipes.MSAMPRecipeKwargs,
        }[backend]()
    return backend, recipe, reason
