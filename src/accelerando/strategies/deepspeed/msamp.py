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
from collections.abc import Callable
from typing import Any

from accelerando.plugins.deepspeed import import_deepspeed

__all__ = ["apply_msamp_block", "engine_initializer", "msamp_opt_level"]

logger = logging.getLogger(__name__)


def msamp_opt_level(precision: Any) -> str | None:
    """The MS-AMP level the run's FP8 recipe asks for; None when the precision is not MS-AMP.

    Args:
        precision: the runtime's precision object.

    Raises:
        RuntimeError: the kwargs handlers select another FP8 backend than the one built.
    """
    if getattr(precision, "backend_name", None) != "msamp":
        return None
    return str(precision.resolve_recipe().opt_level)


def apply_msamp_block(config: dict[str, Any], opt_level: str | None) -> None:
    """Add ``{"msamp": {"enabled": True, "opt_level": opt_level}}`` to ``config`` (in place).

    A block the config has already wins; a missing ``opt_level`` in it is filled, a different one
    is logged.

    Args:
        config: the DeepSpeed config being resolved.
        opt_level: from :func:`msamp_opt_level`; None leaves the config as it is.

    Raises:
        ValueError: the config disables MS-AMP (``"msamp": {"enabled": false}``) while the run asks
            for the MS-AMP FP8 backend.
    """
    if opt_level is None:
        return
    block = config.get("msamp")
    if not isinstance(block, dict) or not block:
        from accelerando.precision.fp8_gpu import msamp_deepspeed_config

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


def engine_initializer(config: dict[str, Any]) -> Callable[..., Any]:
    """``deepspeed.initialize``, or MS-AMP's wrapper of it when ``config`` enables MS-AMP.

    Raises:
        ImportError: DeepSpeed is not installed, or the config enables MS-AMP and ``msamp`` is not.
    """
    deepspeed = import_deepspeed()
    block = config.get("msamp")
    if not (isinstance(block, dict) and block.get("enabled")):
        return deepspeed.initialize
    from accelerando.utils.imports import is_msamp_available

    if not is_msamp_available():
        raise ImportError(
            'the DeepSpeed config enables MS-AMP ("msamp": {"enabled": true}), which needs the msamp package '
            "(github.com/Azure/MS-AMP, CUDA only); remove the block, or use fp8_backend='ao' on this machine"
        )
    from msamp import deepspeed as msamp_deepspeed

    return msamp_deepspeed.initialize
