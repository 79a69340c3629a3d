"""FP8 recipe handlers (``TERecipeKwargs``, ``MSAMPRecipeKwargs``, ``AORecipeKwargs``, the deprecated
``FP8RecipeKwargs``): the keyword-argument handlers of ``mixed_precision="fp8"``.

Their public home is :mod:`accelerando.plugins.kwargs`, which loads this module the first time one of
them is used: an Accelerator without fp8 builds none of these dataclasses
(``python benchmarks/bench_first_accelerator.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from accelerando.common.imports import is_torchao_available
from accelerando.core.settings import environment_value, fill_unset
from accelerando.plugins.kwargs_handler import KwargsHandler

__all__ = ["AORecipeKwargs", "FP8RecipeKwargs", "MSAMPRecipeKwargs", "TERecipeKwargs"]

_FP8_FORMATS = ("HYBRID", "E4M3", "E5M2")
_AMAX_ALGOS = ("max", "most_recent")
_OPT_LEVELS = ("O1", "O2")
_FP8_BACKENDS = ("AO", "TE", "MSAMP")


def _fill_fp8_from_settings(handler: object) -> None:
    """Fill the handler's unset fields from the fp8_* settings (launcher flags, config, environment)."""
    fill_unset(handler, "fp8", prefix="fp8_", rename={"fp8_format": "fp8_format"})
    if getattr(handler, "use_mxfp8_block_scaling", False) is None:
        # Only the TE handler has this field (the getattr above found it unset).
        setattr(handler, "use_mxfp8_block_scaling", environment_value("fp8_use_mxfp8_block_scaling"))  # noqa: B010


def _wrong_type(handler: object, name: str, expected: str, example: str) -> TypeError:
    value = getattr(handler, name)
    return TypeError(
        f"{type(handler).__name__}.{name} must be {expected}, got {type(value).__name__} ({value!r}); "
        f"pass e.g. {name}={example}"
    )


def _check_bool(handler: object, name: str, default: bool) -> None:
    if getattr(handler, name) is None:
        setattr(handler, name, default)
    elif not isinstance(getattr(handler, name), bool):
        raise _wrong_type(handler, name, "a bool", str(default))


def _check_int(handler: object, name: str, default: int, minimum: int) -> None:
    value = getattr(handler, name)
    if value is None:
        setattr(handler, name, default)
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong_type(handler, name, "an int", str(default))
    if value < minimum:
        raise ValueError(f"{type(handler).__name__}.{name} must be >= {minimum}, got {value}")


def _check_choice(handler: object, name: str, default: str, choices: tuple[str, ...], upper: bool) -> None:
    value = getattr(handler, name)
    if value is None:
        value = default
    if not isinstance(value, str):
        raise _wrong_type(handler, name, f"one of {choices}", repr(default))
    value = value.upper() if upper else value.lower()
    if value not in choices:
        raise ValueError(
            f"{type(handler).__name__}.{name}={getattr(handler, name)!r} is not one of {choices}"
        )
    setattr(handler, name, value)


def _check_override(handler: Any) -> None:
    value = handler.override_linear_precision
    if value is None:
        value = (False, False, False)
    if isinstance(value, str):  # the launcher's spelling: "false,false,true"
        words = [w.strip().lower() for w in value.split(",")]
        if len(words) != 3 or any(w not in ("true", "false", "1", "0", "yes", "no") for w in words):
            raise ValueError(
                f"override_linear_precision={value!r} must be three comma-separated booleans "
                "(fprop, dgrad, wgrad), e.g. 'false,false,true'"
            )
        value = tuple(w in ("true", "1", "yes") for w in words)
    if not isinstance(value, (tuple, list)) or len(value) != 3 or not all(isinstance(v, bool) for v in value):
        raise _wrong_type(
            handler, "override_linear_precision", "a tuple of three bools", "(False, False, False)"
        )
    handler.override_linear_precision = tuple(value)


@dataclass
class MSAMPRecipeKwargs(KwargsHandler):
    """MS-AMP FP8 options (needs a CUDA GPU and the ``msamp`` package).

    Unset fields come from the fp8 settings (``--fp8_opt_level``, ``fp8_config.opt_level``,
    ``ACCELERATE_FP8_OPT_LEVEL``), else the defaults.

    Args:
        opt_level: "O1" (FP8 weights and gradients) or "O2" (also FP8 optimizer states; default).

    Raises:
        TypeError / ValueError: a value of the wrong type, or not "O1"/"O2".
    """

    opt_level: Literal["O1", "O2"] = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        _fill_fp8_from_settings(self)
        _check_choice(self, "opt_level", "O2", _OPT_LEVELS, upper=True)


