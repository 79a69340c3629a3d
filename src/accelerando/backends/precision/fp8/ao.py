"""FP8 training with torchao: eligible Linear layers become ``Float8Linear`` when the model is prepared.

On a GPU that computes in FP8 the float8 matmuls run natively; elsewhere (CPU, older GPUs) torchao's
emulation mode is used and logged: values are rounded to float8 exactly as in FP8 training, the
matmuls run in high precision, so the numbers match FP8 training without its speed.

Under FSDP2, ``enable_fsdp_float8_all_gather`` all-gathers the weights in float8 and the scales are
precomputed for all layers at once before each forward (torchao's
``precompute_float8_dynamic_scale_for_fsdp``); without FSDP2 the flag has no use and is switched off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

import accelerando.core.runtime as rt
from accelerando.backends.precision.fp8.base import FP8Precision
from accelerando.backends.precision.fp8.torchao import (
    convert_model_to_fp8_ao,
    float8_config_for,
    has_ao_layers,
)
from accelerando.common.environment import check_cuda_fp8_capability
from accelerando.logging import get_logger

if TYPE_CHECKING:
    from torchao.float8 import Float8LinearConfig

    from accelerando.plugins.fp8_recipes import AORecipeKwargs

__all__ = ["AOPrecision"]

logger = get_logger(__name__)


def _is_fsdp2() -> bool:

    runtime = rt.current()
    plugin = runtime.plugins.fsdp if runtime is not None else None
    # An FSDP plugin is only in the runtime when the connector chose the FSDP strategy (no
    # distributed-type comparison outside the connector).
    return plugin is not None and getattr(plugin, "fsdp_version", 1) == 2


def _native_fp8(device_type: str) -> bool:
    if device_type != "cuda":
        return False

    return check_cuda_fp8_capability()


class AOPrecision(FP8Precision):
    """torchao FP8: converts the model in ``convert_module``; forward, backward and steps are plain.

    Args:
        device_type: the torch device type the model trains on.
        recipe: an ``AORecipeKwargs``.

    Raises:
        ImportError: torchao is not installed (when a model is prepared).
    """

    backend_name = "ao"

    def __init__(self, device_type: str, recipe: AORecipeKwargs) -> None:
        super().__init__(device_type, recipe)
        self.emulated = not _native_fp8(device_type)
        self.config: Float8LinearConfig | None = None

    def effective_config(self, fsdp2: bool) -> Float8LinearConfig:
        """The ``Float8LinearConfig`` used: the recipe's, emulated without FP8 hardware, all-gather only under FSDP2."""
        recipe = self.resolve_recipe()
        config = recipe.config
        if config is None:
            from torchao.float8 import Float8LinearConfig

            config = Float8LinearConfig(
                pad_inner_dim=recipe.pad_inner_dim,
                enable_fsdp_float8_all_gather=recipe.enable_fsdp_float8_all_gather,
            )
        return float8_config_for(
            config,
            emulate=True if self.emulated else None,
            fsdp_all_gather=None if fsdp2 else False,
        )

    def convert_module(self, model: torch.nn.Module) -> torch.nn.Module:
        """Convert the eligible Linear layers of ``model`` to ``Float8Linear`` (once; a converted model is kept).

        Raises:
            ImportError: torchao is not installed.
        """
        fsdp2 = _is_fsdp2()
        config = self.effective_config(fsdp2)
        self.config = config
        if self.emulated and not getattr(self, "_said_emulated", False):
            logger.info(
                f"torchao FP8 runs in emulation on {self.device_type} (no FP8 matmul hardware): values are "
                "rounded to float8 as in FP8 training and multiplied in high precision, so no speed-up",
                main_process_only=True,
            )
            self._said_emulated = True
        if not has_ao_layers(model):
            convert_model_to_fp8_ao(model, config=config, module_filter_func=self.recipe.module_filter_func)
            converted = sum(type(m).__name__ == "Float8Linear" for m in model.modules())
            logger.info(
                f"torchao FP8: {converted} Linear layers converted to Float8Linear", main_process_only=True
            )
        if fsdp2 and config.enable_fsdp_float8_all_gather:
            model.register_forward_pre_hook(_precompute_scales)
        return model


def _precompute_scales(module: torch.nn.Module, args: tuple[object, ...]) -> None:
    # One fused amax computation for every float8 weight before the FSDP2 all-gathers, instead of one
    # reduction per layer inside each all-gather. Done before every forward: the weights may have
    # changed since the last one, and a stale precomputed scale would be used as is.
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(module)
