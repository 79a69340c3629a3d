"""MS-AMP under DeepSpeed: the ``"msamp"`` config block and the engine builder that reads it.

With ``mixed_precision="fp8"`` and the MS-AMP backend, the model and optimizer are not converted by the
precision (as without DeepSpeed) but by MS-AMP's wrapper of ``deepspeed.initialize``
(``msamp.deepspeed.initialize``), which reads ``{"msamp": {"enabled": true, "opt_level": ...}}`` from
the config. The level comes from the FP8 recipe (``MSAMPRecipeKwargs`` / ``FP8RecipeKwargs``, or the
``fp8_opt_level`` setting: ``--fp8_opt_level``, ``fp8_config.opt_level``, ``ACCELERATE_FP8_OPT_LEVEL``);
a block already in the DeepSpeed config (the user's file, or ``DeepSpeedPlugin(enable_msamp=True)``)
is kept as written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from accelerando.backends.precision.fp8.base import FP8Precision
from accelerando.backends.precision.fp8.gpu import msamp_deepspeed_config
from accelerando.backends.strategies.deepspeed.config import fill_auto, get_value
from accelerando.common import imports
from accelerando.plugins.deepspeed import import_deepspeed

if TYPE_CHECKING:
    from deepspeed.runtime.engine import DeepSpeedEngine

__all__ = [
    "apply_msamp_block",
    "converts_in_engine",
    "engine_initializer",
    "msamp_enabled",
    "msamp_opt_level",
]

logger = logging.getLogger(__name__)


def msamp_opt_level(precision: object) -> str | None:
    """The MS-AMP level the run's FP8 recipe asks for; None when the precision is not MS-AMP.

    Args:
        precision: the runtime's precision object.

    Raises:
        RuntimeError: the kwargs handlers select another FP8 backend than the one built.
    """
    if not isinstance(precision, FP8Precision) or precision.backend_name != "msamp":
        return None
    return str(precision.resolve_recipe().opt_level)


def msamp_enabled(config: Mapping[str, object]) -> bool:
    """Whether the DeepSpeed ``config`` turns MS-AMP on (``"msamp": {"enabled": true}``)."""
    block = config.get("msamp")
    return isinstance(block, dict) and bool(block.get("enabled"))


def converts_in_engine(precision: object, config: Mapping[str, object]) -> bool:
    """Whether MS-AMP (inside the engine) converts the model, so the precision must not.

    True when the run's FP8 backend is MS-AMP, or when the DeepSpeed config enables MS-AMP itself
    (``DeepSpeedPlugin(enable_msamp=True)`` or the user's file); in that second case an FP8 precision
    of another backend is not applied (logged), since the model would be converted twice.

    Args:
        precision: the runtime's precision object.
        config: the plugin's DeepSpeed config (before resolution).
    """
    if msamp_opt_level(precision) is not None:
        return True
    if not msamp_enabled(config):
        return False
    other = getattr(precision, "backend_name", "")
    if other:
        logger.warning(
            "the DeepSpeed config enables MS-AMP, which converts the model in the engine; the FP8 backend "
            "%r is not applied (pass MSAMPRecipeKwargs or set fp8_backend: msamp to silence this)",
            other,
        )
    return True


def apply_msamp_block(config: dict[str, object], opt_level: str | None, mixed_precision: str = "fp8") -> None:
    """Add ``{"msamp": {"enabled": True, "opt_level": opt_level}}`` to ``config`` (in place).

    A block the config has already wins; a missing ``opt_level`` in it is filled, a different one
    is logged. With MS-AMP on and ``mixed_precision="fp8"``, a ``bf16.enabled`` left "auto" becomes
    True: what MS-AMP does not hold in FP8 runs in bf16, as in MS-AMP's own DeepSpeed setup.

    Args:
        config: the DeepSpeed config being resolved.
        opt_level: from :func:`msamp_opt_level`; None adds no block (one already there stays).
        mixed_precision: the Accelerator's mixed precision.

    Raises:
        ValueError: the config disables MS-AMP (``"msamp": {"enabled": false}``) while the run asks
            for the MS-AMP FP8 backend.
    """
    if opt_level is not None:
        _merge_block(config, opt_level)
    if msamp_enabled(config) and mixed_precision == "fp8" and get_value(config, "fp16.enabled") is not True:
        fill_auto(config, {"bf16.enabled": True})


def _merge_block(config: dict[str, object], opt_level: str) -> None:
    block = config.get("msamp")
    if not isinstance(block, dict) or not block:
        config.update(msamp_deepspeed_config({}, opt_level))
        return
    if block.get("enabled") is False:
        raise ValueError(
            'the DeepSpeed config has "msamp": {"enabled": false} but mixed_precision="fp8" uses the MS-AMP '
            "backend; remove the block (or set \"enabled\": true), or choose fp8_backend 'te' or 'ao'"
        )
    block.setdefault("enabled", True)
    written = block.setdefault("opt_level", opt_level)
    if written != opt_level:
        logger.warning(
            "the DeepSpeed config's msamp.opt_level=%s is used; the FP8 recipe's opt_level=%s is ignored",
            written,
            opt_level,
        )


def engine_initializer(
    config: Mapping[str, object],
) -> Callable[..., tuple[DeepSpeedEngine, object, object, object]]:
    """``deepspeed.initialize``, or MS-AMP's wrapper of it when ``config`` enables MS-AMP.

    Raises:
        ImportError: DeepSpeed is not installed, or the config enables MS-AMP and ``msamp`` is not.
    """
    deepspeed = import_deepspeed()
    if not msamp_enabled(config):
        return deepspeed.initialize

    if not imports.is_msamp_available():
        raise ImportError(
            'the DeepSpeed config enables MS-AMP ("msamp": {"enabled": true}), which needs the msamp package '
            "(github.com/Azure/MS-AMP, CUDA only); remove the block, or use fp8_backend='ao' on this machine"
        )
    from msamp import deepspeed as msamp_deepspeed

    return msamp_deepspeed.initialize