@dataclass
class TERecipeKwargs(KwargsHandler):
    """Transformer Engine FP8 recipe (needs a CUDA GPU with FP8 support and ``transformer_engine``).

    Unset fields come from the fp8 settings (``--fp8_*`` flags, the config's ``fp8_config`` block,
    ``ACCELERATE_FP8_*`` / ``ACCELERANDO_FP8_*`` variables), else the defaults shown.

    Args:
        use_autocast_during_eval: keep FP8 autocast in eval mode (False).
        margin: margin of the scaling factor (0). interval: steps between scale updates (1).
        fp8_format: "HYBRID" (E4M3 forward, E5M2 backward; default), "E4M3" or "E5M2".
        amax_history_len: length of the amax history (1024).
        amax_compute_algo: "most_recent" (default) or "max".
        override_linear_precision: run (fprop, dgrad, wgrad) in higher precision ((False,) * 3).
        use_mxfp8_block_scaling: use the MXFP8 block-scaling recipe (Blackwell GPUs; False).

    Raises:
        TypeError: a field of the wrong type (the message shows a correct value).
        ValueError: a value outside the allowed choices.
    """

    use_autocast_during_eval: bool | None = None
    margin: int | None = None
    interval: int | None = None
    fp8_format: Literal["HYBRID", "E4M3", "E5M2"] = None  # type: ignore[assignment]
    amax_history_len: int | None = None
    amax_compute_algo: Literal["max", "most_recent"] = None  # type: ignore[assignment]
    override_linear_precision: tuple[bool, bool, bool] = None  # type: ignore[assignment]
    use_mxfp8_block_scaling: bool | None = None

    def __post_init__(self) -> None:
        _fill_fp8_from_settings(self)
        _check_bool(self, "use_autocast_during_eval", False)
        _check_int(self, "margin", 0, 0)
        _check_int(self, "interval", 1, 1)
        _check_choice(self, "fp8_format", "HYBRID", _FP8_FORMATS, upper=True)
        _check_int(self, "amax_history_len", 1024, 1)
        _check_choice(self, "amax_compute_algo", "most_recent", _AMAX_ALGOS, upper=False)
        _check_override(self)
        _check_bool(self, "use_mxfp8_block_scaling", False)


@dataclass
class FP8RecipeKwargs(TERecipeKwargs, MSAMPRecipeKwargs):
    """Deprecated: one recipe for Transformer Engine (``backend="TE"``) or MS-AMP (``backend="MSAMP"``).

    Use :class:`TERecipeKwargs` or :class:`MSAMPRecipeKwargs` (torchao: :class:`AORecipeKwargs`).
    Without ``backend``, the ``fp8_backend`` setting or the automatic choice decides.

    Raises:
        ValueError: an unknown backend, or "AO" (which has its own recipe, AORecipeKwargs).
        TypeError: a field of the wrong type.
    """

    backend: Literal["MSAMP", "TE"] = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        import warnings

        warnings.warn(
            "FP8RecipeKwargs is deprecated; use TERecipeKwargs (Transformer Engine), MSAMPRecipeKwargs "
            "(MS-AMP) or AORecipeKwargs (torchao) instead",
            FutureWarning,
            stacklevel=3,
        )
        explicit = self.backend
        TERecipeKwargs.__post_init__(self)
        _check_choice(self, "opt_level", "O2", _OPT_LEVELS, upper=True)
        if explicit is None and str(self.backend).upper() == "AO":
            self.backend = None  # type: ignore[assignment]  # fp8_backend=ao is for AORecipeKwargs
        if self.backend is not None:
            if not isinstance(self.backend, str) or self.backend.upper() not in _FP8_BACKENDS:
                raise ValueError(
                    f"unknown FP8 backend {self.backend!r} in FP8RecipeKwargs; choose 'TE' (Transformer Engine) "
                    "or 'MSAMP' (MS-AMP), or use AORecipeKwargs for torchao"
                )
            self.backend = self.backend.upper()  # type: ignore[assignment]
            if self.backend == "AO":
                raise ValueError("FP8RecipeKwargs does not configure torchao; pass AORecipeKwargs() instead")


@dataclass
class AORecipeKwargs(KwargsHandler):
    """torchao FP8 training options (``Float8Linear`` layers; runs on CPU in emulation, natively on
    GPUs with FP8 support).

    Args:
        config: a ``torchao.float8.Float8LinearConfig``; built from the two flags below when None.
        module_filter_func: ``(module, fqn) -> bool`` choosing the Linear layers to convert; None keeps
            the first and last Linear layers and those with a dimension not divisible by 16 in high
            precision.
        pad_inner_dim: pad matmul inner dimensions to multiples of 16 (True; ignored with ``config``).
        enable_fsdp_float8_all_gather: FSDP2 all-gathers weights in float8 (True; ignored with ``config``).

    Unset flags come from the fp8 settings (``--fp8_pad_inner_dim``, ``fp8_config.pad_inner_dim``,
    ``ACCELERATE_FP8_PAD_INNER_DIM``...).

    Raises:
        TypeError: ``config`` is not a Float8LinearConfig, the filter is not callable, or a flag is not a bool.
    """

    config: Any = None
    module_filter_func: Callable | None = None
    pad_inner_dim: bool | None = None
    enable_fsdp_float8_all_gather: bool | None = None

    def __post_init__(self) -> None:
        _fill_fp8_from_settings(self)
        _check_bool(self, "pad_inner_dim", True)
        _check_bool(self, "enable_fsdp_float8_all_gather", True)
        if self.module_filter_func is not None and not callable(self.module_filter_func):
            raise _wrong_type(
                self, "module_filter_func", "a callable (module, fqn) -> bool", "filter_linear_layers"
            )
        if self.config is not None:
            if type(self.config).__name__ != "Float8LinearConfig":
                raise _wrong_type(
                    self,
                    "config",
                    "a torchao.float8.Float8LinearConfig",
                    "Float8LinearConfig(pad_inner_dim=True)",
                )
            return

        if is_torchao_available():
            from torchao.float8 import Float8LinearConfig

            # Both flags are bools here (_check_bool filled and checked them above).
            self.config = Float8LinearConfig(
                pad_inner_dim=bool(self.pad_inner_dim),
                enable_fsdp_float8_all_gather=bool(self.enable_fsdp_float8_all_gather),
            )
